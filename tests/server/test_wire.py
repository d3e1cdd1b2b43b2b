"""The protocol as drivers use it (psycopg, libpq) and as they never should (raw frames).

The server here is real -- protocol, SCRAM, router, catalog -- with a fake statement
handler (fake_server.py) so these tests exercise the wire layer alone.
"""

from __future__ import annotations

import datetime as dt
import struct
import time
import uuid
from decimal import Decimal

import psycopg
import pytest

from . import rawclient as raw
from .conftest import PASSWORDS, cancelling

CLASS_SQLSTATES = {"queryrejected": "42000", "budgetexceeded": "53400",
                   "accessdenied": "42501", "releaseerror": "55000",
                   "configurationerror": "22023", "policyerror": "F0000",
                   "storeerror": "55006", "internalerror": "XX000"}


@pytest.fixture
def conn(fake_server):
    with psycopg.connect(fake_server.dsn("alice"), autocommit=True) as connection:
        yield connection


def test_extended_protocol_binds_parameters_as_literals(conn):
    row = conn.execute("SELECT echo %s, %s, %s, %s, %s FROM adult",
                       ["it's", 42, -1.5, None, True]).fetchone()
    assert row == ("SELECT echo 'it''s', 42, (-1.5), NULL, TRUE FROM adult",)
    row = conn.execute("SELECT echo %b, %b FROM adult", [7, "x"]).fetchone()
    assert row == ("SELECT echo 7, 'x' FROM adult",)


def test_simple_protocol(conn):
    conn.pgconn.exec_(b"SET application_name = 'simple'")
    result = conn.pgconn.exec_(b"SELECT echo 1 FROM adult; SELECT rows 3 FROM adult")
    assert result.ntuples == 3
    assert result.get_value(2, 0) == b"2"
    with psycopg.ClientCursor(conn) as cur:
        cur.execute("SELECT echo %s FROM adult", ["client-side"])
        assert cur.fetchone() == ("SELECT echo 'client-side' FROM adult",)


