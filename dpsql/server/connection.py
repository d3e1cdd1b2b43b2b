"""One client connection: its login, then the simple and extended query protocols.

All DuckDB work (the session's statements, catalog queries, encoding rows)
runs on the server's thread pool; the event loop only moves bytes. A
malformed or oversized message ends this connection with an ErrorResponse,
never the server. The login is :mod:`dpsql.server.login`'s; the prepared
statements and portals :mod:`dpsql.server.portals`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dpsql.errors import DPSQLError, QueryCanceled
from dpsql.policies import VERSIONS
from dpsql.server import copyout
from dpsql.server import messages as m
from dpsql.server.catalog import ConnectionCatalog
from dpsql.server.host import Host
from dpsql.server.login import ConnectionClosed, Login, fatal
from dpsql.server.pgcatalog import Client
from dpsql.server.pgtypes import UnsupportedFormat
from dpsql.server.portals import Portal, Portals
from dpsql.server.router import REPORTED, Outcome, Router, StatementError
from dpsql.server.rows import encode_rows, row_fields, text_formats
from dpsql.server.sqltext import SQLTextError, bind_parameters, split_statements

log = logging.getLogger("dpsql.server")
T = TypeVar("T")
ROWS_PER_WRITE = 1000


class Connection:
    """The server side of one client connection."""

    def __init__(self, server: Host, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.host = str(peer[0]) if isinstance(peer, tuple) else "local"
        self.pid = server.next_pid()
        self.key = secrets.randbits(31)
        self.user: str | None = None
        self.router: Router | None = None
        self.session: Any = None
        self.catalog: ConnectionCatalog | None = None
        self.prepared = Portals()
        self.skip_until_sync = False
        self._pending: asyncio.Future[Any] | None = None
        self._abandoned = threading.Event()  # set to stop the current statement's work
        self._cancel = asyncio.Event()
        self.login = Login(server, reader, writer, self)
        self._login: asyncio.Task[tuple[str, dict[str, str]] | None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def serve(self) -> None:
        """Serve until the client leaves, breaks the protocol or the server stops.

        Until it has logged in, a connection holds one of the server's few login
        slots (not a client slot), which a newcomer may take when they are all
        taken and this one waits (see :class:`~dpsql.server.logins.LoginSlots`); it
        must send each message within the login step timeout and finish within
        the login timeout.
        """
        config = self.server.config
        try:
            if not self.server.register(self):
                await self._fatal("53300", "sorry, too many connections are logging in at "
                                  "once; try again in a few seconds")
                return
            self._login = asyncio.ensure_future(self.login.run())
            done, _ = await asyncio.wait({self._login}, timeout=config.login_timeout)
            if not done:
                self._login.cancel()
                await asyncio.wait({self._login})
            if self.login.dropped:  # its slot went to a newcomer
                log.debug("connection from %s: its login slot went to a newcomer", self.host)
                if not self._login.cancelled():
                    self._login.exception()  # retrieved: ConnectionClosed, or the step's end
                if self.login.failure is not None:  # the answer it was held for, now
                    await self._fatal("28P01", self.login.failure)
                else:
                    await self._fatal("53300", "sorry, too many connections are logging in at "
                                      "once; try again in a few seconds")
                return
            if not done:
                log.info("connection from %s: login timed out", self.host)
                return
            if self._login.cancelled():  # the server is stopping (terminate)
                return
            login = self._login.result()
            if login is not None and await self._open_session(*login):
                await self._loop()
        except asyncio.TimeoutError:
            log.info("connection from %s: a login step timed out", self.host)
        except m.ProtocolViolation as err:
            log.info("connection from %s closed: %s", self.host, err)
            await self._fatal(err.sqlstate, str(err))
        except (asyncio.IncompleteReadError, ConnectionError, ConnectionClosed, ssl.SSLError):
            pass
        finally:
            await self._cleanup()

    def _stop_statement(self) -> None:
        """Interrupt the running statement's work (any thread may still be starting it)."""
        self._abandoned.set()
        if self.session is not None:
            self.session.interrupt()

    async def _cleanup(self) -> None:
        self.server.unregister(self)
        if self._login is not None and not self._login.done():  # serve() itself was cancelled
            self._login.cancel()
        if self._pending is not None and not self._pending.done():
            self._stop_statement()  # the client has gone: nobody waits for the answer
            with contextlib.suppress(Exception):
                await asyncio.shield(self._pending)
        if self.catalog is not None:
            self.catalog.close()
        if self.session is not None:
            session = self.session
            self.session = None
            try:
                await asyncio.get_running_loop().run_in_executor(self.server.executor,
                                                                 session.close)
            except RuntimeError:  # the pool is gone (a forced shutdown): close here
                session.close()
        try:
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (ConnectionError, asyncio.TimeoutError, ssl.SSLError, OSError):
            pass

    async def terminate(self, message: str) -> None:
        """Tell the client the server is shutting down, then close."""
        if self._login is not None:  # a held or waiting login ends too
            self._login.cancel()
        await self._fatal("57P01", message)
        self.writer.close()

    async def _fatal(self, code: str, message: str) -> None:
        await fatal(self.writer, code, message)

    def cancel(self) -> None:
        """A CancelRequest for this connection arrived: stop the running statement."""
        self._cancel.set()

    def heard(self) -> bool:
        """Whether bytes from the client wait to be read (the server is behind, not the client)."""
        return bool(getattr(self.reader, "_buffer", b""))  # StreamReader has no public look

    def drop(self) -> None:
        """Its login slot went to a newcomer: stop logging in (see :meth:`Login.drop`)."""
        self.login.drop(self._login)

    @property
    def dropped(self) -> bool:
        """Whether its login slot went to a newcomer."""
        return self.login.dropped

    # -- after the login ----------------------------------------------------------------------
    async def _open_session(self, user: str, params: dict[str, str]) -> bool:
        server = self.server
        if not server.log_in(self, user):
            await self._fatal("53300", "sorry, too many clients already")
            return False
        policy = await self._run(server.store[VERSIONS].active)
        principal = policy.users.get(user)
        if principal is None:
            await self._fatal("28000", f'role "{user}" is not permitted to log in')
            return False
        if server.count_user(user) > principal.max_connections:
            await self._fatal("53300", f'too many connections for role "{user}" (the policy '
                              f"allows {principal.max_connections})")
            return False
        try:
            self.session = await self._run(server.open_session, user)
        except DPSQLError as err:
            await self._fatal(err.sqlstate, str(err))
            return False
        database = params.get("database") or user
        # A fresh connection shows the server's statement timeout (in ms), which it may lower.
        router_settings = {"statement_timeout": str(round(server.config.statement_timeout * 1000)),
                           **{k: v for k, v in params.items() if k not in ("user", "database")}}
        self.catalog = ConnectionCatalog(server.catalog, Client(
            user, database, principal.max_connections, {}), self.session.interrupts)
        session = self.session
        try:
            self.router = Router(user=user, database=database,
                                 handler=server.handler_factory(session),
                                 catalog=self.catalog,
                                 reset_options=lambda: session.options.clear(),
                                 pid=self.pid, started=server.started,
                                 startup=router_settings)
        except StatementError as err:
            await self._fatal(err.sqlstate, err.message)
            return False
        self.catalog.client = Client(user, database, principal.max_connections,
                                     self.router.settings)
        for name in REPORTED:
            self.writer.write(m.parameter_status(name, self.router.settings[name]))
        self.writer.write(m.backend_key_data(self.pid, self.key))
        self.writer.write(m.ready_for_query("I"))
        await self.writer.drain()
        log.info("user %s connected from %s (backend %d)", user, self.host, self.pid)
        return True

    # -- running work off the loop ------------------------------------------------------------
    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.server.executor, fn, *args)

    def _timeout(self) -> float | None:
        limits = [self.server.config.statement_timeout]
        if self.router is not None and self.router.statement_timeout_ms:
            limits.append(self.router.statement_timeout_ms / 1000)
        chosen = [x for x in limits if x and x > 0]
        return min(chosen) if chosen else None

    async def _statement(self, fn: Callable[..., T], *args: Any) -> T:
        """Run statement work with the statement timeout and cancel requests.

        Either one stops the work: its DuckDB queries (DP, free or catalog) are
        interrupted, and work still waiting for a worker thread never starts.
        """
        if self._pending is not None and not self._pending.done():
            await asyncio.wait({self._pending})  # a timed-out statement still holds the session
        loop = asyncio.get_running_loop()
        self._cancel.clear()
        interrupts, abandoned = self.session.interrupts, threading.Event()
        self._abandoned = abandoned

        def work() -> T:
            with interrupts.statement():
                if abandoned.is_set():  # stopped while it waited for a worker thread
                    raise QueryCanceled()
                return fn(*args)

        future = loop.run_in_executor(self.server.executor, work)
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending = future
        cancel: asyncio.Future[Any] = asyncio.ensure_future(self._cancel.wait())
        try:
            done, _ = await asyncio.wait([future, cancel], timeout=self._timeout(),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if future in done:
            return future.result()
        assert self.router is not None
        self._stop_statement()
        self.router.failed()
        reason = "user request" if self._cancel.is_set() else "statement timeout"
        raise StatementError("57014", f"canceling statement due to {reason}")

    # -- the message loop -------------------------------------------------------------------
    async def _loop(self) -> None:
        handlers = {b"Q": self._query, b"P": self._parse, b"B": self._bind,
                    b"D": self._describe, b"E": self._execute, b"C": self._close,
                    b"S": self._sync, b"H": self._flush}
        while True:
            kind, payload = await m.read_message(self.reader, self.server.config.max_message)
            if kind == b"X":
                return
            handler = handlers.get(kind)
            if handler is None:
                raise m.ProtocolViolation(f"unsupported frontend message type {kind!r}")
            if self.skip_until_sync and kind != b"S":
                continue
            try:
                await handler(payload)
            except StatementError as err:
                self._error(err)
                if kind != b"Q":
                    self.skip_until_sync = True
            if self.writer.transport.get_write_buffer_size() > 1 << 16:
                await self.writer.drain()

    def _error(self, err: StatementError) -> None:
        self.writer.write(m.error_response(err.sqlstate, err.message, hint=err.hint,
                                           position=err.position))

    def _send_notices(self, outcome: Outcome) -> None:
        for severity, code, text in outcome.notices:
            self.writer.write(m.notice_response(text, code=code, severity=severity))
        for name, value in outcome.parameter_status.items():
            self.writer.write(m.parameter_status(name, value))

    def _apply(self, outcome: Outcome) -> None:
        self.prepared.deallocate(outcome.deallocate)

    async def _query(self, payload: bytes) -> None:
        assert self.router is not None
        text = m.decode_query(payload)
        try:
            statements = split_statements(text)
        except SQLTextError as err:
            self._error(StatementError("42601", str(err)))
            statements = None
        if statements == []:
            self.writer.write(m.empty_query_response())
        for statement in statements or []:
            try:
                outcome, rows = await self._statement(self._answer, statement, text_formats)
            except StatementError as err:
                self._error(err)
                break
            if outcome.copy is not None:
                await self._write_copy(outcome, rows)
            elif outcome.table is not None:
                self.writer.write(m.row_description(row_fields(outcome.table.schema,
                                                               text_formats)))
                await self._write_rows(rows)
            self._send_notices(outcome)
            self._apply(outcome)
            self.writer.write(m.command_complete(outcome.tag) if outcome.tag
                              else m.empty_query_response())
        self.writer.write(m.ready_for_query(self.router.txn))
        await self.writer.drain()

    def _answer(self, text: str, formats: Callable[[int], int]) -> tuple[Outcome, list[bytes]]:
        """Run one statement and encode its rows, in one trip to a worker thread."""
        assert self.router is not None
        outcome = self.router.run(text)
        return outcome, self._encoded(outcome, formats)

    def _encoded(self, outcome: Outcome, formats: Callable[[int], int]) -> list[bytes]:
        assert self.router is not None
        if outcome.table is None:
            return []
        if outcome.copy is not None:
            lines = copyout.lines(outcome.table, outcome.copy, self.router.timezone)
            return [m.copy_data(line) for line in lines]
        try:
            return encode_rows(outcome.table, formats, self.router.timezone,
                               self.session.interrupts.check if self.session else None)
        except UnsupportedFormat as err:
            self.router.failed()
            raise StatementError("0A000", str(err)) from err

    async def _write_copy(self, outcome: Outcome, rows: Sequence[bytes]) -> None:
        assert outcome.table is not None
        self.writer.write(m.copy_out_response(outcome.table.num_columns))
        await self._write_rows(rows)
        self.writer.write(m.copy_done())

    async def _write_rows(self, rows: Sequence[bytes]) -> None:
        for start in range(0, len(rows), ROWS_PER_WRITE):
            self.writer.write(b"".join(rows[start:start + ROWS_PER_WRITE]))
            await self.writer.drain()

    # -- extended query protocol ---------------------------------------------------------------
    async def _parse(self, payload: bytes) -> None:
        self.prepared.parse(m.decode_parse(payload))
        self.writer.write(m.parse_complete())

    async def _bind(self, payload: bytes) -> None:
        self.prepared.bind(m.decode_bind(payload))
        self.writer.write(m.bind_complete())

    async def _describe(self, payload: bytes) -> None:
        assert self.router is not None
        which, name = m.decode_target(payload)
        if which == "S":
            statement = self.prepared.statement(name)
            oids = [statement.param_type(i) or 25 for i in range(statement.param_count)]
            self.writer.write(m.parameter_description(oids))
            null_text = bind_parameters(statement.text, lambda n: "NULL")
            schema = await self._statement(self.router.catalog_schema, null_text)
            if schema is None:
                if statement.param_count:
                    raise StatementError(
                        "0A000", "dpsql computes an answer when its statement is described, "
                        "and cannot before the parameters are bound",
                        hint="bind the parameters first (pgjdbc: prepareThreshold=0)")
                statement.cached = await self._statement(self.router.run, statement.text)
                table = statement.cached.table if statement.cached.copy is None else None
                schema = table.schema if table is not None else None
            self.writer.write(m.row_description(row_fields(schema, text_formats))
                              if schema is not None and len(schema) else m.no_data())
            return
        cursor = self.router.cursors.get(name)
        if name not in self.prepared.portals and cursor is not None:  # DECLAREd: a portal too
            self.writer.write(m.row_description(row_fields(cursor.table.schema, text_formats)))
            return
        portal = await self._portal_outcome(name)
        outcome = portal.outcome
        table = outcome.table if outcome is not None and outcome.copy is None else None
        self.writer.write(m.row_description(row_fields(table.schema, portal.result_formats))
                          if table is not None else m.no_data())

    async def _portal_outcome(self, name: str) -> Portal:
        assert self.router is not None
        portal = self.prepared.portal(name)
        if portal.outcome is None:
            portal.outcome, portal.rows = await self._statement(self._answer, portal.text,
                                                                portal.result_formats)
        if portal.rows is None:  # an answer computed when its statement was described
            portal.rows = await self._run(self._encoded, portal.outcome, portal.result_formats)
        return portal

    async def _execute(self, payload: bytes) -> None:
        name, max_rows = m.decode_execute(payload)
        portal = await self._portal_outcome(name)
        outcome = portal.outcome
        assert outcome is not None
        assert portal.rows is not None
        if outcome.copy is not None:
            await self._write_copy(outcome, portal.rows)
            portal.sent = len(portal.rows)
        end = len(portal.rows) if not max_rows else min(len(portal.rows), portal.sent + max_rows)
        await self._write_rows(portal.rows[portal.sent:end])
        portal.sent = end
        if end < len(portal.rows):
            self.writer.write(m.portal_suspended())
            return
        if not portal.notices_sent:
            self._send_notices(outcome)
            self._apply(outcome)
            portal.notices_sent = True
        self.writer.write(m.command_complete(outcome.tag) if outcome.tag
                          else m.empty_query_response())

    async def _close(self, payload: bytes) -> None:
        self.prepared.close(*m.decode_target(payload))
        self.writer.write(m.close_complete())

    async def _sync(self, payload: bytes) -> None:
        assert self.router is not None
        self.skip_until_sync = False
        if self.router.txn == "I":
            self.prepared.portals.clear()
        self.writer.write(m.ready_for_query(self.router.txn))
        await self.writer.drain()

    async def _flush(self, payload: bytes) -> None:
        await self.writer.drain()
