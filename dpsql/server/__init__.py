"""The PostgreSQL-wire front door: psql, DBeaver, psycopg and pandas reach dpsql through it.

``dpsql serve`` runs :func:`run`; :class:`Server` is the asyncio server for
embedding and tests. Layout: ``messages`` (wire format), ``auth`` (SCRAM and
credentials), ``router`` (where statements go), ``catalog``/``pgcatalog``/
``rewrite`` (the sanitized system catalog), ``pgtypes`` (types and values),
``connection`` (one client), ``server`` (listening and limits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpsql.server.server import Server, ServerConfig, run


def __getattr__(name: str) -> Any:
    """Import the server on first use: importing the package loads no DuckDB or sockets."""
    if name in __all__:
        from dpsql.server import server

        return getattr(server, name)
    raise AttributeError(f"module 'dpsql.server' has no attribute {name!r}")


__all__ = ["Server", "ServerConfig", "run"]