def test_result_types_reach_python_as_their_types(conn):
    rows = conn.execute("SELECT types FROM adult").fetchall()
    first = dict(zip([d.name for d in conn.cursor().execute("SELECT types FROM adult").description],
                     rows[0], strict=True))
    assert first["i16"] == 1
    assert first["i64"] == 2**40
    assert first["f64"] == 0.1
    assert first["f32"] == pytest.approx(0.1)
    assert first["dec"] == Decimal("12.340")
    assert first["txt"] == "héllo 'q'"
    assert first["flag"] is True
    assert first["day"] == dt.date(2024, 2, 29)
    assert first["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 6)
    assert first["tstz"] == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert first["raw"] == b"\x00\xff"
    assert first["ints"] == [1, 2, None]
    assert first["words"] == ["a b", 'q"']
    assert rows[1][0] is None
    assert rows[1][12] == []


def test_binary_results(conn):
    with conn.cursor(binary=True) as cur:
        text_rows = conn.execute("SELECT types FROM adult").fetchall()
        binary_rows = cur.execute("SELECT types FROM adult").fetchall()
    # float4 in binary is the exact float32 (as from PostgreSQL); everything else is equal.
    assert binary_rows[0][3] == pytest.approx(text_rows[0][3], rel=1e-7)
    assert [r[:3] + r[4:] for r in binary_rows] == [r[:3] + r[4:] for r in text_rows]


def test_session_time_zone_applies_to_timestamptz(conn):
    conn.execute("SET TimeZone = 'Asia/Kolkata'")
    value = conn.execute("SELECT types FROM adult").fetchone()[10]
    assert value.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert value == dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(("name", "sqlstate"), sorted(CLASS_SQLSTATES.items()))
def test_each_error_class_has_its_sqlstate(conn, name, sqlstate):
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(f"SELECT raise {name} FROM adult")
    assert caught.value.sqlstate == sqlstate
    assert f"fake {name}" in caught.value.diag.message_primary
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on


def test_internal_errors_hide_their_cause(conn, fake_server):
    with pytest.raises(psycopg.errors.InternalError_) as caught:
        conn.execute("SELECT internal boom FROM adult")
    message = caught.value.diag.message_primary or ""
    assert "4242" not in message
    assert "reference" in message
    reference = message.split("reference ")[1].split(")")[0]
    time.sleep(0.2)
    assert any(reference in line for line in fake_server.lines)


def test_notice_follows_each_answer(conn):
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    conn.execute("SELECT count(*) FROM adult")
    assert notices == ["cost epsilon=0.1; remaining epsilon=0.9"]


def test_transactions_behave_for_drivers(fake_server):
    with psycopg.connect(fake_server.dsn("alice")) as conn:  # not autocommit: BEGIN first
        conn.execute("SELECT 1")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            conn.execute("SELECT raise budgetexceeded FROM adult")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.rollback()
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.commit()


def test_client_parameters_are_reported(conn):
    conn.execute("SET application_name = 'notebook'")
    assert conn.info.parameter_status("application_name") == "notebook"
    assert conn.execute("SHOW application_name").fetchone() == ("notebook",)
    assert conn.info.parameter_status("server_version") == "15.0"
    assert conn.execute("SET dpsql.epsilon = 0.5").statusmessage == "SET"


def _unblock(server, name: str) -> None:
    with psycopg.connect(server.dsn("carol"), autocommit=True) as other:
        other.execute(f"SELECT unblock {name} FROM adult")


@pytest.mark.timeout(300)  # the blocked statements end when unblocked: a hang guard
def test_statement_timeout_and_cancel(conn, fake_server):
    assert conn.execute("SHOW statement_timeout").fetchone() == ("300000",)  # the server's
    conn.execute("SET statement_timeout = '300ms'")
    assert conn.execute("SHOW statement_timeout").fetchone() == ("300",)
    name = f"t{uuid.uuid4().hex}"
    # The statement runs until unblocked below: the error comes while it still runs.
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        conn.execute(f"SELECT block {name} FROM adult")
    _unblock(fake_server, name)
    with pytest.raises(psycopg.errors.QueryCanceled):  # a catalog query is interrupted too
        conn.execute("SELECT count(*) FROM generate_series(1, 1000000000000000000)")
    conn.execute("SET statement_timeout = 0")  # after the endless catalog query: stopped
    name = f"c{uuid.uuid4().hex}"
    with cancelling(conn), pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
        conn.execute(f"SELECT block {name} FROM adult")
    _unblock(fake_server, name)
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_large_results_and_prepared_statements(conn):
    assert len(conn.execute("SELECT rows 20000 FROM adult").fetchall()) == 20000
    for _ in range(7):  # psycopg prepares a statement after 5 executions
        assert conn.execute("SELECT echo %s FROM adult", [5]).fetchone() == (
            "SELECT echo 5 FROM adult",)
    conn.execute("DEALLOCATE ALL")
    assert conn.execute("SELECT echo %s FROM adult", [6]).fetchone() == (
        "SELECT echo 6 FROM adult",)


def _login(fake_server, user: str = "alice") -> raw.RawClient:
    client = raw.RawClient(fake_server.port)
    assert client.login(user, PASSWORDS[user])[-1].kind == b"Z"
    return client


def test_portal_suspension(fake_server):
    client = _login(fake_server)
    client.send(raw.parse("SELECT rows 5 FROM adult") + raw.bind() + raw.describe("P")
                + raw.execute(max_rows=2) + raw.execute(max_rows=2) + raw.execute(max_rows=2)
                + raw.SYNC)
    kinds = [m.kind for m in client.read_until()]
    assert kinds == [b"1", b"2", b"T", b"D", b"D", b"s", b"D", b"D", b"s", b"D", b"C", b"Z"]
    client.close()


def test_describe_statement_and_errors_skip_to_sync(fake_server):
    client = _login(fake_server)
    client.send(raw.parse("SELECT relname FROM pg_class WHERE oid = $1", "s", (26,))
                + raw.describe("S", "s") + raw.SYNC)
    kinds = [m.kind for m in client.read_until()]
    assert kinds == [b"1", b"t", b"T", b"Z"]
    client.send(raw.parse("SELECT raise accessdenied FROM adult") + raw.bind() + raw.execute()
                + raw.parse("SELECT 1") + raw.bind() + raw.execute() + raw.SYNC
                + raw.query("SELECT 2"))
    messages = client.read_until()
    assert [m.kind for m in messages] == [b"1", b"2", b"E", b"Z"]
    assert messages[2].fields()["C"] == "42501"
    assert [m.kind for m in client.read_until()] == [b"T", b"D", b"C", b"Z"]
    client.send(raw.parse("SELECT count(*) FROM adult WHERE age > $1") + raw.describe("S")
                + raw.SYNC)
    messages = client.read_until()
    assert messages[-2].kind == b"E"
    assert messages[-2].fields()["C"] == "0A000"
    client.close()


def test_oversized_message_closes_only_that_connection(fake_server):
    client = _login(fake_server)
    try:
        client.send(raw.query("SELECT '" + "x" * (2 << 20) + "'"))
        message = client.read()
    except (ConnectionResetError, BrokenPipeError):
        # The server may close before the client has sent 2 MB: the kernel then resets
        # the connection and the error frame can be lost in flight. Closed either way.
        message = None
    finally:
        closed = client.closed()
        client.close()
    if message is not None:
        assert message.kind == b"E"
        assert message.fields()["C"] == "54000"
    assert closed
    assert fake_server.alive()
    after = _login(fake_server)
    after.send(raw.query("SELECT 1"))
    assert [m.kind for m in after.read_until()] == [b"T", b"D", b"C", b"Z"]
    after.close()


def test_wrong_password_and_unknown_user_look_the_same(fake_server):
    def failure(user: str, password: str) -> tuple[str, str]:
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(fake_server.dsn(user, password))
        text = str(caught.value)
        return text.split("FATAL:")[1].strip().replace(user, "USER"), "28P01"

    assert failure("alice", "wrong-password") == failure("mallory", "wrong-password")
    raw_client = raw.RawClient(fake_server.port)
    raw_client.send(raw.startup_packet("mallory"))
    assert raw_client.read().kind == b"R"  # the SASL exchange starts as for a known user
    raw_client.close()


def test_per_user_connection_limit(fake_server):
    first = psycopg.connect(fake_server.dsn("dave"))
    second = psycopg.connect(fake_server.dsn("dave"))
    with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
        psycopg.connect(fake_server.dsn("dave"))
    second.close()
    time.sleep(0.2)
    third = psycopg.connect(fake_server.dsn("dave"))
    first.close()
    third.close()


def _login_from(server, source: str, user: str, password: str) -> raw.Message:
    with raw.RawClient(server.port, source=source) as client:
        return client.login(user, password)[-1]


def test_failures_never_refuse_a_right_password(fake_server):
    """Failures slow the guesser down (later answers) but never lock a user out: a
    stranger's wrong passwords for frank cannot refuse frank's right one (red team F5)."""
    for user in ("frank", "nobody"):  # a known and an unknown user, answered alike
        for _ in range(6):
            failure = _login_from(fake_server, "127.0.0.2", user, "not-the-password")
            assert failure.fields()["M"] == f'password authentication failed for user "{user}"'
    assert _login_from(fake_server, "127.0.0.2", "frank", PASSWORDS["frank"]).kind == b"Z"
    assert _login_from(fake_server, "127.0.0.1", "frank", PASSWORDS["frank"]).kind == b"Z"
    assert _login_from(fake_server, "127.0.0.2", "alice", PASSWORDS["alice"]).kind == b"Z"


def test_cancel_requests_need_the_secret_key(fake_server):
    client = _login(fake_server)
    intruder = raw.RawClient(fake_server.port)
    intruder.send(struct.pack("!iiii", 16, 80877102, 1, 2))
    assert intruder.closed()
    intruder.close()
    client.send(raw.query("SELECT 1"))
    assert [m.kind for m in client.read_until()] == [b"T", b"D", b"C", b"Z"]
    client.close()
