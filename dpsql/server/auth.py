"""SCRAM-SHA-256 authentication (RFC 5802, RFC 7677), credentials in the store, login limits.

Verifiers are stored as PostgreSQL does,
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, so the server
never holds a password. An unknown user goes through the same exchange as a
known one with a mock salt derived from a server secret (the same salt on
every attempt), so a client cannot tell an unknown user from a wrong
password by the messages, their order or their number. Channel binding
(SCRAM-SHA-256-PLUS) is not offered.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import time
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpsql.errors import ConfigurationError

if TYPE_CHECKING:  # the store (DuckDB) loads with the first command that needs it
    import duckdb

    from dpsql.store import Store

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's default scram_iterations
SALT_BYTES = 16
MIN_PASSWORD = 8


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def saslprep(password: str) -> str:
    """SASLprep (RFC 4013) of a password; like PostgreSQL, the raw text when it fails."""
    mapped = "".join("" if stringprep.in_table_b1(c) else
                     " " if stringprep.in_table_c12(c) else c for c in password)
    text = unicodedata.normalize("NFKC", mapped)
    if not text:
        return password
    prohibited = (stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
                  stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6,
                  stringprep.in_table_c7, stringprep.in_table_c8, stringprep.in_table_c9)
    if any(check(c) for c in text for check in prohibited):
        return password
    bidi = any(stringprep.in_table_d1(c) for c in text)
    if bidi and (not (stringprep.in_table_d1(text[0]) and stringprep.in_table_d1(text[-1]))
                 or any(stringprep.in_table_d2(c) for c in text)):
        return password
    return text


@dataclass(frozen=True)
class Verifier:
    """What the server keeps for one password."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(cls, password: str, *, iterations: int = DEFAULT_ITERATIONS,
             salt: bytes | None = None) -> Verifier:
        """The verifier of ``password`` (a fresh random salt unless one is given)."""
        salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
        salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode("utf-8"), salt,
                                     iterations)
        client_key = _hmac(salted, b"Client Key")
        return cls(iterations, salt, hashlib.sha256(client_key).digest(),
                   _hmac(salted, b"Server Key"))

    def encode(self) -> str:
        """The stored form, as PostgreSQL writes it in pg_authid.rolpassword."""
        return (f"{MECHANISM}${self.iterations}:{_b64(self.salt)}$"
                f"{_b64(self.stored_key)}:{_b64(self.server_key)}")

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """Read the stored form back."""
        try:
            mechanism, params, keys = text.split("$")
            iterations, salt = params.split(":")
            stored, server = keys.split(":")
            if mechanism != MECHANISM:
                raise ValueError(mechanism)
            return cls(int(iterations), _unb64(salt), _unb64(stored), _unb64(server))
        except ValueError as err:
            raise ConfigurationError("a stored credential is not a SCRAM-SHA-256 verifier; "
                                     "reset it with: dpsql user add NAME") from err

    def check(self, password: str) -> bool:
        """Whether ``password`` matches (the console's logins; SQL logins use SCRAM)."""
        other = Verifier.make(password, iterations=self.iterations, salt=self.salt)
        return hmac.compare_digest(other.stored_key, self.stored_key)


