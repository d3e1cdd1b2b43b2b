"""SCRAM-SHA-256 authentication (RFC 5802, RFC 7677), credentials in the store, login limits.

Verifiers are stored as PostgreSQL does,
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, so the server
never holds a password. An unknown user goes through the same exchange as a
known one with a mock salt derived from a secret kept in the store (the same
salt on every attempt, across restarts) and the iteration count most stored
verifiers use, so a client cannot tell an unknown user from a wrong password
by the messages, their order or their number. Channel binding
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


def mock_verifier(user: str, secret: bytes, iterations: int = DEFAULT_ITERATIONS) -> Verifier:
    """A verifier for a user that does not exist: a stable salt, keys nobody can match."""
    salt = _hmac(secret, b"salt:" + user.encode("utf-8"))[:SALT_BYTES]
    keys = _hmac(secret, b"keys:" + user.encode("utf-8"))
    return Verifier(iterations, salt, keys, _hmac(keys, b"server"))


def login_secret(store: Store) -> bytes:
    """The key of the mock verifiers: derived from the store's secret, so the same at every start.

    A key drawn at each start would give a made-up name a new salt after a
    restart while a real user keeps theirs, and so tell them apart.
    """
    return _hmac(store.secret.encode("ascii"), b"dpsql: mock SCRAM verifiers")


# -- credentials in the store ----------------------------------------------------------------


def check_password(password: str) -> None:
    """Refuse passwords too short to resist guessing."""
    if len(password) < MIN_PASSWORD:
        raise ConfigurationError(f"a password needs at least {MIN_PASSWORD} characters")


def set_password(store: Store, user: str, password: str, *,
                 iterations: int = DEFAULT_ITERATIONS) -> None:
    """Store a SCRAM verifier for ``user`` (who must be declared in the active policy)."""
    from dpsql import credentials
    from dpsql.policies import active_policy

    if user not in active_policy(store).users:
        raise ConfigurationError(f"no user {user!r} in the store's policy; declare it under "
                                 "users: and run dpsql policy apply first")
    check_password(password)
    if iterations < DEFAULT_ITERATIONS:
        raise ConfigurationError(f"use at least {DEFAULT_ITERATIONS} iterations")
    credentials.save(store, user, Verifier.make(password, iterations=iterations).encode())


def remove_user(store: Store, user: str) -> bool:
    """Delete ``user``'s credential; returns whether there was one."""
    from dpsql import credentials

    return credentials.remove(store, user)


def list_users(store: Store) -> list[dict[str, object]]:
    """Users with a credential: name, role in the active policy (or None) and when set."""
    from dpsql import credentials
    from dpsql.policies import active_policy

    policy = active_policy(store)
    return [{"user": c.user, "role": policy.users[c.user].role if c.user in policy.users
             else None, "created_at": c.created_at} for c in credentials.listed(store)]


def load_verifier(store: Store, user: str) -> Verifier | None:
    """The stored verifier of a user in the active policy, or None.

    The credentials table and the policy are read for every name, so that a
    known user and an unknown one take the same path (and about the same time).
    """
    from dpsql import credentials
    from dpsql.policies import active_policy

    stored = credentials.verifier_of(store, user)
    declared = user in active_policy(store).users
    if stored is None or not declared:
        return None
    return Verifier.parse(stored)


def _iterations(text: str) -> int | None:
    """The iteration count of a stored verifier, or None when it has none."""
    try:
        return int(text.split("$")[1].split(":")[0])
    except (IndexError, ValueError):
        return None


