"""PostgreSQL types: OIDs, Arrow and DuckDB type mapping, value encoding and parameters.

Results leave the server as Arrow tables; each Arrow type maps to the
PostgreSQL type a client expects (int64 -> int8, string -> text, ...), and
each value is written in PostgreSQL's text format (or binary when the client
asks and the type supports it). Bound parameters arrive in either format and
become SQL literals, so the statement dpsql parses is always plain SQL text.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import struct
import uuid
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class PgType:
    """A PostgreSQL type as pg_type describes it (the columns clients read)."""

    oid: int
    name: str
    size: int
    category: str
    array_oid: int = 0
    elem_oid: int = 0
    input: str = ""

    @property
    def is_array(self) -> bool:
        """Whether this is an array type (``_int4`` ...)."""
        return self.elem_oid != 0


_BASE: list[tuple[int, str, int, str, int]] = [
    # oid, name, typlen, category, array oid
    (16, "bool", 1, "B", 1000),
    (17, "bytea", -1, "U", 1001),
    (18, "char", 1, "Z", 1002),
    (19, "name", 64, "S", 1003),
    (20, "int8", 8, "N", 1016),
    (21, "int2", 2, "N", 1005),
    (22, "int2vector", -1, "A", 1006),
    (23, "int4", 4, "N", 1007),
    (24, "regproc", 4, "N", 1008),
    (25, "text", -1, "S", 1009),
    (26, "oid", 4, "N", 1028),
    (27, "tid", 6, "U", 1010),
    (28, "xid", 4, "U", 1011),
    (29, "cid", 4, "U", 1012),
    (30, "oidvector", -1, "A", 1013),
    (114, "json", -1, "U", 199),
    (142, "xml", -1, "U", 143),
    (700, "float4", 4, "N", 1021),
    (701, "float8", 8, "N", 1022),
    (705, "unknown", -2, "X", 0),
    (790, "money", 8, "N", 791),
    (1033, "aclitem", 12, "U", 1034),
    (1042, "bpchar", -1, "S", 1014),
    (1043, "varchar", -1, "S", 1015),
    (1082, "date", 4, "D", 1182),
    (1083, "time", 8, "D", 1183),
    (1114, "timestamp", 8, "D", 1115),
    (1184, "timestamptz", 8, "D", 1185),
    (1186, "interval", 16, "T", 1187),
    (1266, "timetz", 12, "D", 1270),
    (1560, "bit", -1, "V", 1561),
    (1562, "varbit", -1, "V", 1563),
    (1700, "numeric", -1, "N", 1231),
    (2202, "regprocedure", 4, "N", 2207),
    (2205, "regclass", 4, "N", 2210),
    (2206, "regtype", 4, "N", 2211),
    (2249, "record", -1, "P", 2287),
    (2278, "void", 4, "P", 0),
    (2950, "uuid", 16, "U", 2951),
    (3802, "jsonb", -1, "U", 3807),
    (4089, "regnamespace", 4, "N", 4090),
    (4096, "regrole", 4, "N", 4097),
]


def _all_types() -> dict[int, PgType]:
    types: dict[int, PgType] = {}
    for oid, name, size, category, array_oid in _BASE:
        types[oid] = PgType(oid, name, size, category, array_oid, 0, f"{name}in")
        if array_oid:
            types[array_oid] = PgType(array_oid, f"_{name}", -1, "A", 0, oid, "array_in")
    return types


TYPES: dict[int, PgType] = _all_types()
BY_NAME: dict[str, PgType] = {t.name: t for t in TYPES.values()}
TEXT = TYPES[25]

# DuckDB type names (information_schema.columns.data_type) -> PostgreSQL type.
_DUCKDB = {
    "BOOLEAN": "bool", "TINYINT": "int2", "SMALLINT": "int2", "INTEGER": "int4",
    "BIGINT": "int8", "HUGEINT": "numeric", "UHUGEINT": "numeric", "UTINYINT": "int2",
    "USMALLINT": "int4", "UINTEGER": "int8", "UBIGINT": "numeric", "FLOAT": "float4",
    "REAL": "float4", "DOUBLE": "float8", "VARCHAR": "text", "BLOB": "bytea", "DATE": "date",
    "TIME": "time", "TIMESTAMP": "timestamp", "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "INTERVAL": "interval", "UUID": "uuid", "JSON": "json", "TIMESTAMP_S": "timestamp",
    "TIMESTAMP_MS": "timestamp", "TIMESTAMP_NS": "timestamp", "TIME WITH TIME ZONE": "timetz",
}


def from_duckdb(type_name: str) -> tuple[PgType, int]:
    """The PostgreSQL type and typmod of a DuckDB column type (unknown kinds become text)."""
    name = type_name.upper().strip()
    if name.endswith("[]"):
        elem, _ = from_duckdb(name[:-2])
        return TYPES.get(elem.array_oid, TEXT), -1
    decimal = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", name)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        return BY_NAME["numeric"], ((precision << 16) | scale) + 4
    return BY_NAME.get(_DUCKDB.get(name, "text"), TEXT), -1


def from_arrow(dtype: pa.DataType) -> tuple[PgType, int]:
    """The PostgreSQL type and typmod a client sees for an Arrow column."""
    if pa.types.is_dictionary(dtype):
        return from_arrow(dtype.value_type)
    if pa.types.is_boolean(dtype):
        return BY_NAME["bool"], -1
    if pa.types.is_int8(dtype) or pa.types.is_int16(dtype) or pa.types.is_uint8(dtype):
        return BY_NAME["int2"], -1
    if pa.types.is_int32(dtype) or pa.types.is_uint16(dtype):
        return BY_NAME["int4"], -1
    if pa.types.is_uint32(dtype):
        return BY_NAME["oid"], -1  # the catalog keeps object ids as uint32
    if pa.types.is_int64(dtype):
        return BY_NAME["int8"], -1
    if pa.types.is_uint64(dtype):
        return BY_NAME["numeric"], -1
    if pa.types.is_float16(dtype) or pa.types.is_float32(dtype):
        return BY_NAME["float4"], -1
    if pa.types.is_float64(dtype):
        return BY_NAME["float8"], -1
    if pa.types.is_decimal(dtype):
        return BY_NAME["numeric"], ((dtype.precision << 16) | dtype.scale) + 4
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or \
            pa.types.is_string_view(dtype):
        return TEXT, -1
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or \
            pa.types.is_binary_view(dtype):
        return BY_NAME["bytea"], -1
    if pa.types.is_fixed_size_binary(dtype) and dtype.byte_width == 16:
        return BY_NAME["uuid"], -1
    if pa.types.is_date(dtype):
        return BY_NAME["date"], -1
    if pa.types.is_timestamp(dtype):
        return BY_NAME["timestamptz" if dtype.tz else "timestamp"], -1
    if pa.types.is_time(dtype):
        return BY_NAME["time"], -1
    if pa.types.is_duration(dtype) or pa.types.is_interval(dtype):
        return BY_NAME["interval"], -1
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or \
            pa.types.is_fixed_size_list(dtype):
        elem, _ = from_arrow(dtype.value_type)
        return TYPES.get(elem.array_oid, TEXT), -1
    return TEXT, -1


# -- text output ---------------------------------------------------------------------------


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _float4_text(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return _float_text(value)
    # The shortest decimal that reads back as the same float32.
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.unpack("!f", struct.pack("!f", float(text)))[0] == \
                struct.unpack("!f", struct.pack("!f", value))[0]:
            return text.replace("e+0", "e+").replace("e-0", "e-0")
    return _float_text(value)


def _tz_offset(value: dt.datetime) -> str:
    offset = value.utcoffset() or dt.timedelta(0)
    sign = "-" if offset < dt.timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    hours, minutes = divmod(minutes, 60)
    return f"{sign}{hours:02d}" + (f":{minutes:02d}" if minutes else "")


def _timestamp_text(value: dt.datetime, zone: dt.tzinfo | None) -> str:
    if value.tzinfo is not None and zone is not None:
        value = value.astimezone(zone)
    text = value.replace(tzinfo=None).isoformat(sep=" ")
    return text + _tz_offset(value) if value.tzinfo is not None else text


def _interval_text(value: dt.timedelta) -> str:
    days = value.days
    seconds = value.seconds + value.microseconds / 1e6
    hours, rest = divmod(value.seconds, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    if value.microseconds:
        clock += f".{value.microseconds:06d}".rstrip("0")
    if days and seconds:
        return f"{days} days {clock}" if abs(days) != 1 else f"{days} day {clock}"
    if days:
        return f"{days} days" if abs(days) != 1 else f"{days} day"
    return clock


_ARRAY_PLAIN = re.compile(r'^[^\s{}",\\]+$')


def _array_element(value: Any, zone: dt.tzinfo | None) -> str:
    if value is None:
        return "NULL"
    text = text_value(value, zone)
    if _ARRAY_PLAIN.match(text) and text.upper() != "NULL":
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text_value(value: Any, zone: dt.tzinfo | None = None) -> str:
    """One non-null Python value (from Arrow) in PostgreSQL's text output format."""
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, Decimal):
        return "NaN" if value.is_nan() else format(value, "f")
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, dt.datetime):
        return _timestamp_text(value, zone)
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return _interval_text(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "{" + ",".join(_array_element(v, zone) for v in value) + "}"
    return json.dumps(value, default=str, sort_keys=True)


# -- binary output -----------------------------------------------------------------------

_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_TZ = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
_PG_EPOCH_DATE = dt.date(2000, 1, 1)


def _numeric_binary(value: Any) -> bytes:
    dec = Decimal(value) if not isinstance(value, Decimal) else value
    if dec.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    sign, digits, exponent = dec.as_tuple()
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    # Group decimal digits into base-10000 digits aligned on the decimal point.
    text = "".join(map(str, digits))
    if exponent >= 0:
        integer, frac = text + "0" * exponent, ""
    elif len(text) <= -exponent:
        integer, frac = "", text.rjust(-exponent, "0")
    else:
        integer, frac = text[:exponent], text[exponent:]
    integer = integer.lstrip("0")
    integer = "0" * (-len(integer) % 4) + integer
    frac = frac + "0" * (-len(frac) % 4)
    groups = [int(integer[i:i + 4]) for i in range(0, len(integer), 4)]
    weight = len(groups) - 1
    groups += [int(frac[i:i + 4]) for i in range(0, len(frac), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    header = struct.pack("!hhHh", len(groups), weight, 0x4000 if sign else 0, dscale)
    return header + b"".join(struct.pack("!H", g) for g in groups)


def _binary_encoder(pg: PgType) -> Callable[[Any], bytes] | None:
    name = pg.name
    if name == "bool":
        return lambda v: b"\x01" if v else b"\x00"
    if name in ("int2", "int4", "int8", "oid"):
        fmt = {"int2": "!h", "int4": "!i", "int8": "!q", "oid": "!I"}[name]
        return lambda v: struct.pack(fmt, v)
    if name == "float4":
        return lambda v: struct.pack("!f", v)
    if name == "float8":
        return lambda v: struct.pack("!d", v)
    if name in ("text", "varchar", "bpchar", "name"):
        return lambda v: str(v).encode("utf-8")
    if name == "bytea":
        return lambda v: bytes(v)
    if name == "date":
        return lambda v: struct.pack("!i", (v - _PG_EPOCH_DATE).days)
    if name == "timestamp":
        return lambda v: struct.pack("!q", (v - _PG_EPOCH) // dt.timedelta(microseconds=1))
    if name == "timestamptz":
        return lambda v: struct.pack("!q", (v - _PG_EPOCH_TZ) // dt.timedelta(microseconds=1))
    if name == "numeric":
        return _numeric_binary
    if name == "uuid":
        return lambda v: v.bytes if isinstance(v, uuid.UUID) else bytes(v)
    if name == "time":
        return lambda v: struct.pack("!q", ((v.hour * 60 + v.minute) * 60 + v.second)
                                     * 1_000_000 + v.microsecond)
    if name == "interval":
        return lambda v: struct.pack("!qii", v.seconds * 1_000_000 + v.microseconds, v.days, 0)
    if pg.is_array:
        element = TYPES[pg.elem_oid]
        encode = _binary_encoder(element)
        if encode is None:
            return None
        return lambda v: _array_binary(v, element.oid, encode)
    return None


def _array_binary(values: list[Any], elem_oid: int, encode: Callable[[Any], bytes]) -> bytes:
    """A one-dimensional array in PostgreSQL's binary array format."""
    if not values:
        return struct.pack("!iiI", 0, 0, elem_oid)
    parts = [struct.pack("!iiIii", 1, int(any(v is None for v in values)), elem_oid,
                         len(values), 1)]
    for value in values:
        if value is None:
            parts.append(struct.pack("!i", -1))
        else:
            data = encode(value)
            parts.append(struct.pack("!i", len(data)) + data)
    return b"".join(parts)


class UnsupportedFormat(ValueError):
    """The client asked for binary output of a type dpsql writes only as text."""


def column_encoder(dtype: pa.DataType, binary: bool,
                   zone: dt.tzinfo | None = None) -> Callable[[Any], bytes | None]:
    """A function from one Python value of this Arrow type to its wire bytes (None: NULL)."""
    pg, _ = from_arrow(dtype)
    if binary:
        encode = _binary_encoder(pg)
        if encode is None:
            raise UnsupportedFormat(f"binary output of type {pg.name} is not supported; "
                                    "request text format for it")
        return lambda v: None if v is None else encode(v)
    if pa.types.is_fixed_size_binary(dtype) and dtype.byte_width == 16:
        return lambda v: None if v is None else str(uuid.UUID(bytes=bytes(v))).encode()
    if pg.name == "float4":
        return lambda v: None if v is None else _float4_text(v).encode()
    return lambda v: None if v is None else text_value(v, zone).encode("utf-8")


def time_zone(name: str) -> dt.tzinfo:
    """A PostgreSQL TimeZone setting as a tzinfo (raises ValueError when unknown)."""
    if name.upper() in ("UTC", "GMT", "Z", "ZULU", "UCT"):
        return dt.timezone.utc
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"time zone {name!r} is not recognized") from err


# -- parameters ------------------------------------------------------------------------------

_INTEGER = {20, 21, 23, 26, 28}
_FLOAT = {700, 701}


class BadParameter(ValueError):
    """A bound parameter cannot be read as its declared type (SQLSTATE 22P02)."""


def quote_literal(text: str) -> str:
    """A standard SQL string literal (quotes doubled; backslashes are plain)."""
    if "\x00" in text:
        raise BadParameter("a string parameter contains a NUL byte, which SQL text cannot hold")
    return "'" + text.replace("'", "''") + "'"


def _decode_binary(data: bytes, oid: int) -> Any:
    name = TYPES[oid].name if oid in TYPES else "unknown"
    try:
        if name == "bool":
            return data != b"\x00"
        if name in ("int2", "int4", "int8", "oid"):
            fmt = {2: "!h", 4: "!i", 8: "!q"}[len(data)]
            return struct.unpack(fmt, data)[0]
        if name in ("float4", "float8"):
            return struct.unpack({4: "!f", 8: "!d"}[len(data)], data)[0]
        if name in ("text", "varchar", "bpchar", "name", "unknown", "json"):
            return data.decode("utf-8")
        if name == "numeric":
            return _numeric_from_binary(data)
        if name == "date":
            return _PG_EPOCH_DATE + dt.timedelta(days=struct.unpack("!i", data)[0])
        if name in ("timestamp", "timestamptz"):
            stamp = _PG_EPOCH + dt.timedelta(microseconds=struct.unpack("!q", data)[0])
            return stamp.isoformat(sep=" ") + ("+00" if name == "timestamptz" else "")
        if name == "uuid":
            return str(uuid.UUID(bytes=data))
    except (KeyError, struct.error, UnicodeDecodeError, ValueError) as err:
        raise BadParameter(f"invalid binary value for a {name} parameter") from err
    raise BadParameter(f"binary parameters of type {name} are not supported; send it as text")


def _numeric_from_binary(data: bytes) -> Decimal:
    ndigits, weight, sign, dscale = struct.unpack("!hhHh", data[:8])
    if sign == 0xC000:
        return Decimal("NaN")
    digits = struct.unpack(f"!{ndigits}H", data[8:8 + 2 * ndigits])
    value = sum((Decimal(d) * Decimal(10000) ** (weight - i) for i, d in enumerate(digits)),
                Decimal(0))
    value = value.quantize(Decimal(1).scaleb(-dscale)) if dscale else value
    return -value if sign == 0x4000 else value


def parameter_literal(data: bytes | None, oid: int, binary: bool) -> str:
    """The SQL literal for one bound parameter of type ``oid`` (0: let SQL decide)."""
    if data is None:
        return "NULL"
    value: Any = _decode_binary(data, oid) if binary else None
    if not binary:
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadParameter("a text-format parameter is not valid UTF-8") from err
    if oid == 16:
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        word = str(value).strip().lower()
        if word in ("t", "true", "y", "yes", "on", "1"):
            return "TRUE"
        if word in ("f", "false", "n", "no", "off", "0"):
            return "FALSE"
        raise BadParameter(f"invalid input for a boolean parameter: {value!r}")
    if oid in _INTEGER:
        try:
            number = int(str(value).strip())
        except ValueError as err:
            raise BadParameter(f"invalid input for an integer parameter: {value!r}") from err
        return f"({number})" if number < 0 else str(number)
    if oid in _FLOAT or oid == 1700:
        try:
            decimal_value = Decimal(repr(value) if isinstance(value, float)
                                    else str(value).strip())
        except InvalidOperation as err:
            raise BadParameter(f"invalid input for a numeric parameter: {value!r}") from err
        if not decimal_value.is_finite():
            word = "NaN" if decimal_value.is_nan() else (
                "Infinity" if decimal_value > 0 else "-Infinity")
            return f"CAST('{word}' AS DOUBLE)"
        text = str(decimal_value) if oid != 1700 else format(decimal_value, "f")
        return f"({text})" if decimal_value < 0 else text
    if oid == 17:
        raise BadParameter("bytea parameters are not supported by dpsql")
    return quote_literal(str(value))