class AuthFailed(Exception):
    """The exchange failed; the server answers with one message whatever the reason."""


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthFailed("malformed SCRAM attribute")
        out.setdefault(part[0], part[2:])
    return out


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange (two round trips)."""

    def __init__(self, verifier: Verifier, *, genuine: bool) -> None:
        self.verifier = verifier
        self.genuine = genuine  # False for mock verifiers (unknown users): always fails
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def first(self, client_first: bytes) -> bytes:
        """Answer client-first-message with server-first-message."""
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError as err:
            raise AuthFailed("client-first-message is not UTF-8") from err
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y") or parts[1]:
            # "p=..." asks for channel binding, which is not offered.
            raise AuthFailed("unsupported GS2 header")
        self._gs2 = parts[0] + ",,"
        self._client_first_bare = parts[2]
        attrs = _attributes(self._client_first_bare)
        client_nonce = attrs.get("r", "")
        if not client_nonce or "m" in attrs:
            raise AuthFailed("client nonce missing")
        self._nonce = client_nonce + _b64(secrets.token_bytes(18))
        self._server_first = (f"r={self._nonce},s={_b64(self.verifier.salt)},"
                              f"i={self.verifier.iterations}")
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """Check the client proof; return server-final-message or raise AuthFailed."""
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError as err:
            raise AuthFailed("client-final-message is not UTF-8") from err
        without_proof, sep, proof_attr = text.rpartition(",p=")
        if not sep:
            raise AuthFailed("proof missing")
        attrs = _attributes(without_proof)
        if attrs.get("c") != _b64(self._gs2.encode("ascii")) or attrs.get("r") != self._nonce:
            raise AuthFailed("channel binding or nonce mismatch")
        try:
            proof = _unb64(proof_attr)
        except ValueError as err:
            raise AuthFailed("proof is not base64") from err
        auth_message = ",".join([self._client_first_bare, self._server_first,
                                 without_proof]).encode("utf-8")
        signature = _hmac(self.verifier.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthFailed("proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        matches = hmac.compare_digest(hashlib.sha256(client_key).digest(),
                                      self.verifier.stored_key)
        if not (matches and self.genuine):
            raise AuthFailed("wrong password or unknown user")
        server_signature = _hmac(self.verifier.server_key, auth_message)
        return f"v={_b64(server_signature)}".encode("ascii")


def mock_verifier(user: str, secret: bytes) -> Verifier:
    """A verifier for a user that does not exist: a stable salt, keys nobody can match."""
    salt = _hmac(secret, b"salt:" + user.encode("utf-8"))[:SALT_BYTES]
    keys = _hmac(secret, b"keys:" + user.encode("utf-8"))
    return Verifier(DEFAULT_ITERATIONS, salt, keys, _hmac(keys, b"server"))


# -- credentials in the store ----------------------------------------------------------------


def check_password(password: str) -> None:
    """Refuse passwords too short to resist guessing."""
    if len(password) < MIN_PASSWORD:
        raise ConfigurationError(f"a password needs at least {MIN_PASSWORD} characters")


def set_password(store: Store, user: str, password: str, *,
                 iterations: int = DEFAULT_ITERATIONS) -> None:
    """Store a SCRAM verifier for ``user`` (who must be declared in the active policy)."""
    from dpsql.store import now

    if user not in store.active_policy().users:
        raise ConfigurationError(f"no user {user!r} in the store's policy; declare it under "
                                 "users: and run dpsql policy apply first")
    check_password(password)
    if iterations < DEFAULT_ITERATIONS:
        raise ConfigurationError(f"use at least {DEFAULT_ITERATIONS} iterations")
    verifier = Verifier.make(password, iterations=iterations).encode()
    with store.transaction() as cur:
        cur.execute("INSERT OR REPLACE INTO dpsql.credentials VALUES (?, ?, ?)",
                    [user, verifier, now()])
        _audit(store, user, "set", cur)


def remove_user(store: Store, user: str) -> bool:
    """Delete ``user``'s credential; returns whether there was one."""
    with store.transaction() as cur:
        row = cur.execute("SELECT count(*) FROM dpsql.credentials WHERE user_name = ?",
                          [user]).fetchone()
        cur.execute("DELETE FROM dpsql.credentials WHERE user_name = ?", [user])
        found = bool(row and row[0])
        if found:
            _audit(store, user, "removed", cur)
    return found


def _audit(store: Store, user: str, outcome: str, cur: duckdb.DuckDBPyConnection) -> None:
    """Audit a change of ``user``'s credential in the caller's transaction."""
    from dpsql.ledger import Ledger

    Ledger(store, store.active_policy()).record(user, None, None, outcome,
                                                action="credential", cursor=cur)


def list_users(store: Store) -> list[dict[str, object]]:
    """Users with a credential: name, role in the active policy (or None) and when set."""
    policy = store.active_policy()
    rows = store.cursor().execute("SELECT user_name, created_at FROM dpsql.credentials "
                                  "ORDER BY user_name").fetchall()
    return [{"user": r[0], "role": policy.users[r[0]].role if r[0] in policy.users else None,
             "created_at": r[1]} for r in rows]


def load_verifier(store: Store, user: str) -> Verifier | None:
    """The stored verifier of a user in the active policy, or None.

    The credentials table is read for every name, so that a known user and an
    unknown one take the same path (and about the same time).
    """
    row = store.cursor().execute("SELECT verifier FROM dpsql.credentials WHERE user_name = ?",
                                 [user]).fetchone()
    if row is None or user not in store.active_policy().users:
        return None
    return Verifier.parse(row[0])


# -- failed-login backoff -------------------------------------------------------------------


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    until: float = 0.0  # attempts are refused (a pair) or held (an address) before this time