def login_verifier(store: Store, user: str, secret: bytes) -> tuple[Verifier, bool]:
    """The verifier a SQL login of ``user`` runs against, and whether it is genuine.

    An unknown name (no credential, or not in the active policy) gets the mock
    verifier of :func:`mock_verifier` keyed by ``secret`` (:func:`login_secret`),
    with the iteration count most stored verifiers use (ties: the lowest), so it
    looks like a real user's. Every name takes the same steps: the whole
    credentials table walked (read from the store once per change), the policy,
    a mock verifier made and a verifier parsed.
    """
    from dpsql.policies import active_policy

    rows = store.services.credentials.rows()
    counts: Counter[int] = Counter()
    stored: str | None = None
    for name, text in rows:
        counts[_iterations(text) or 0] += 1
        stored = text if name == user else stored
    declared = user in active_policy(store).users
    counts.pop(0, None)
    iterations = min(counts, key=lambda i: (-counts[i], i)) if counts else DEFAULT_ITERATIONS
    mock = mock_verifier(user, secret, iterations)
    parsed = Verifier.parse(stored if stored is not None else mock.encode())
    genuine = stored is not None and declared
    return (parsed if genuine else mock), genuine


# -- failed-login backoff -------------------------------------------------------------------


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    until: float = 0.0  # a pair's refusal or held answer, an address's hold, ends then


class LoginBackoff:
    """Failed logins, counted per (user name, client address) and per address over all names.

    After ``free`` failures in a row a pair waits ``base`` seconds, doubling with
    each further failure up to ``ceiling``; a success, or ``forget`` seconds
    without a failure, clears it. After ``free_per_host`` failures of an
    address over all names, each further one waits :meth:`hold` seconds
    (``base``, doubling up to ``hold_ceiling``). Every name counts, known or not,
    so what follows a failure tells nothing about which users exist.

    The wire server never refuses a login for failures: it checks every proof,
    lets a right one in at once, and answers a wrong one only after
    :meth:`delay`, the longer of the pair's wait and the address's hold. The
    console refuses a pair while :meth:`wait` is above 0 (an address's failures
    refuse nobody there either).

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

    def delay(self, user: str, host: str) -> float:
        """Seconds to hold the answer to the failure of ``user`` from ``host`` just counted.

        The longer of the pair's wait and the address's hold, at most ``hold_ceiling``.
        """
        return min(self.hold_ceiling, max(self.wait(user, host), self.hold(host)))

    def failures(self, user: str | None, host: str) -> int:
        """Failures in a row of ``user`` from ``host`` (``user`` None: of the address)."""
        entry = self._current((user, host))
        return entry.count if entry is not None else 0

    def failed(self, user: str, host: str) -> None:
        """Record a failed login (call it before :meth:`hold`, which then counts it).

        The pair's wait starts when the held answer is given, not before.
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


# -- the pace of guesses -----------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    stamp: float  # when ``tokens`` was counted


