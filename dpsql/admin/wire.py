"""Typed values to JSON and back: how an operation's arguments and result cross the admin socket.

An operation's parameters and its result are typed (dataclasses, lists, dicts, exact
costs, Arrow tables); :func:`encode` writes any such value as JSON and
:func:`decode` reads it back as the type its annotation names, exactly (a
``PrivacyCost`` keeps its integer quanta, a datetime its microseconds, a table its
schema as Arrow IPC). A value annotated ``Any`` travels as plain JSON. This is the
wire form, not the ``as_dict()`` a front end prints.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dpsql.errors import ConfigurationError, DPSQLError

#: The plain JSON types a value may be decoded as, exactly (see :func:`_scalar`).
SCALARS = (bool, int, float, str)
#: Parameters the caller's side supplies itself and never sends (see :func:`encode_arguments`).
LOCAL_PARAMETERS = ("session", "progress")


def plain(value: Any) -> Any:
    """``value`` as plain JSON data, as the CLI prints it (datetimes to the second)."""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (Fraction, Decimal)):
        return float(value)
    if hasattr(value, "as_dict"):
        return plain(value.as_dict())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def encode(value: Any) -> Any:
    """``value`` as JSON data that :func:`decode` reads back exactly, given its type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (Fraction, Decimal)):
        return str(value)  # exact: an argument such as epsilon reads it back as text
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if _is_table(value):
        return _table_text(value)
    return plain(value)


def decode(kind: Any, data: Any) -> Any:
    """JSON ``data`` as a value of the annotated type ``kind``."""
    if kind is Any or kind is object:
        return data
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(typing.get_args(kind), data)
    if origin is typing.Literal:
        if data not in typing.get_args(kind):
            raise ConfigurationError(f"the admin channel: {data!r} is not one of "
                                     f"{', '.join(map(repr, typing.get_args(kind)))}")
        return data
    if origin in (list, tuple, dict) or kind in (list, tuple, dict):
        return _decode_container(origin or kind, typing.get_args(kind), data)
    if data is None:
        return None
    if kind is datetime:
        return datetime.fromisoformat(data)
    if kind is date:
        return date.fromisoformat(data)
    if kind is bytes:
        return base64.b64decode(data)
    if kind in SCALARS:
        return _scalar(kind, data)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: decode(hints[f.name], data[f.name])
                       for f in dataclasses.fields(kind) if f.init and f.name in data})
    if getattr(kind, "__module__", "").startswith("pyarrow") and kind.__name__ == "Table":
        return _table_of(data)
    raise TypeError(f"the admin channel cannot carry a {kind!r}")


def _decode_union(options: tuple[Any, ...], data: Any) -> Any:
    if data is None:
        return None
    for option in options:  # a plain value is the option of its own type
        if option in (bool, int, float, str) and type(data) is option:
            return data
    chosen = [o for o in options if o is not type(None) and o not in SCALARS]
    if not chosen:  # an int where only float is allowed, or a value of no option's type
        return _scalar(float if float in options else options[0], data)
    return decode(chosen[0], data)


def _scalar(kind: type, data: Any) -> Any:
    """``data`` as the plain type ``kind``, exactly: JSON's own types only (an int for a float).

    ``bool("false")`` is True and ``int(True)`` is 1: nothing is converted but an
    integer to a float, and any other mismatch is refused.
    """
    if kind is float and type(data) in (int, float):
        return float(data)
    if type(data) is not kind:
        raise ConfigurationError(f"the admin channel: expected {kind.__name__}, got "
                                 f"{type(data).__name__}")
    return data


def _decode_container(origin: Any, args: tuple[Any, ...], data: Any) -> Any:
    if data is None:
        return None
    if origin is dict:
        value = args[1] if len(args) == 2 else Any
        return {k: decode(value, v) for k, v in data.items()}
    item = args[0] if args else Any
    items = [decode(item, v) for v in data]
    return tuple(items) if origin is tuple else items


