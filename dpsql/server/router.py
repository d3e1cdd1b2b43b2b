r"""Where each statement of a client goes, and what the client sees of it.

Three destinations:

* client statements answered here: ``SET``/``SHOW``/``RESET`` of client
  parameters (``client_encoding``, ``DateStyle``, ``application_name``, ...),
  ``BEGIN``/``COMMIT``/``ROLLBACK`` (no-ops: sessions are read-only, but the
  transaction status a driver tracks is kept faithfully), ``DISCARD ALL``,
  ``DEALLOCATE``;
* catalog queries (psql's ``\\d``, JDBC metadata, ``SELECT version()``),
  answered from the sanitized catalog (:mod:`dpsql.server.catalog`);
* everything else -- DP queries, ``SET dpsql.*``, ``SHOW dpsql.budget``,
  ``EXPLAIN PRIVACY``, reads of ``released.*`` -- goes to the session's
  statement handler (``Session.sql``), which decides what may run.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from dpsql.errors import DPSQLError, QueryRejected
from dpsql.server import copyout, cursors, rewrite
from dpsql.server.catalog import ConnectionCatalog
from dpsql.server.pgtypes import time_zone
from dpsql.server.sqltext import strip_comments

log = logging.getLogger("dpsql.server")

SERVER_VERSION = "15.0"

# Parameters a client may read and set, with their defaults (PostgreSQL spelling).
DEFAULTS: dict[str, str] = {
    "application_name": "", "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres", "TimeZone": "UTC", "extra_float_digits": "1",
    "search_path": "public, released", "statement_timeout": "0", "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0", "client_min_messages": "notice",
    "bytea_output": "hex", "default_transaction_isolation": "read committed",
    "transaction_isolation": "read committed", "default_transaction_read_only": "on",
    "transaction_read_only": "on", "standard_conforming_strings": "on",
    "integer_datetimes": "on", "server_version": SERVER_VERSION,
    "server_version_num": "150000", "server_encoding": "UTF8", "is_superuser": "off",
    "max_identifier_length": "63", "lc_collate": "C", "lc_ctype": "C", "lc_messages": "C",
    "lc_monetary": "C", "lc_numeric": "C", "lc_time": "C", "in_hot_standby": "off",
    "jit": "off", "row_security": "on", "xmloption": "content", "geqo": "on",
    "synchronous_commit": "on", "work_mem": "4MB", "timezone_abbreviations": "Default",
    "session_authorization": "", "max_connections": "100", "max_index_keys": "32",
    "max_function_args": "100", "block_size": "8192", "data_checksums": "off",
}
READ_ONLY = {"server_version", "server_version_num", "server_encoding", "is_superuser",
             "max_identifier_length", "lc_collate", "lc_ctype", "integer_datetimes",
             "in_hot_standby", "session_authorization", "max_connections",
             "standard_conforming_strings", "max_index_keys", "max_function_args",
             "block_size", "data_checksums"}
# Sent to the client as ParameterStatus at startup and whenever they change.
REPORTED = ("application_name", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone",
            "integer_datetimes", "standard_conforming_strings", "is_superuser",
            "session_authorization", "server_encoding", "server_version",
            "default_transaction_read_only", "in_hot_standby")
_CANONICAL = {name.lower(): name for name in DEFAULTS}
_ENCODINGS = {"utf8", "utf-8", "unicode", "sql_ascii"}


class StatementError(Exception):
    """An error the client receives as ErrorResponse."""

    def __init__(self, sqlstate: str, message: str, *, hint: str | None = None,
                 position: int | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.hint = hint
        self.position = position


class AnswerLike(Protocol):
    """What the server reads of ``dpsql.query.answer.Answer``."""

    @property
    def table(self) -> pa.Table:
        """The rows (no columns: a statement without a result, such as SET)."""

    @property
    def status(self) -> str:
        """The command tag (``SELECT 3``, ``SET``)."""

    @property
    def notice(self) -> str | None:
        """A line for the analyst after the answer (its cost, the budget left)."""

    @property
    def warning(self) -> str | None:
        """A second line when some values are mostly noise (DP answers only)."""


StatementHandler = Callable[[str], AnswerLike]


@dataclass
class Outcome:
    """The result of one statement as the protocol layer sends it."""

    table: pa.Table | None
    tag: str
    notices: list[tuple[str, str, str]] = field(default_factory=list)  # severity, code, text
    parameter_status: dict[str, str] = field(default_factory=dict)
    deallocate: str | None = None  # a prepared statement name, or "ALL"
    discard: bool = False
    copy: copyout.CopyFormat | None = None  # the rows go out as COPY data in this format


_SET = re.compile(r"^SET\s+(?:(?:SESSION|LOCAL)\s+)?(?P<name>[A-Za-z_][\w.]*|\"[^\"]+\")\s*"
                  r"(?:=|\s+TO\s+|\s)\s*(?P<value>.*)$", re.I | re.S)
_SET_TIME_ZONE = re.compile(r"^SET\s+(?:(?:SESSION|LOCAL)\s+)?TIME\s+ZONE\s+(?P<value>.+)$",
                            re.I | re.S)
_SET_NAMES = re.compile(r"^SET\s+NAMES\s+(?P<value>.+)$", re.I | re.S)
_SHOW = re.compile(r"^SHOW\s+(?P<name>[A-Za-z_][\w.]*|\"[^\"]+\")$", re.I | re.S)
_RESET = re.compile(r"^RESET\s+(?P<name>[A-Za-z_][\w.]*|\"[^\"]+\")$", re.I | re.S)
_TXN_BEGIN = re.compile(r"^(BEGIN|START\s+TRANSACTION)\b", re.I)
_TXN_COMMIT = re.compile(r"^(COMMIT|END)\b(?!\s+PREPARED)", re.I)
_TXN_ROLLBACK = re.compile(
    r"^(ROLLBACK|ABORT)\b(?!\s+PREPARED)(?!\s+(WORK\s+|TRANSACTION\s+)?TO\b)", re.I)
_SAVEPOINT = re.compile(r"^(SAVEPOINT|RELEASE|ROLLBACK\s+(WORK\s+|TRANSACTION\s+)?TO)\b", re.I)
_DEALLOCATE = re.compile(r"^DEALLOCATE\s+(PREPARE\s+)?(?P<name>\w+|\"[^\"]+\")$", re.I)
_QUERY_START = re.compile(r"^[\s(]*(SELECT|WITH|VALUES|TABLE)\b", re.I)
_UNSUPPORTED = [
    (re.compile(r"^COPY\b", re.I), "COPY reads no files and writes none; copy a query's "
     "answer out with COPY (SELECT ...) TO STDOUT (psql: \\copy (SELECT ...) TO 'file')"),
    (re.compile(r"^(DECLARE|FETCH|MOVE|CLOSE)\b", re.I),
     "this cursor statement is not supported; write DECLARE name [WITH HOLD] CURSOR FOR "
     "SELECT ..., FETCH [FORWARD n | ALL] FROM name, CLOSE name"),
    (re.compile(r"^(PREPARE|EXECUTE)\b", re.I),
     "SQL-level PREPARE/EXECUTE are not supported; drivers' prepared statements work"),
    (re.compile(r"^(LISTEN|NOTIFY)\b", re.I), "LISTEN/NOTIFY are not supported"),
    (re.compile(r"^SET\s+(SESSION\s+AUTHORIZATION|ROLE)\b", re.I),
     "changing roles is not supported; connect as the user you want"),
]


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _value(raw: str) -> str:
    """A SET value as PostgreSQL stores it: list items unquoted and joined by ', '."""
    parts = [p for p in re.split(r",(?=(?:[^']*'[^']*')*[^']*$)", raw) if p.strip()]
    return ", ".join(_unquote(p) for p in parts)


def _param_name(raw: str) -> str:
    name = raw.strip('"') if raw.startswith('"') else raw.lower()
    return _CANONICAL.get(name.lower(), name)


def _statement_timeout(value: str) -> str:
    text = value.strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min|h|d)?", text)
    if not match:
        raise StatementError("22023", f'invalid value for parameter "statement_timeout": '
                             f'"{value}"', hint="give milliseconds, or a unit: 5s, 1min")
    scale = {None: 1, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
    return str(int(float(match.group(1)) * scale[match.group(2)]))


class Router:
    """Statement routing and per-connection client state for one client connection."""

    def __init__(self, *, user: str, database: str, handler: StatementHandler,
                 catalog: ConnectionCatalog, reset_options: Callable[[], None],
                 pid: int, started: str, startup: Mapping[str, str] | None = None) -> None:
        self.user = user
        self.database = database
        self.handler = handler
        self.catalog = catalog
        self.reset_options = reset_options
        self.pid = pid
        self.started = started
        self.txn = "I"  # ReadyForQuery status: I idle, T in a block, E failed block
        self.cursors: dict[str, cursors.Cursor] = {}
        self.settings = dict(DEFAULTS, session_authorization=user)
        for name, value in (startup or {}).items():
            if name in ("user", "database", "replication", "options") or name.startswith("_pq_"):
                continue
            self._set(_param_name(name), value, startup=True)
        self._initial = dict(self.settings)

    # -- client parameters ------------------------------------------------------------
    def _set(self, name: str, value: str, *, startup: bool = False) -> dict[str, str]:
        if name in READ_ONLY and not startup:
            raise StatementError("55P02", f'parameter "{name}" cannot be changed')
        if name not in DEFAULTS and "." not in name:
            if startup:
                return {}
            raise StatementError("42704", f'unrecognized configuration parameter "{name}"')
        if name == "client_encoding" and value.lower() not in _ENCODINGS:
            raise StatementError("22023", f"dpsql speaks UTF8 only, not {value}",
                                 hint="set client_encoding to UTF8")
        if name == "client_encoding":
            value = "UTF8"
        if name == "DateStyle" and not value.upper().startswith("ISO"):
            raise StatementError("22023", f"DateStyle {value!r} is not supported; dpsql writes "
                                 "dates in ISO format", hint="SET DateStyle = ISO")
        if name == "TimeZone":
            try:
                time_zone(value)
            except ValueError as err:
                raise StatementError("22023", f'invalid value for parameter "TimeZone": '
                                     f'"{value}"') from err
        if name == "statement_timeout":
            value = _statement_timeout(value)
        if name == "default_transaction_read_only" and value.lower() in ("off", "false", "0"):
            raise StatementError("25006", "dpsql sessions are read-only")
        self.settings[name] = value
        return {name: value} if name in REPORTED else {}

    @property
    def timezone(self) -> Any:
        """The session's TimeZone as a tzinfo (timestamptz values are shown in it)."""
        return time_zone(self.settings["TimeZone"])

    @property
    def statement_timeout_ms(self) -> int:
        """The client's statement_timeout in milliseconds (0: none)."""
        return int(self.settings.get("statement_timeout", "0"))

    # -- entry points -------------------------------------------------------------------
    def run(self, text: str) -> Outcome:
        """Execute one statement; errors are raised as StatementError."""
        sql = strip_comments(text).strip().rstrip(";").strip()
        if not sql:
            return Outcome(None, "")
        transaction = self._transaction(sql)
        if transaction is not None:
            return transaction
        if self.txn == "E":
            raise StatementError("25P02", "current transaction is aborted, commands ignored "
                                 "until end of transaction block")
        try:
            return self._dispatch(sql, text)
        except StatementError:
            self.failed()
            raise
        except Exception as err:
            self.failed()
            raise _internal(err, self.user) from err

    def failed(self) -> None:
        """Record that a statement failed (inside a block, the block is now aborted)."""
        if self.txn == "T":
            self.txn = "E"

    # -- transactions -------------------------------------------------------------------
    def _transaction(self, sql: str) -> Outcome | None:
        if _TXN_BEGIN.match(sql):
            if self.txn != "I":
                return Outcome(None, "BEGIN", [("WARNING", "25001",
                                                "there is already a transaction in progress")])
            self.txn = "T"
            return Outcome(None, "BEGIN")
        if _SAVEPOINT.match(sql):
            if self.txn == "I":
                raise StatementError("25P01", f"{sql.split()[0].upper()} can only be used in "
                                     "transaction blocks")
            word = sql.split()[0].upper()
            if word == "ROLLBACK":
                self.txn = "T"
            return Outcome(None, {"SAVEPOINT": "SAVEPOINT", "RELEASE": "RELEASE"}.get(
                word, "ROLLBACK"))
        commit, rollback = _TXN_COMMIT.match(sql), _TXN_ROLLBACK.match(sql)
        if not (commit or rollback):
            return None
        if self.txn == "I":
            return Outcome(None, "COMMIT" if commit else "ROLLBACK",
                           [("WARNING", "25P01", "there is no transaction in progress")])
        failed = self.txn == "E"
        self.txn = "I"
        self.cursors = {name: c for name, c in self.cursors.items() if c.hold}
        return Outcome(None, "ROLLBACK" if rollback or failed else "COMMIT")

    # -- dispatch -------------------------------------------------------------------------
    def _dispatch(self, sql: str, text: str) -> Outcome:
        special = self._copy(sql) or self._cursor(sql)
        if special is not None:
            return special
        for pattern, message in _UNSUPPORTED:
            if pattern.match(sql):
                raise StatementError("0A000", message)
        client = self._client(sql)
        if client is not None:
            return client
        if _QUERY_START.match(sql):
            tree = rewrite.parse(sql)
            if tree is not None and rewrite.is_catalog_query(
                    tree, self.catalog.source.user_relations()):
                return self._catalog(tree)
        return self._session(text)

    def _inner(self, query: str, statement: str) -> Outcome:
        """The outcome of a query that COPY or DECLARE wraps, as if it had been sent alone."""
        if not _QUERY_START.match(query):
            raise StatementError("42601", f"{statement} takes a query: SELECT, WITH, VALUES or "
                                 "TABLE")
        return self._dispatch(query, query)

    def _copy(self, sql: str) -> Outcome | None:
        try:
            statement = copyout.parse(sql)
        except copyout.CopyOptionError as err:
            raise StatementError("0A000", str(err)) from err
        if statement is None:
            return None
        answer = self._inner(statement.query, "COPY")
        table = answer.table if answer.table is not None else pa.table({})
        return Outcome(table, f"COPY {table.num_rows}", answer.notices, copy=statement.format)

    def _cursor(self, sql: str) -> Outcome | None:
        declare = cursors.parse_declare(sql)
        if declare is not None:
            if declare.binary:
                raise StatementError("0A000", "binary cursors are not supported; ask for "
                                     "binary results in the protocol instead")
            if self.txn == "I" and not declare.hold:
                raise StatementError("25P01", "DECLARE CURSOR can only be used in transaction "
                                     "blocks", hint="BEGIN first, or DECLARE ... WITH HOLD")
            if declare.name in self.cursors:
                raise StatementError("42P03", f'cursor "{declare.name}" already exists')
            answer = self._inner(declare.query, "DECLARE CURSOR")
            table = answer.table if answer.table is not None else pa.table({})
            self.cursors[declare.name] = cursors.Cursor(table, declare.hold)
            return Outcome(None, "DECLARE CURSOR", answer.notices)
        if sql.upper() == "CLOSE ALL":
            self.cursors.clear()
            return Outcome(None, "CLOSE CURSOR ALL")
        fetch = cursors.parse_fetch(sql)
        closed = cursors.parse_close(sql)
        if fetch is None and closed is None:
            return None
        name = fetch.name if fetch is not None else closed
        if name not in self.cursors:
            raise StatementError("34000", f'cursor "{name}" does not exist')
        if fetch is None:
            del self.cursors[name]
            return Outcome(None, "CLOSE CURSOR")
        cursor = self.cursors[name]
        rows = cursor.step(fetch.direction)
        if fetch.move:
            return Outcome(None, f"MOVE {len(rows)}")
        return Outcome(cursor.table.take(pa.array(rows, pa.int64())), f"FETCH {len(rows)}")

    def _client(self, sql: str) -> Outcome | None:
        upper = sql.upper()
        if upper in ("DISCARD ALL", "DISCARD PLANS", "DISCARD SEQUENCES", "DISCARD TEMP",
                     "DISCARD TEMPORARY"):
            if upper == "DISCARD ALL":
                if self.txn != "I":
                    raise StatementError("25001", "DISCARD ALL cannot run inside a transaction "
                                         "block")
                changed = self._reset_all()
                self.cursors.clear()
                return Outcome(None, "DISCARD ALL", parameter_status=changed, discard=True,
                               deallocate="ALL")
            return Outcome(None, upper)
        if upper == "UNLISTEN *":
            return Outcome(None, "UNLISTEN")
        dealloc = _DEALLOCATE.match(sql)
        if dealloc:
            name = dealloc.group("name")
            if name.upper() == "ALL":
                return Outcome(None, "DEALLOCATE ALL", deallocate="ALL")
            return Outcome(None, "DEALLOCATE", deallocate=name.strip('"'))
        if upper in ("RESET ALL",):
            changed = self._reset_all()
            return Outcome(None, "RESET", parameter_status=changed)
        for pattern, kind in ((_SET_TIME_ZONE, "TimeZone"), (_SET_NAMES, "client_encoding")):
            match = pattern.match(sql)
            if match:
                raw = match.group("value").strip()
                value = "UTC" if raw.upper() in ("LOCAL", "DEFAULT") else _value(raw)
                return Outcome(None, "SET", parameter_status=self._set(kind, value))
        if re.match(r"^SET\s+(SESSION\s+CHARACTERISTICS|TRANSACTION)\b", sql, re.I):
            if re.search(r"READ\s+WRITE", sql, re.I):
                raise StatementError("25006", "dpsql sessions are read-only")
            return Outcome(None, "SET")
        match = _SET.match(sql)
        if match and not _param_name(match.group("name")).lower().startswith("dpsql."):
            name = _param_name(match.group("name"))
            raw = match.group("value").strip()
            if raw.upper() == "DEFAULT":
                return Outcome(None, "SET", parameter_status=self._reset(name))
            return Outcome(None, "SET", parameter_status=self._set(name, _value(raw)))
        match = _RESET.match(sql)
        if match and not _param_name(match.group("name")).lower().startswith("dpsql."):
            return Outcome(None, "RESET", parameter_status=self._reset(
                _param_name(match.group("name"))))
        if upper == "SHOW ALL":  # the client parameters, then the session's dpsql options
            rows = [(name, value, "") for name, value in
                    sorted(self.settings.items(), key=lambda kv: kv[0].lower())]
            options = self.handler("SHOW dpsql.all").table.to_pylist()
            rows += [(str(o["name"]), str(o["value"]), str(o["source"])) for o in options]
            table = pa.table({"name": [r[0] for r in rows], "setting": [r[1] for r in rows],
                              "description": [r[2] for r in rows]})
            return Outcome(table, "SHOW")
        match = _SHOW.match(sql)
        if match and not _param_name(match.group("name")).lower().startswith("dpsql."):
            name = _param_name(match.group("name"))
            if name.lower() == "transaction isolation level":
                name = "transaction_isolation"
            if name not in self.settings:
                raise StatementError("42704", f'unrecognized configuration parameter "{name}"')
            return Outcome(pa.table({name.lower(): [self.settings[name]]}), "SHOW")
        if re.match(r"^SHOW\s+TRANSACTION\s+ISOLATION\s+LEVEL$", sql, re.I):
            return Outcome(pa.table({"transaction_isolation":
                                     [self.settings["transaction_isolation"]]}), "SHOW")
        return None

    def _reset(self, name: str) -> dict[str, str]:
        if name not in self.settings:
            raise StatementError("42704", f'unrecognized configuration parameter "{name}"')
        self.settings[name] = self._initial.get(name, DEFAULTS.get(name, ""))
        return {name: self.settings[name]} if name in REPORTED else {}

    def _reset_all(self) -> dict[str, str]:
        before = dict(self.settings)
        self.settings = dict(self._initial)
        self.reset_options()
        return {k: v for k, v in self.settings.items() if k in REPORTED and before.get(k) != v}

    def _context(self) -> rewrite.Context:
        version = (f"PostgreSQL {SERVER_VERSION} (dpsql: differentially private SQL over "
                   "DuckDB)")
        return rewrite.Context(self.user, self.database, self.settings, self.pid, version,
                               self.started,
                               tuple((name, c.hold) for name, c in self.cursors.items()))

    def _catalog(self, tree: rewrite.exp.Expr) -> Outcome:
        try:
            table = self.catalog.run(tree, self._context())
        except rewrite.CatalogQueryError as err:
            raise StatementError(err.sqlstate, str(err)) from err
        return Outcome(table, f"SELECT {table.num_rows}")

    def catalog_schema(self, text: str) -> pa.Schema | None:
        """Result columns of a catalog statement, its parameters read as NULL (Describe)."""
        sql = strip_comments(text).strip().rstrip(";").strip()
        tree = rewrite.parse(sql) if _QUERY_START.match(sql) else None
        if tree is None or not rewrite.is_catalog_query(tree,
                                                        self.catalog.source.user_relations()):
            return None
        return self._catalog(tree).table.schema  # type: ignore[union-attr]

    def _session(self, text: str) -> Outcome:
        try:
            answer = self.handler(text)
        except DPSQLError as err:
            raise _dpsql_error(err, text) from err
        table = answer.table if answer.table is not None and answer.table.num_columns else None
        notices = [("NOTICE", "00000", text) for text in
                   (answer.notice, answer.warning) if text]
        return Outcome(table, answer.status, notices)


def _internal(err: Exception, user: str) -> StatementError:
    """A bug, as the client sees it: a reference to the server log and nothing else."""
    incident = secrets.token_hex(4)
    log.error("internal error %s answering a statement for %s", incident, user, exc_info=err)
    return StatementError("XX000", f"internal error (reference {incident}); this is a bug in "
                          "dpsql, the administrator can find it in the server log")


def _dpsql_error(err: DPSQLError, text: str) -> StatementError:
    """A dpsql error as the client sees it: its SQLSTATE and message, a position if known."""
    position = None
    if isinstance(err, QueryRejected) and err.line is not None:
        lines = text.split("\n")
        line = max(1, min(err.line, len(lines)))
        position = sum(len(x) + 1 for x in lines[:line - 1]) + (err.column or 1)
    return StatementError(err.sqlstate, str(err), position=position)
