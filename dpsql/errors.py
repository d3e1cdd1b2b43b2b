"""One exception hierarchy for dpsql.

Every error has a stable ``code``, a PostgreSQL ``sqlstate`` (the wire server
sends it to clients) and a CLI ``exit_code``. Messages say what was wrong and
what to do next, and never contain a value computed from private data.
"""

from __future__ import annotations

import sys


class DPSQLError(Exception):
    """Root of every error dpsql raises on purpose."""

    code = "dpsql_error"
    sqlstate = "XX000"
    exit_code = 1


class PolicyError(DPSQLError):
    """A policy file is invalid or contradicts itself."""

    code = "policy_error"
    sqlstate = "F0000"  # config_file_error
    exit_code = 3


class QueryRejected(DPSQLError):
    """An analyst query uses a construct outside the allowlist.

    Carries the construct, its position and the advice separately so front
    ends can render them.
    """

    code = "query_rejected"
    sqlstate = "42000"  # syntax_error_or_access_rule_violation
    exit_code = 4

    def __init__(
        self,
        message: str,
        *,
        construct: str | None = None,
        line: int | None = None,
        column: int | None = None,
        advice: str | None = None,
    ) -> None:
        self.message = message
        self.construct = construct
        self.line = line
        self.column = column
        self.advice = advice
        text = message
        if line is not None:
            text += f" (line {line}, column {column})"
        if advice:
            text += f"; {advice}"
        super().__init__(text)


class BudgetExceeded(DPSQLError):
    """A request would spend more privacy budget than is left or allowed."""

    code = "budget_exceeded"
    sqlstate = "53400"  # configuration_limit_exceeded
    exit_code = 5


class AccessDenied(DPSQLError):
    """The principal's role does not allow this action."""

    code = "access_denied"
    sqlstate = "42501"  # insufficient_privilege
    exit_code = 6


class ReleaseError(DPSQLError):
    """A synthetic release cannot be made as asked."""

    code = "release_error"
    sqlstate = "55000"  # object_not_in_prerequisite_state
    exit_code = 7


class ConfigurationError(DPSQLError):
    """A parameter is out of range or inconsistent (epsilon <= 0, bad delta, ...)."""

    code = "configuration_error"
    sqlstate = "22023"  # invalid_parameter_value
    exit_code = 8


class StoreError(DPSQLError):
    """The store file is locked by another writer, corrupt, or not a dpsql store."""

    code = "store_error"
    sqlstate = "55006"  # object_in_use
    exit_code = 9


class QueryCanceled(DPSQLError):
    """A statement was stopped (statement timeout or cancel request); a charge made stands.

    Its message is fixed: it never depends on the data the statement read.
    """

    code = "query_canceled"
    sqlstate = "57014"  # query_canceled
    exit_code = 130

    def __init__(self) -> None:
        super().__init__("canceling statement due to statement timeout or user request")


class OutOfMemory(DPSQLError):
    """A free or catalog query needs more memory than its sandbox process may use.

    Its message is fixed (the limit is configuration, never data); the server and
    every other session go on (:mod:`dpsql.sandbox`).
    """

    code = "out_of_memory"
    sqlstate = "53200"  # out_of_memory
    exit_code = 11

    def __init__(self, message: str = "the query needs more memory than free queries may use; "
                 "ask for less: fewer rows, shorter strings or an aggregate") -> None:
        super().__init__(message)


class AddressInUse(DPSQLError):
    """``dpsql serve`` cannot listen: another program holds the address and port."""

    code = "address_in_use"
    sqlstate = "55006"  # object_in_use
    exit_code = 10


class InternalError(DPSQLError):
    """A bug in dpsql: please report it with the command that triggered it."""

    code = "internal_error"
    sqlstate = "XX000"
    exit_code = 70


#: The exit code of an operating-system failure (sysexits' EX_IOERR).
OS_ERROR_EXIT = 74


def os_failure(err: BaseException) -> str | None:
    """What an operating-system failure says (permission denied, disk full), else None.

    DuckDB reports a failed write of the store as its own error that names the file.
    """
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename else ""
        what = err.strerror or str(err) or type(err).__name__
    else:
        duckdb = sys.modules.get("duckdb")
        text = str(err).splitlines()[0] if str(err) else ""
        start = text.find("Could not write file")  # after "Failed to commit: "
        if duckdb is None or not isinstance(err, duckdb.Error) or not (
                isinstance(err, duckdb.IOException) or start >= 0):
            return None
        where, what = "", text[max(start, 0):]
    return f"{what}{where}; check the path, its permissions and the free disk space"


__all__ = [
    "AccessDenied",
    "AddressInUse",
    "BudgetExceeded",
    "ConfigurationError",
    "DPSQLError",
    "InternalError",
    "OutOfMemory",
    "PolicyError",
    "QueryCanceled",
    "QueryRejected",
    "ReleaseError",
    "StoreError",
]
