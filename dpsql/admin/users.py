"""SQL passwords of ``dpsql serve``'s users (``dpsql user add``, ``remove``, ``list``).

The store keeps a SCRAM-SHA-256 verifier, never the password. The password is an
argument: a front end asks for it on its own side (the CLI prompts), and never
takes it from a command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dpsql import passwords
from dpsql.admin import operation
from dpsql.session import Session


@dataclass(frozen=True)
class PasswordSet:
    """A user's password was set (or replaced); ``database`` is what clients name to connect."""

    user: str
    database: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"user": self.user, "set": True}


@operation("user.add")
def add_user(session: Session, *, name: str, password: str,
             iterations: int = passwords.DEFAULT_ITERATIONS) -> PasswordSet:
    """Set (or replace) the SQL password of ``name``, a user of the active policy (admins only)."""
    session.require_admin("set SQL passwords")
    passwords.set_password(session.store, name, password, iterations=iterations)
    return PasswordSet(name, session.store.path.stem)


@dataclass(frozen=True)
class PasswordRemoved:
    """Whether ``user`` had a password that is now gone."""

    user: str
    removed: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"user": self.user, "removed": self.removed}


@operation("user.remove")
def remove_user(session: Session, *, name: str) -> PasswordRemoved:
    """Remove ``name``'s SQL password: they can no longer connect (admins only)."""
    session.require_admin("remove SQL passwords")
    return PasswordRemoved(name, passwords.remove_user(session.store, name))


@dataclass(frozen=True)
class SqlUser:
    """A user with a password; ``role`` in the active policy (None: they cannot log in)."""

    user: str
    role: str | None
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"user": self.user, "role": self.role,
                "created_at": self.created_at.isoformat(timespec="seconds")}


@dataclass(frozen=True)
class SqlUsers:
    """The users who have a password, by name."""

    users: list[SqlUser]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"users": [u.as_dict() for u in self.users]}


@operation("user.list")
def list_users(session: Session) -> SqlUsers:
    """The users who have an SQL password, with their role in the active policy (admins only)."""
    session.require_admin("list SQL users")
    return SqlUsers([SqlUser(str(r["user"]), r["role"] if r["role"] is None else str(r["role"]),
                             r["created_at"])  # type: ignore[arg-type]
                     for r in passwords.list_users(session.store)])
