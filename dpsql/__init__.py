"""dpsql: privacy-governed data release for DuckDB.

Analysts get noisy answers to SQL aggregate queries, charged against a budget
the policy enforces, and differentially private synthetic tables with their
provenance. Raw rows never leave the store.
"""

from typing import TYPE_CHECKING, Any

from dpsql.errors import (
    AccessDenied,
    BudgetExceeded,
    ConfigurationError,
    DPSQLError,
    InternalError,
    PolicyError,
    QueryRejected,
    ReleaseError,
    StoreError,
)

if TYPE_CHECKING:
    from dpsql.session import Session, connect, init

from dpsql.version import __version__ as __version__  # re-exported

_SESSION_NAMES = ("Session", "connect", "init")


def __getattr__(name: str) -> Any:
    """Import the session layer on first use, so ``dpsql --version`` loads no DuckDB or NumPy."""
    if name in _SESSION_NAMES:
        from dpsql import session

        return getattr(session, name)
    raise AttributeError(f"module 'dpsql' has no attribute {name!r}")


__all__ = [
    "AccessDenied",
    "BudgetExceeded",
    "ConfigurationError",
    "DPSQLError",
    "InternalError",
    "PolicyError",
    "QueryRejected",
    "ReleaseError",
    "Session",
    "StoreError",
    "connect",
    "init",
]
