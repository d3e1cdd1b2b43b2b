"""Passwords: SCRAM-SHA-256 verifiers (RFC 5802, RFC 7677), their exchange, and the store's.

Verifiers are stored as PostgreSQL does,
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, so the server
never holds a password. An unknown user goes through the same exchange as a
known one with a mock salt derived from a secret kept in the store (the same
salt on every attempt, across restarts) and the iteration count most stored
verifiers use, so a client cannot tell an unknown user from a wrong password
by the messages, their order or their number. Channel binding
(SCRAM-SHA-256-PLUS) is not offered. The wire server runs the exchange; the
login limits around it are :mod:`dpsql.server.logins`'s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from collections import Counter
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
    from dpsql.credentials import CREDENTIALS
    from dpsql.policies import active_policy

    rows = store[CREDENTIALS].rows()
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
