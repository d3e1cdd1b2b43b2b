"""Opening a store: its tables' owners in their global order, and the per-store services.

:data:`OWNERS` lists every module that owns tables of the store, in the order
their migrations run within a schema version and their recoveries run at open:
the ledger's recovery (the audit rows of charges never settled) comes before
the jobs' (which settles their requests ``interrupted``). :func:`services` builds
what the modules above keep about an open store (each under its owner's
:class:`~dpsql.store.StoreKey`), once at open; the store closes them in order.
:func:`open_store` is the way to open one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpsql import answers, credentials, jobs, policies, provenance, store
from dpsql.answers import ANSWERS, AnswerCache
from dpsql.credentials import CREDENTIALS, Credentials
from dpsql.jobs import JOBS, Jobs
from dpsql.ledger import books
from dpsql.ledger.books import BOOKS, Books
from dpsql.policies import VERSIONS, PolicyVersions
from dpsql.query.free import FREE, FreeDatabase
from dpsql.query.plancache import PLANS, PlanCache
from dpsql.sandbox import SANDBOXES, Sandboxes
from dpsql.store import Store, StoreKey, Tables

#: The owners of the store's tables: the store's own first, recoveries in this order.
OWNERS: tuple[Tables, ...] = (store.TABLES, policies.TABLES, books.TABLES, answers.TABLES,
                              provenance.TABLES, credentials.TABLES, jobs.TABLES)


def services(opened: Store) -> list[tuple[StoreKey[Any], Any]]:
    """The per-store objects of a store just opened, each under its owner's key.

    Nothing starts before it is used. The store closes them last built first:
    the jobs (they settle) before the ledger's queued settles, the free database
    before its sandboxes.
    """
    cache = AnswerCache(opened)
    sandboxes = Sandboxes()
    return [(VERSIONS, PolicyVersions(opened)), (ANSWERS, cache), (SANDBOXES, sandboxes),
            (FREE, FreeDatabase(sandboxes)), (BOOKS, Books(opened, cache)), (PLANS, PlanCache()),
            (CREDENTIALS, Credentials(opened)), (JOBS, Jobs(opened))]


def open_store(path: str | Path, *, create: bool = False,
               limits: Mapping[str, str | int] | None = None) -> Store:
    """Open (or with ``create`` make) the store at ``path``: see :meth:`Store.open`."""
    return Store.open(path, OWNERS, services, create=create, limits=limits)