def _is_table(value: Any) -> bool:
    return type(value).__module__.startswith("pyarrow") and type(value).__name__ == "Table"


def _table_text(table: Any) -> str:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def _table_of(text: str) -> Any:
    import pyarrow as pa

    with pa.ipc.open_stream(base64.b64decode(text)) as reader:
        return reader.read_all()


# -- operations -------------------------------------------------------------------------
def _hints(operation: Callable[..., Any]) -> dict[str, Any]:
    return typing.get_type_hints(operation)


def takes_progress(operation: Callable[..., Any]) -> bool:
    """Whether ``operation`` reports progress (its caller passes ``progress=``)."""
    return "progress" in inspect.signature(operation).parameters


def encode_arguments(operation: Callable[..., Any], arguments: Mapping[str, Any]
                     ) -> dict[str, Any]:
    """The keyword arguments of a call of ``operation``, as JSON (progress stays behind)."""
    return {k: encode(v) for k, v in arguments.items() if k not in LOCAL_PARAMETERS}


def decode_arguments(operation: Callable[..., Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``operation`` from JSON, each as its parameter's type.

    An argument the operation does not take, or one only the caller's side may
    give (the session, progress), is refused.
    """
    parameters = inspect.signature(operation).parameters
    hints = _hints(operation)
    out = {}
    for name, value in data.items():
        parameter = parameters.get(name)
        if parameter is None or name in LOCAL_PARAMETERS or \
                parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise ConfigurationError(f"the operation takes no argument {name!r}")
        out[name] = decode(hints.get(name, Any), value)
    return out


def decode_result(operation: Callable[..., Any], data: Any) -> Any:
    """The result of ``operation`` from JSON, as its return annotation says."""
    return decode(_hints(operation).get("return", Any), data)


# -- errors -----------------------------------------------------------------------------
INTERNAL = ("internal error ({}); this is a bug in dpsql, please report it with the command "
            "you ran")


def error_frame(err: BaseException) -> dict[str, Any]:
    """How an operation's failure crosses the admin socket: its code, message and exit code.

    An operating-system failure (a full disk) keeps its message; any other error
    that is not dpsql's is a bug, and says only its type.
    """
    from dpsql.errors import OS_ERROR_EXIT, DPSQLError, os_failure
    from dpsql.outside import DomainError

    if isinstance(err, DPSQLError):
        frame: dict[str, Any] = {"error": err.code, "message": str(err),
                                 "exit_code": err.exit_code}
        if isinstance(err, DomainError):
            frame["found"] = encode(err.found)
        return frame
    failure = os_failure(err)
    if failure is not None:
        return {"error": "os_error", "message": failure, "exit_code": OS_ERROR_EXIT}
    return {"error": "internal_error", "message": INTERNAL.format(type(err).__name__),
            "exit_code": 70}


def error_of(frame: Mapping[str, Any]) -> Exception:
    """The error an :func:`error_frame` describes, as its own class where dpsql has one."""
    from dpsql import errors
    from dpsql.outside import DomainError, Outside

    code, message = str(frame.get("error")), str(frame.get("message", ""))
    if code == "configuration_error" and "found" in frame:
        return DomainError(message, decode(list[Outside], frame["found"]))
    for kind in _error_classes(errors.DPSQLError):
        if kind.code == code:
            err = kind.__new__(kind)  # its own __init__ takes other arguments
            Exception.__init__(err, message)
            if isinstance(err, errors.QueryRejected):
                err.message, err.construct, err.line, err.column, err.advice = (
                    message, None, None, None, None)
            return err
    other = errors.DPSQLError(message)
    other.code, other.exit_code = code, int(frame.get("exit_code", 1))
    return other


def _error_classes(root: type[DPSQLError]) -> list[type[DPSQLError]]:
    out = [root]
    for sub in root.__subclasses__():
        out += _error_classes(sub)
    return out