class LoginBackoff:
    """Failed logins: refusals per (user name, client address), slower failures per address.

    After ``free`` failures in a row a pair is refused for ``base`` seconds,
    doubling with each further failure up to ``ceiling``; a success, or
    ``forget`` seconds without a failure, clears it. A name refused at one
    address still logs in from another, and other names from that address.
    Every name counts, known or not, so refusals tell nothing about which
    users exist.

    An address's failures over all names never refuse anyone: that would let
    made-up names lock every user of the address out. After ``free_per_host``
    of them, each further failure from it is answered only after :meth:`hold`
    seconds (``base``, doubling up to ``hold_ceiling``), while the server keeps
    that attempt's login slot: with the per-address cap on login slots this
    bounds how fast one address can guess, and a correct password is never
    held. Known and unknown names count alike here too: a count of unknown
    names only would change the hold, and so tell, when a name does not exist.

    At most ``capacity`` pairs and addresses are kept, the least recently
    failed dropped first, so a flood of names cannot exhaust memory. Not
    thread-safe (the wire server uses it from its event loop; the console
    under a lock).
    """

    def __init__(self, *, free: int = 5, free_per_host: int = 50, base: float = 1.0,
                 ceiling: float = 300.0, hold_ceiling: float = 5.0, forget: float = 900.0,
                 capacity: int = 10_000, clock: Callable[[], float] | None = None) -> None:
        self.free = free
        self.free_per_host = free_per_host
        self.base = base
        self.ceiling = ceiling
        self.hold_ceiling = hold_ceiling
        self.forget = forget
        self.capacity = capacity
        self._clock = clock or time.monotonic
        self._failures: OrderedDict[tuple[str | None, str], _Failures] = OrderedDict()

    def _current(self, key: tuple[str | None, str]) -> _Failures | None:
        entry = self._failures.get(key)
        if entry is not None and self._clock() - entry.last > self.forget:
            del self._failures[key]
            return None
        return entry

    def wait(self, user: str, host: str) -> float:
        """Seconds before ``user`` may try again from ``host`` (0: now): its own failures only."""
        entry = self._current((user, host))
        return max(0.0, entry.until - self._clock()) if entry is not None else 0.0

    def hold(self, host: str) -> float:
        """Seconds to hold the answer to a failed login from ``host`` (0: none)."""
        entry = self._current((None, host))
        return max(0.0, entry.until - self._clock()) if entry is not None else 0.0

    def failed(self, user: str, host: str) -> None:
        """Record a failed login (call it before :meth:`hold`, which then counts it).

        The pair's refusal starts when the held answer is given, not before.
        """
        now = self._clock()
        address = self._count((None, host), now, now, self.free_per_host, self.hold_ceiling)
        self._count((user, host), now, max(now, address.until), self.free, self.ceiling)
        while len(self._failures) > self.capacity:
            self._failures.popitem(last=False)

    def _count(self, key: tuple[str | None, str], now: float, start: float, free: int,
               ceiling: float) -> _Failures:
        """Count a failure of ``key``; past ``free`` of them, it waits from ``start`` on."""
        entry = self._current(key) or _Failures()
        entry.count += 1
        entry.last = now
        if entry.count >= free:
            entry.until = start + min(ceiling, self.base * 2.0 ** min(entry.count - free, 64))
        self._failures[key] = entry
        self._failures.move_to_end(key)
        return entry

    def succeeded(self, user: str, host: str) -> None:
        """A login succeeded: forget the pair's failures (the address's stay)."""
        self._failures.pop((user, host), None)


# -- login slots -----------------------------------------------------------------------------


class LoginSlots:
    """Slots of the connections still logging in: ``total``, and ``per_address`` for one address.

    A connection holds one from accept until it has logged in or closed. Without
    the cap per address, one stranger's idle sockets (re-opened at every login
    timeout) would hold them all and keep every login out; with it, an address
    can only crowd out its own logins. Used from the event loop only.
    """

    TOTAL = "total"  # why a slot was refused: all of them are taken
    ADDRESS = "address"  # the address holds its share

    def __init__(self, total: int, per_address: int) -> None:
        self.total = total
        self.per_address = per_address
        self._hosts: dict[int, str] = {}  # pid -> client address
        self._per_host: Counter[str] = Counter()

    def take(self, pid: int, host: str) -> str | None:
        """Give connection ``pid`` from ``host`` a slot; None, or why not (TOTAL, ADDRESS)."""
        if len(self._hosts) >= self.total:
            return self.TOTAL
        if self._per_host[host] >= self.per_address:
            return self.ADDRESS
        self._hosts[pid] = host
        self._per_host[host] += 1
        return None

    def release(self, pid: int) -> None:
        """Free ``pid``'s slot (logged in or closed); nothing if it holds none."""
        host = self._hosts.pop(pid, None)
        if host is not None:
            self._per_host[host] -= 1
            if not self._per_host[host]:
                del self._per_host[host]

    def held(self, host: str | None = None) -> int:
        """Slots held now, in all or by ``host``."""
        return len(self._hosts) if host is None else self._per_host[host]
