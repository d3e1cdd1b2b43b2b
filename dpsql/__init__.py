"""dpsql: privacy-governed data release for DuckDB.

Analysts get noisy answers to SQL aggregate queries, charged against a budget
the policy enforces, and differentially private synthetic tables with their
provenance. Raw rows never leave the store.
"""

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
from dpsql.session import Session, connect, init

__version__ = "0.1.0"

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
