"""The PostgreSQL-wire front door: psql, DBeaver, psycopg and pandas reach dpsql through it.

``dpsql serve`` runs :func:`run`; :class:`Server` is the asyncio server for
embedding and tests. Layout: ``messages`` (wire format), ``auth`` (SCRAM and
credentials), ``router`` (where statements go), ``catalog``/``pgcatalog``/
``rewrite`` (the sanitized system catalog), ``pgtypes`` (types and values),
``connection`` (one client), ``server`` (listening and limits).
"""

from dpsql.server.server import Server, ServerConfig, run

__all__ = ["Server", "ServerConfig", "run"]
