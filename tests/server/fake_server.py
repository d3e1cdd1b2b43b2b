"""A dpsql server whose statement handler is a tiny fake, to test the protocol layers alone.

Run as a script: ``python fake_server.py STORE``. Statements the router sends to the
session get a fixed behaviour chosen by keywords in their text (see ``answer``):
errors of each class, slow statements, statements blocked until another connection
unblocks them, typed results, echoes of bound parameters.
Catalog queries, client parameters and transactions are the real router's.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from dpsql import errors
from dpsql.server import Server, ServerConfig, run


@dataclass(frozen=True)
class FakeAnswer:
    table: pa.Table
    status: str
    notice: str | None = None
    warning: str | None = None


ERRORS = {cls.__name__.lower(): cls for cls in (
    errors.QueryRejected, errors.BudgetExceeded, errors.AccessDenied, errors.ReleaseError,
    errors.ConfigurationError, errors.PolicyError, errors.StoreError, errors.InternalError)}


def typed_table() -> pa.Table:
    return pa.table({
        "i16": pa.array([1, None], pa.int16()), "i32": pa.array([-2, 3], pa.int32()),
        "i64": pa.array([2**40, 0], pa.int64()), "f32": pa.array([0.1, None], pa.float32()),
        "f64": pa.array([0.1, -1e300], pa.float64()),
        "dec": pa.array([Decimal("12.340"), Decimal("-0.5")], pa.decimal128(10, 3)),
        "txt": pa.array(["héllo 'q'", None]), "flag": pa.array([True, False]),
        "day": pa.array([dt.date(2024, 2, 29), dt.date(1999, 12, 31)]),
        "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6), None], pa.timestamp("us")),
        "tstz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), None],
                         pa.timestamp("us", tz="UTC")),
        "raw": pa.array([b"\x00\xff", None], pa.binary()),
        "ints": pa.array([[1, 2, None], []], pa.list_(pa.int64())),
        "words": pa.array([["a b", 'q"'], None], pa.list_(pa.string())),
    })


#: ``block NAME`` waits until a statement ``unblock NAME`` (from another connection), or
#: this many seconds: only a guard against a test that fails before it unblocks.
BLOCK_GUARD_S = 120
_gates: dict[str, threading.Event] = {}
_gates_lock = threading.Lock()


def _gate(low: str, word: str) -> threading.Event:
    with _gates_lock:
        return _gates.setdefault(low.split(word)[1].split()[0], threading.Event())


def answer(text: str) -> FakeAnswer:
    low = text.lower()
    for name, cls in ERRORS.items():
        if f"raise {name}" in low:
            raise cls(f"fake {name} for the test; do something else")
    if "internal boom" in low:
        raise RuntimeError("private value 4242 must not reach the client")
    if "sleep" in low:
        time.sleep(float(low.split("sleep")[1].split()[0]))
    if "unblock" in low:
        _gate(low, "unblock").set()
    elif "block" in low:
        _gate(low, "block").wait(BLOCK_GUARD_S)
    if low.startswith("set dpsql."):
        return FakeAnswer(pa.table({}), "SET")
    if "echo" in low:
        return FakeAnswer(pa.table({"statement": [text]}), "SELECT 1")
    if "types" in low:
        return FakeAnswer(typed_table(), "SELECT 2")
    if "rows" in low:
        count = int(low.split("rows")[1].split()[0])
        return FakeAnswer(pa.table({"n": list(range(count))}), f"SELECT {count}")
    return FakeAnswer(pa.table({"n": pa.array([1], pa.int64())}), "SELECT 1",
                      "cost epsilon=0.1; remaining epsilon=0.9")


def main() -> None:
    db = Path(sys.argv[1])
    extra = dict(arg.split("=", 1) for arg in sys.argv[2:])

    def ready(server: Server) -> None:
        print(f"dpsql serve: listening on 127.0.0.1:{server.port}", file=sys.stderr, flush=True)

    config = ServerConfig(db=db, port=0, failed_login_delay=0.05,
                          statement_timeout=float(extra.get("timeout", 300)),
                          max_message=int(extra.get("max_message", 1 << 20)),
                          max_clients=int(extra.get("max_clients", 200)),
                          max_pending_logins=int(extra.get("max_pending_logins", 64)),
                          login_timeout=float(extra.get("login_timeout", 10)),
                          tls_cert=Path(extra["cert"]) if "cert" in extra else None,
                          tls_key=Path(extra["key"]) if "key" in extra else None)
    run(config, ready=ready, handler_factory=lambda session: answer)


if __name__ == "__main__":
    main()
