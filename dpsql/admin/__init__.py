"""Administrative operations: one typed function each, over an open :class:`~dpsql.Session`.

Every front door runs these and only renders and parses around them: the CLI
(locally, or through ``dpsql serve``'s admin socket when the server owns the
store), ``CALL dpsql('...')`` over SQL and the web console. Pipeline authors call
them the same way::

    from dpsql.admin import budgets
    with dpsql.connect("adult.duckdb", "admin") as admin:
        granted = budgets.grant(admin, user="bob", dataset="adult", epsilon="0.5")
        print(granted.standing.describe())

Each operation takes the session first and typed keyword arguments, and returns a
frozen dataclass with ``as_dict()`` (JSON-able). None takes a file path: the
caller reads and writes files on its own side (a policy's text goes in, an
exported table comes out). Modules: :mod:`~dpsql.admin.budgets`,
:mod:`~dpsql.admin.audit`, :mod:`~dpsql.admin.users`, :mod:`~dpsql.admin.policy`,
:mod:`~dpsql.admin.releases`, :mod:`~dpsql.admin.jobs`, :mod:`~dpsql.admin.data` (export,
evaluate), :mod:`~dpsql.admin.query`; :mod:`~dpsql.admin.wire` carries
arguments and results across the admin socket.

This package imports no front door; the modules load DuckDB and Arrow, so front
ends import them inside the command that runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dpsql.errors import AccessDenied, ConfigurationError
from dpsql.outcomes import Outcome

if TYPE_CHECKING:
    from dpsql.session import Session
    from dpsql.store import Store

F = TypeVar("F", bound=Callable[..., Any])

#: The modules that define operations (each registers its own on import).
MODULES = ("audit", "budgets", "data", "jobs", "policy", "query", "releases", "users")

_by_name: dict[str, Callable[..., Any]] = {}
_names: dict[Callable[..., Any], str] = {}


def operation(name: str) -> Callable[[F], F]:
    """Register an operation under ``name``: what a remote caller's request names."""
    def register(function: F) -> F:
        _by_name[name] = function
        _names[function] = name
        return function

    return register


def find(name: str) -> Callable[..., Any]:
    """The operation called ``name`` (ConfigurationError for an unknown name)."""
    _load()
    try:
        return _by_name[name]
    except KeyError:
        raise ConfigurationError(f"no administrative operation {name!r}") from None


def name_of(function: Callable[..., Any]) -> str:
    """The name an operation is registered under."""
    try:
        return _names[function]
    except KeyError:
        raise ConfigurationError(f"{getattr(function, '__name__', function)!r} is not an "
                                 "administrative operation") from None


def names() -> list[str]:
    """Every operation's name, sorted."""
    _load()
    return sorted(_by_name)


def require_admin_call(session: Session, statement: str, door: str) -> None:
    """Refuse an analyst a remote door's administrator command, audited as ``admin_call``.

    ``door`` names what runs administrator commands (``CALL dpsql(...)``, "the console").
    """
    if not session.is_admin:
        session.ledger.record(session.user, None, statement, Outcome.REFUSED,
                              "not an administrator", action="admin_call")
        raise AccessDenied(f"{session.user} is an analyst; {door} runs administrator "
                           "commands; ask an administrator")


def default_user(store: Store) -> str:
    """Who acts when a caller names nobody: the first admin of the store's active policy."""
    from dpsql.policies import active_policy

    return next(u.name for u in active_policy(store).users.values() if u.role == "admin")


def _load() -> None:
    for module in MODULES:
        importlib.import_module(f"dpsql.admin.{module}")