class GuessGate:
    """When a proof of a name may be checked: at most so many failures of a name a second.

    Each name (known or not, over all addresses) holds ``per_name`` tokens,
    refilled at ``name_rate`` a second. A failed proof spends one (down to as
    far below zero as the bucket's size). A proof is checked when its name has
    one (:meth:`turn` is 0); until then it waits, but the server checks it
    anyway after a bounded wait, so a right password always gets in. A success
    spends nothing. At most ``capacity`` names are kept, the least recently
    spent dropped first (as if full again). Not thread-safe (the event loop's).
    """

    def __init__(self, *, per_name: int = 5, name_rate: float = 1.0, capacity: int = 10_000,
                 clock: Callable[[], float] | None = None) -> None:
        self.size = float(per_name)
        self.rate = name_rate
        self.capacity = capacity
        self._clock = clock or time.monotonic
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def _tokens(self, user: str, now: float) -> float:
        bucket = self._buckets.get(user)
        if bucket is None:
            return self.size
        return min(self.size, bucket.tokens + (now - bucket.stamp) * self.rate)

    def turn(self, user: str) -> float:
        """Seconds until a proof of ``user`` may be checked (0: now)."""
        tokens = self._tokens(user, self._clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def spend(self, user: str) -> None:
        """A proof of ``user`` was checked and failed."""
        now = self._clock()
        self._buckets[user] = _Bucket(max(-self.size, self._tokens(user, now) - 1), now)
        self._buckets.move_to_end(user)
        while len(self._buckets) > self.capacity:
            self._buckets.popitem(last=False)


# -- login slots -----------------------------------------------------------------------------


@dataclass
class _Slot:
    host: str
    state: str
    since: float  # when it entered ``state``
    order: int  # ties of ``since``: the later, the larger
    spoke: bool = False  # its client has sent a message


class LoginSlots:
    """The ``total`` slots of the connections still logging in, none kept for an idle one.

    A connection holds one from accept until it has logged in, closed or gone
    to wait for its turn (the server's :class:`GuessGate`), and is always in
    one state: waiting for its client's next message (CLIENT), its failure's
    answer held back (HELD), or the server working for it (SERVER). When all
    are taken, a newcomer gets the slot of a connection dropped to make room
    (:meth:`_rank`): one whose failure's answer is held (it is given at once),
    else one silent for more than ``grace`` seconds since it connected, else
    the one that has waited longest for its client (a client answers within a
    round trip; an idle socket only gets older). Only when every slot is the
    server's own work is a newcomer refused. There is no share per address:
    clients of 127.0.0.1 or behind one NAT share one, and a burst of them must
    all get in. Used from the event loop only.
    """

    CLIENT = "client"
    HELD = "held"
    SERVER = "server"

    def __init__(self, total: int, grace: float = 0.25,
                 clock: Callable[[], float] | None = None) -> None:
        self.total = total
        self.grace = grace
        self._clock = clock or time.monotonic
        self._slots: dict[int, _Slot] = {}  # pid -> its slot
        self._order = 0

    def take(self, pid: int, host: str,
             heard: Callable[[int], bool] | None = None) -> list[int] | None:
        """Give connection ``pid`` from ``host`` a slot (waiting for its client).

        Returns the pids dropped to make room (their slots are already free: drop
        those connections), or None when every slot is the server's work.
        ``heard(pid)`` tells whether a connection's next message has arrived and
        waits to be read: the server is behind, not the client, so it is kept.
        """
        dropped = []
        if len(self._slots) >= self.total:
            victim = self._victim(heard or (lambda pid: False))
            if victim is None:
                return None
            del self._slots[victim]
            dropped.append(victim)
        self._slots[pid] = _Slot(host, self.CLIENT, 0.0, 0)
        self.mark(pid, self.CLIENT)
        return dropped

    def mark(self, pid: int, state: str) -> None:
        """``pid`` enters ``state`` now (nothing if it holds no slot)."""
        slot = self._slots.get(pid)
        if slot is not None:
            self._order += 1
            slot.state, slot.since, slot.order = state, self._clock(), self._order
            slot.spoke = slot.spoke or state != self.CLIENT

    def _victim(self, heard: Callable[[int], bool]) -> int | None:
        """The connection to drop: the first of the lowest rank (see :meth:`_rank`), or None."""
        now = self._clock()
        ranked = [(rank, pid) for pid, slot in self._slots.items()
                  if (rank := self._rank(slot, now, heard(pid))) is not None]
        return min(ranked)[1] if ranked else None

    def _rank(self, slot: _Slot, now: float, heard: bool) -> tuple[int, float, int] | None:
        """Where ``slot`` stands in line to be dropped (lowest first; None: never).

        The held, oldest first; those silent since they connected, more than
        ``grace`` seconds ago, oldest first; the others waiting for their client,
        oldest first (a client just connected is the newest). A client whose
        message has come and waits to be read is the server's turn.
        """
        if slot.state == self.HELD:
            return (0, slot.since, slot.order)
        if slot.state == self.CLIENT and not heard:
            idle = not slot.spoke and now - slot.since > self.grace
            return (1 if idle else 2, slot.since, slot.order)
        return None

    def release(self, pid: int) -> None:
        """Free ``pid``'s slot (logged in or closed); nothing if it holds none."""
        self._slots.pop(pid, None)

    def held(self, host: str | None = None) -> int:
        """Slots held now, in all or by ``host``."""
        return sum(1 for slot in self._slots.values() if host is None or slot.host == host)

    def state(self, pid: int) -> str | None:
        """The state of ``pid``'s slot, or None when it holds none."""
        slot = self._slots.get(pid)
        return slot.state if slot is not None else None
