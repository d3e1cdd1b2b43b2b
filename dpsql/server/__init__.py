"""The PostgreSQL-wire front door: psql, DBeaver, psycopg and pandas reach dpsql through it.

``dpsql serve`` runs :func:`run`; :class:`Server` is the asyncio server for
embedding and tests. Layout: ``messages`` (wire format), ``login`` and
``logins`` (a client's SCRAM login; the limits on logins), ``router`` (where
statements go), ``catalog``/``pgcatalog``/``rewrite`` (the sanitized system
catalog), ``pgtypes`` and ``rows`` (types, values, DataRows), ``connection`` and
``portals`` (one client; its prepared statements), ``host`` (the server as a
connection sees it), ``server`` (listening and limits), ``admin`` and
``procedure`` (the admin socket; ``CALL dpsql``).
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
