"""Opening a store: its tables' owners in their global order, and the per-store services.

:data:`OWNERS` lists every module that owns tables of the store, in the order
their migrations run within a schema version and their recoveries run at open:
the ledger's recovery (the audit rows of charges never settled) comes before
the jobs' (which settles their requests ``interrupted``). :class:`StoreServices`
holds what the modules above keep about an open store, built once at open and
closed in order when the store closes. :func:`open_store` is the way to open one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dpsql import answers, credentials, jobs, policies, provenance, store
from dpsql.answers import AnswerCache
from dpsql.credentials import Credentials
from dpsql.jobs import Jobs
from dpsql.ledger import books
from dpsql.ledger.books import Books
from dpsql.policies import PolicyVersions
from dpsql.query.free import FreeDatabase
from dpsql.query.plancache import PlanCache
from dpsql.sandbox import Sandboxes
from dpsql.store import Store, Tables

#: The owners of the store's tables: the store's own first, recoveries in this order.
OWNERS: tuple[Tables, ...] = (store.TABLES, policies.TABLES, books.TABLES, answers.TABLES,
                              provenance.TABLES, credentials.TABLES, jobs.TABLES)


@dataclass(frozen=True)
class StoreServices:
    """What the modules above the store keep about one open store (one each).

    ``policies``: the active policy, parsed once per version (:mod:`dpsql.policies`).
    ``answers``: the stored answers' keys and sizes (:mod:`dpsql.answers`).
    ``books``: the ledger's next id, standings and queued settles (:mod:`dpsql.ledger`).
    ``plans``: validated query plans by text (:mod:`dpsql.query.plancache`).
    ``sandboxes``: the processes free and catalog queries run in (:mod:`dpsql.sandbox`).
    ``free``: the isolated database of free queries (:mod:`dpsql.query.free`).
    ``jobs``: the release jobs (:mod:`dpsql.jobs`).
    ``credentials``: the stored verifiers as logins read them (:mod:`dpsql.credentials`).
    """

    policies: PolicyVersions
    answers: AnswerCache
    books: Books
    plans: PlanCache
    sandboxes: Sandboxes
    free: FreeDatabase
    jobs: Jobs
    credentials: Credentials

    @classmethod
    def build(cls, opened: Store) -> StoreServices:
        """The services of a store just opened (nothing starts before it is used)."""
        cache = AnswerCache(opened)
        sandboxes = Sandboxes()
        return cls(PolicyVersions(opened), cache, Books(opened, cache), PlanCache(), sandboxes,
                   FreeDatabase(sandboxes), Jobs(opened), Credentials(opened))

    def close(self) -> None:
        """Close in order: jobs (they settle), the ledger's queued settles, then the rest.

        Each is closed even when one before it raised (the first error is raised).
        """
        closers = (self.jobs.close, self.books.close, self.free.close, self.sandboxes.close)
        error: BaseException | None = None
        for close in closers:
            try:
                close()
            except BaseException as err:  # the others still close
                error = error or err
        if error is not None:
            raise error


def open_store(path: str | Path, *, create: bool = False,
               limits: Mapping[str, str | int] | None = None) -> Store:
    """Open (or with ``create`` make) the store at ``path``: see :meth:`Store.open`."""
    return Store.open(path, OWNERS, StoreServices.build, create=create, limits=limits)
