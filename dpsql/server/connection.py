"""One client connection: startup, SCRAM login, then the simple and extended query protocols.

All DuckDB work (the session's statements, catalog queries, encoding rows)
runs on the server's thread pool; the event loop only moves bytes. A
malformed or oversized message ends this connection with an ErrorResponse,
never the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from dpsql import passwords
from dpsql.errors import DPSQLError, QueryCanceled
from dpsql.server import copyout
from dpsql.server import messages as m
from dpsql.server.catalog import ConnectionCatalog
from dpsql.server.pgcatalog import Client
from dpsql.server.pgtypes import (
    BadParameter,
    UnsupportedFormat,
    column_encoder,
    from_arrow,
    parameter_literal,
)
from dpsql.server.router import REPORTED, Outcome, Router, StatementError
from dpsql.server.sqltext import SQLTextError, bind_parameters, max_parameter, split_statements

if TYPE_CHECKING:
    from dpsql.server.server import Server

log = logging.getLogger("dpsql.server")
T = TypeVar("T")
AUTH_MESSAGE_LIMIT = 10_000
ROWS_PER_WRITE = 1000
ENCODE_SLICE = 4096  # answer rows encoded between two looks at a statement timeout or cancel


class ConnectionClosed(Exception):
    """Stop serving this connection (after a FATAL error or Terminate)."""


@dataclass
class Prepared:
    """A statement from Parse: its text, declared parameter types, a cached describe result."""

    text: str
    param_types: tuple[int, ...]
    param_count: int
    cached: Outcome | None = None


@dataclass
class Portal:
    """A bound statement ready to execute (Bind), with its result once computed."""

    text: str
    result_formats: Callable[[int], int]
    outcome: Outcome | None = None
    rows: list[bytes] | None = None
    sent: int = 0
    notices_sent: bool = False
    statement: Prepared | None = field(default=None, repr=False)


def row_fields(schema: pa.Schema, formats: Callable[[int], int]) -> list[m.FieldDescription]:
    """RowDescription fields for an Arrow schema."""
    out = []
    for index, arrow_field in enumerate(schema):
        pg, typmod = from_arrow(arrow_field.type)
        out.append(m.FieldDescription(arrow_field.name, pg.oid, pg.size, typmod,
                                      formats(index)))
    return out


def encode_rows(table: pa.Table, formats: Callable[[int], int], zone: Any,
                check: Callable[[], None] | None = None) -> list[bytes]:
    """Every row of ``table`` as a DataRow message.

    ``check`` runs before each slice of rows and raises to stop: a statement
    timeout or cancel then ends the encoding of a large answer, not only its query.
    """
    encoders = [column_encoder(table.schema.field(i).type, formats(i) == 1, zone)
                for i in range(table.num_columns)]
    out: list[bytes] = []
    for start in range(0, table.num_rows, ENCODE_SLICE):
        if check is not None:
            check()
        part = table.slice(start, ENCODE_SLICE)
        columns = [part.column(i).to_pylist() for i in range(part.num_columns)]
        out.extend(m.data_row([enc(v) for enc, v in zip(encoders, values, strict=True)])
                   for values in zip(*columns, strict=True))
    return out


def _text_formats(_: int) -> int:
    return 0


class Connection:
    """The server side of one client connection."""

    def __init__(self, server: Server, reader: asyncio.StreamReader,
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
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.skip_until_sync = False
        self._pending: asyncio.Future[Any] | None = None
        self._abandoned = threading.Event()  # set to stop the current statement's work
        self._cancel = asyncio.Event()
        self._login: asyncio.Task[tuple[str, dict[str, str]] | None] | None = None
        self.dropped = False  # its login slot went to a newcomer
        self._awaiting_client = True  # for its client's next login message (from accept on)
        self._lingers = False  # dropped, it stays open until its login would have timed out
        self._failure: str | None = None  # the answer held back after a failed proof

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
            self._login = asyncio.ensure_future(self._startup())
            done, _ = await asyncio.wait({self._login}, timeout=config.login_timeout)
            if not done:
                self._login.cancel()
                await asyncio.wait({self._login})
            if self.dropped:  # its slot went to a newcomer
                log.debug("connection from %s: its login slot went to a newcomer", self.host)
                if not self._login.cancelled():
                    self._login.exception()  # retrieved: ConnectionClosed, or the step's end
                if self._failure is not None:  # the answer it was held for, now
                    await self._fatal("28P01", self._failure)
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
        try:
            self.writer.write(m.error_response(code, message, severity="FATAL"))
            await asyncio.wait_for(self.writer.drain(), 2)
        except (ConnectionError, asyncio.TimeoutError, ssl.SSLError, OSError, RuntimeError):
            pass

    def cancel(self) -> None:
        """A CancelRequest for this connection arrived: stop the running statement."""
        self._cancel.set()

    def heard(self) -> bool:
        """Whether bytes from the client wait to be read (the server is behind, not the client)."""
        return bool(getattr(self.reader, "_buffer", b""))  # StreamReader has no public look

    def drop(self) -> None:
        """Its login slot went to a newcomer: stop logging in (serve() says why and closes).

        One waiting for its client is closed only when its login would have timed
        out, whatever it sends meanwhile: a client that re-opens each closed socket at
        once cannot turn one drop into a chain of them, and each of its sockets made to
        make room is out of its hands that long. (At most ``server.max_lingering`` wait
        so, so that they cannot take all the file descriptors either.)
        """
        server = self.server
        self.dropped = True
        if self._awaiting_client and server.lingering < server.max_lingering:
            server.lingering += 1
            self._lingers = True
        elif self._login is not None:
            self._login.cancel()

    # -- startup and login -------------------------------------------------------------------
    async def _startup(self) -> tuple[str, dict[str, str]] | None:
        """Startup packet and SCRAM login: the user and the client's parameters, or None."""
        tls = False
        while True:
            packet = m.decode_startup(await self._step(m.read_startup(self.reader)))
            if packet.kind == "ssl":
                context = self.server.tls_context
                if context is not None and not tls:
                    self.writer.write(b"S")
                    await self.writer.drain()
                    await self._step(self.writer.start_tls(context))  # type: ignore[attr-defined]
                    tls = True
                else:
                    self.writer.write(b"N")
                    await self.writer.drain()
                continue
            if packet.kind == "gss":
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            if packet.kind == "cancel":
                self.server.cancel(packet.pid, packet.key)
                return None
            break
        if self.server.tls_context is not None and not tls and \
                not self.server.config.allow_plaintext:
            await self._fatal("28000", "this server accepts TLS connections only; connect with "
                              "sslmode=require")
            return None
        params = dict(packet.params)
        unrecognized = [name for name in params if name.startswith("_pq_.")]
        if packet.version & 0xFFFF or unrecognized:
            self.writer.write(m.negotiate_protocol_version(0, unrecognized))
        user = params.get("user", "")
        if not user:
            await self._fatal("28000", "no PostgreSQL user name specified in startup packet")
            return None
        if "replication" in params and params["replication"].lower() not in ("false", "0",
                                                                             "off", "no"):
            await self._fatal("28000", "replication connections are not supported")
            return None
        if not await self._authenticate(user):
            return None
        return user, params

    async def _step(self, awaitable: Awaitable[T]) -> T:
        """Wait for the client's next login message (or TLS handshake), a step timeout at most.

        Meanwhile the connection waits for its client: a newcomer may take its slot.
        """
        logins = self.server.logins
        logins.mark(self.pid, logins.CLIENT)
        self._awaiting_client = True
        try:
            result = await asyncio.wait_for(awaitable, self.server.config.login_step_timeout)
        finally:
            self._awaiting_client = False
            if self._lingers:
                await self._linger()
        if self.dropped:
            raise ConnectionClosed("its login slot went to a newcomer")
        logins.mark(self.pid, logins.SERVER)
        return result

    async def _linger(self) -> None:
        """Dropped: stay open until the login timer ends it, unless the client has left."""
        try:
            if not self.reader.at_eof():
                await asyncio.Event().wait()  # serve()'s login timer cancels it
        finally:
            self._lingers = False
            self.server.lingering -= 1

    async def _authenticate(self, user: str) -> bool:
        """SCRAM-SHA-256 for ``user``: every proof is checked, a right one always gets in.

        Failures never refuse a login: a wrong proof is answered late (the pair's
        and the address's :meth:`~dpsql.server.logins.LoginBackoff.delay`), and a
        proof waits for its turn (:class:`~dpsql.server.logins.GuessGate`) at most
        ``server.login_wait`` seconds. Once the salt is sent, an exchange that ends
        without a proof checked (the client left, stalled or broke the protocol)
        counts and is logged as a failure too, though it spends no turn (it guessed
        nothing, and must not slow the name's owner).
        """
        server = self.server
        verifier, genuine = await self._run(passwords.login_verifier, server.store, user,
                                            server.secret)
        exchange = passwords.ScramExchange(verifier, genuine=genuine)
        self.writer.write(m.auth_sasl([passwords.MECHANISM]))
        await self.writer.drain()
        salted = checked = False
        try:
            kind, payload = await self._step(m.read_message(self.reader, AUTH_MESSAGE_LIMIT))
            if kind != b"p":
                raise m.ProtocolViolation("expected a SASL response")
            mechanism, first = m.decode_sasl_initial(payload)
            if mechanism != passwords.MECHANISM:
                raise m.ProtocolViolation("client selected an invalid SASL authentication "
                                          "mechanism")
            self.writer.write(m.auth_sasl_continue(exchange.first(first)))
            salted = True
            await self.writer.drain()
            kind, payload = await self._step(m.read_message(self.reader, AUTH_MESSAGE_LIMIT))
            if kind != b"p":
                raise m.ProtocolViolation("expected a SASL response")
            await self._turn(user)
            checked = True
            final = exchange.final(payload)
        except passwords.AuthFailed:
            self._count_failure(user, "failed")
            if checked:  # a guess: it spends one of the name's turns
                server.gate.spend(user)
            await self._hold_failure(user)
            return False
        except BaseException:
            if salted and not self.dropped:
                self._count_failure(user, "abandoned")
            raise
        server.backoff.succeeded(user, self.host)
        self.writer.write(m.auth_sasl_final(final) + m.auth_ok())
        return True

    async def _turn(self, user: str) -> None:
        """Wait until a proof of ``user`` may be checked, ``login_wait`` seconds at most.

        It waits out of the login slots, among at most ``max_waiting_turn`` others:
        past that, it or another is turned away unchecked (only a flood of guesses
        fills them; see :meth:`~dpsql.server.server.Server.wait_turn`).
        """
        server, loop = self.server, asyncio.get_running_loop()
        if server.gate.turn(user) <= 0:
            return
        if not server.wait_turn(self):
            self.dropped = True  # serve() says so
            raise ConnectionClosed("too many proofs wait for their turn")
        try:
            deadline = loop.time() + server.login_wait
            while (wait := server.gate.turn(user)) > 0 and loop.time() < deadline:
                await asyncio.sleep(min(wait, deadline - loop.time()))
        finally:
            server.turn_done(self)

    def _count_failure(self, user: str, how: str) -> None:
        """Count a failed (or abandoned) exchange of ``user``: same count, known name or not."""
        self.server.backoff.failed(user, self.host)
        log.warning("%s login for user %r from %s", how, user, self.host)

    async def _hold_failure(self, user: str) -> None:
        """Answer a wrong proof, after the delay its name and address have earned.

        The slot stays taken meanwhile, first in line for a newcomer (which then
        gets this answer sent at once): a held answer never keeps anyone out.
        """
        server = self.server
        self._failure = f'password authentication failed for user "{user}"'
        server.logins.mark(self.pid, server.logins.HELD)
        await asyncio.sleep(max(server.config.failed_login_delay,
                                server.backoff.delay(user, self.host)))
        server.logins.release(self.pid)  # nothing left to do for this login but say so
        await self._fatal("28P01", self._failure)

    async def _open_session(self, user: str, params: dict[str, str]) -> bool:
        server = self.server
        if not server.log_in(self, user):
            await self._fatal("53300", "sorry, too many clients already")
            return False
        policy = await self._run(server.store.services.policies.active)
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
        if outcome.deallocate == "ALL":
            self.statements.clear()
            self.portals.clear()
        elif outcome.deallocate:
            self.statements.pop(outcome.deallocate, None)

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
                outcome, rows = await self._statement(self._answer, statement, _text_formats)
            except StatementError as err:
                self._error(err)
                break
            if outcome.copy is not None:
                await self._write_copy(outcome, rows)
            elif outcome.table is not None:
                self.writer.write(m.row_description(row_fields(outcome.table.schema,
                                                               _text_formats)))
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
        parse = m.decode_parse(payload)
        try:
            pieces = split_statements(parse.query)
        except SQLTextError as err:
            raise StatementError("42601", str(err)) from err
        if len(pieces) > 1:
            raise StatementError("42601", "cannot insert multiple commands into a prepared "
                                 "statement")
        if parse.name and parse.name in self.statements:
            raise StatementError("42P05", f'prepared statement "{parse.name}" already exists')
        count = max(len(parse.param_types), max_parameter(parse.query))
        self.statements[parse.name] = Prepared(parse.query, parse.param_types, count)
        self.writer.write(m.parse_complete())

    def _statement_named(self, name: str) -> Prepared:
        try:
            return self.statements[name]
        except KeyError:
            raise StatementError("26000", f'prepared statement "{name}" does not exist') \
                from None

    def _param_type(self, statement: Prepared, index: int) -> int:
        return statement.param_types[index] if index < len(statement.param_types) else 0

    async def _bind(self, payload: bytes) -> None:
        bind = m.decode_bind(payload)
        statement = self._statement_named(bind.statement)
        if len(bind.params) != statement.param_count:
            raise StatementError("08P01", f"bind message supplies {len(bind.params)} "
                                 f"parameters, but prepared statement \"{bind.statement}\" "
                                 f"requires {statement.param_count}")
        if bind.portal and bind.portal in self.portals:
            raise StatementError("42P03", f'cursor "{bind.portal}" already exists')

        def literal(n: int) -> str:
            if n < 1 or n > len(bind.params):
                raise StatementError("42P02", f"there is no parameter ${n}")
            return parameter_literal(bind.params[n - 1], self._param_type(statement, n - 1),
                                     bind.param_format(n - 1) == 1)

        try:
            text = bind_parameters(statement.text, literal)
        except BadParameter as err:
            raise StatementError("22P02", str(err)) from err
        portal = Portal(text, bind.result_format, statement=statement)
        if statement.cached is not None and not bind.params:
            portal.outcome, statement.cached = statement.cached, None
        self.portals[bind.portal] = portal
        self.writer.write(m.bind_complete())

    async def _describe(self, payload: bytes) -> None:
        assert self.router is not None
        which, name = m.decode_target(payload)
        if which == "S":
            statement = self._statement_named(name)
            oids = [self._param_type(statement, i) or 25 for i in range(statement.param_count)]
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
            self.writer.write(m.row_description(row_fields(schema, _text_formats))
                              if schema is not None and len(schema) else m.no_data())
            return
        cursor = self.router.cursors.get(name)
        if name not in self.portals and cursor is not None:  # DECLAREd: SQL cursors are portals
            self.writer.write(m.row_description(row_fields(cursor.table.schema, _text_formats)))
            return
        portal = await self._portal_outcome(name)
        outcome = portal.outcome
        table = outcome.table if outcome is not None and outcome.copy is None else None
        self.writer.write(m.row_description(row_fields(table.schema, portal.result_formats))
                          if table is not None else m.no_data())

    async def _portal_outcome(self, name: str) -> Portal:
        assert self.router is not None
        portal = self.portals.get(name)
        if portal is None:
            raise StatementError("34000", f'portal "{name}" does not exist')
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
        which, name = m.decode_target(payload)
        if which == "S":
            statement = self.statements.pop(name, None)
            for key in [k for k, p in self.portals.items() if p.statement is statement]:
                del self.portals[key]
        else:
            self.portals.pop(name, None)
        self.writer.write(m.close_complete())

    async def _sync(self, payload: bytes) -> None:
        assert self.router is not None
        self.skip_until_sync = False
        if self.router.txn == "I":
            self.portals.clear()
        self.writer.write(m.ready_for_query(self.router.txn))
        await self.writer.drain()

    async def _flush(self, payload: bytes) -> None:
        await self.writer.drain()
