"""Session: one principal (admin or analyst) on one store, under the store's active policy.

Every front end (CLI, Python API, wire server) goes through a Session, so roles
and the ledger are enforced in one place. The policy always comes from the
store, never from a path the caller passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dpsql.engines.base import Links
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import AccessDenied, ConfigurationError
from dpsql.imports import IMPORT_LIMITS, import_table, table_columns
from dpsql.jobs import JOBS
from dpsql.ledger import Budget, Ledger
from dpsql.outcomes import Outcome
from dpsql.policies import active_policy, apply_policy, check_policy
from dpsql.policy import Dataset, Policy, User
from dpsql.privacy import Number, PrivacyCost
from dpsql.services import open_store
from dpsql.store import Store, check_identifier

if TYPE_CHECKING:
    from dpsql.context import Context
    from dpsql.jobs import Jobs
    from dpsql.outside import Handling, Outside
    from dpsql.progress import Progress
    from dpsql.query.answer import Answer
    from dpsql.release import MoreRequest, ReleaseRequest
    from dpsql.release.write import Release


DOMAIN_READ = "not DP: an administrator checked the raw rows against the policy's domains"


class Session:
    """One user on one store. Use :func:`dpsql.connect` to make one."""

    def __init__(self, store: Store, user: str) -> None:
        self.store = store
        policy = active_policy(store)
        if user not in policy.users:
            raise AccessDenied(f"no user {user!r} in the store's policy; an administrator "
                               "declares users under users: and runs dpsql policy apply")
        self.user = user
        self.options: dict[str, Any] = {}
        self.interrupts = Interrupter()
        self.links = Links()  # connections to other engines, kept between statements
        self._closed = False

    # -- identity and policy ------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        """The policy in force now (re-read when an admin applies a new one)."""
        return active_policy(self.store)

    @property
    def principal(self) -> User:
        """This session's user as the policy declares it."""
        return self.context().principal

    @property
    def is_admin(self) -> bool:
        """Whether the user has the admin role."""
        return self.context().is_admin

    @property
    def ledger(self) -> Ledger:
        """The ledger under the active policy."""
        return Ledger(self.store, self.policy)

    def context(self) -> Context:
        """A request's fixed view: this user, the policy and options in force now."""
        from types import MappingProxyType

        from dpsql.context import Context

        return Context(self.store, self.policy, self.user, MappingProxyType(dict(self.options)),
                       self.interrupts, self.links)

    def require_admin(self, action: str) -> None:
        """Raise AccessDenied unless this session's user is an administrator."""
        self.context().require_admin(action)

    def cost(self, *, epsilon: Number | None = None, delta: Number | None = None,
             rho: Number | None = None) -> PrivacyCost:
        """A cost in the policy's accounting from epsilon[/delta] or rho.

        Delta defaults to the policy's.
        """
        return self.context().cost(epsilon=epsilon, delta=delta, rho=rho)

    # -- budgets ----------------------------------------------------------------------
    def budget(self, user: str | None = None) -> list[Budget]:
        """Per dataset: granted, spent, remaining. Analysts see only their own."""
        if user and user != self.user:
            self.require_admin("see another user's budget")
        return self.ledger.budgets(user or (None if self.is_admin else self.user))

    def grant(self, user: str, dataset: str, *, epsilon: Number | None = None,
              delta: Number | None = None, rho: Number | None = None) -> Budget:
        """Top up ``user``'s budget on ``dataset`` (admins only, audited)."""
        self.require_admin("grant budget")
        return self.ledger.grant(self.user, user, dataset,
                                 self.cost(epsilon=epsilon, delta=delta, rho=rho))

    def audit(self, user: str | None = None, last: int | None = None) -> list[dict[str, Any]]:
        """The audit log (admins see everyone's; analysts their own)."""
        if not self.is_admin:
            if user and user != self.user:
                self.require_admin("read another user's audit log")
            user = self.user
        return self.ledger.audit(user, last)

    # -- administration -----------------------------------------------------------------
    def apply_policy(self, policy: Policy | str | Path, outside: Handling = "refuse"
                     ) -> list[str]:
        """Make ``policy`` the active one; returns the recorded changes (admins only).

        Rows holding values outside the new policy's domains are handled as
        ``outside`` says (see :data:`dpsql.outside.HANDLINGS`), in the same
        transaction; the default refuses and changes nothing.
        """
        from dpsql.outside import settle

        self.require_admin("change the policy")
        if not isinstance(policy, Policy):
            policy = Policy.load(policy)
        if policy.users.get(self.user, None) is None or policy.users[self.user].role != "admin":
            raise ConfigurationError(f"the new policy would remove {self.user}'s admin role; "
                                     "keep yourself an admin or apply it as another admin")
        check_policy(self.store, policy)
        tables = self._audit_domain_read(policy)

        def prepare(cur: Any) -> list[str]:
            found = [o for ds in policy.datasets.values() for o in settle(
                cur, tables[ds.name], ds, table_columns(self.store, ds.table), outside)]
            return [f"{o.describe(examples=False)}: --outside {outside}" for o in found]

        return apply_policy(self.store, policy, self.user, prepare)

    def check_domain(self, policy: Policy | None = None) -> list[Outside]:
        """Per column, the rows outside the domains ``policy`` (default: the active one) declares.

        Admins only, and audited: not DP, it reads the raw rows and returns counts
        and example values for the administrator's eyes.
        """
        from dpsql.outside import find_outside

        self.require_admin("check the rows against a policy")
        policy = policy or self.policy
        check_policy(self.store, policy)
        tables = self._audit_domain_read(policy)
        cur = self.store.cursor()
        return [o for ds in policy.datasets.values() for o in find_outside(
            cur, tables[ds.name], ds, table_columns(self.store, ds.table))]

    def _audit_domain_read(self, policy: Policy) -> dict[str, str]:
        """Audit a domain check of each dataset of ``policy``; returns their relations."""
        tables = {}
        for ds in policy.datasets.values():
            check_identifier(ds.table, "table")
            self.ledger.record(self.user, ds.name, f"domain check of table {ds.table}",
                               Outcome.READ,
                               DOMAIN_READ, action="domain_check")
            tables[ds.name] = f'main."{ds.table}"'
        return tables

    def table(self, dataset: str) -> pa.Table:
        """The raw rows of a dataset (admins only: analysts never read raw tables)."""
        self.require_admin("read raw tables")
        ds = self.policy.dataset(dataset)
        check_identifier(ds.table, "table")
        self.ledger.record(self.user, dataset, f"read raw table {ds.table}", Outcome.READ,
                           "not DP: an administrator read the raw rows", action="read_raw")
        return self.store.cursor().sql(f'SELECT * FROM main."{ds.table}"').to_arrow_table()

    # -- analyst surface ----------------------------------------------------------------
    def sql(self, text: str) -> Answer:
        """Answer an SQL statement with differential privacy (see :mod:`dpsql.query`)."""
        from dpsql.query.answer import run_statement

        with self.interrupts.statement():
            answer = run_statement(self.context(), text)
        if answer.options is not None:  # SET or RESET changed this session's options
            self.options = dict(answer.options)
        return answer

    def interrupt(self) -> None:
        """Stop the statement this session runs now, from another thread (timeout, cancel).

        Its DuckDB queries stop and it raises QueryCanceled; a charge it made
        stands. Does nothing when no statement runs.
        """
        self.interrupts.interrupt()

    # -- releases -----------------------------------------------------------------------
    def release(self, dataset: str, *, synthesizer: str, name: str,
                epsilon: Number | None = None, delta: Number | None = None,
                rho: Number | None = None, rows: int | None = None, copies: int = 1,
                columns: Sequence[str] | None = None, seed: int | None = None,
                replace: bool = False, progress: Progress | None = None,
                options: Mapping[str, Any] | None = None, force: bool = False,
                **synth_options: Any) -> Release:
        """Release a DP synthetic table ``released.<name>`` of ``dataset`` (admins only).

        Charges the ledger first, then fits and samples in a worker process and
        writes the table with its provenance in one transaction; Ctrl-C cancels it
        (the charge stays). Synthesizer options come as keywords or as ``options``
        (a mapping, e.g. the CLI's ``--option k=v``), not both; one named like a
        release parameter is refused. ``force`` releases even when the forecast says the
        release cannot beat ``independent`` (it is refused before the charge otherwise).
        See :mod:`dpsql.jobs`.
        """
        from dpsql.release import ReleaseRequest

        if options and synth_options:
            raise ConfigurationError("give synthesizer options as keywords or as options=, "
                                     "not both")
        job = self.submit(ReleaseRequest(dataset, synthesizer, name, epsilon, delta, rho, rows,
                                         copies, columns, seed, replace,
                                         dict(options or synth_options), force))
        return self.jobs().wait(job, progress)

    def release_more(self, name: str, copies: int, *, seed: int | None = None,
                     progress: Progress | None = None) -> Release:
        """Append more copies to a resumable release, sampled from its DP state (no cost)."""
        from dpsql.release import MoreRequest

        return self.jobs().wait(self.submit(MoreRequest(name, copies, seed)), progress)

    def publish(self, name: str) -> Release:
        """Publish release ``name``, held because its fit failed its diagnostics (admins only).

        See :func:`dpsql.release.publish`: the record keeps the failed checks and says
        who published it.
        """
        from dpsql.release.write import publish

        return publish(self.context(), name)

    def submit(self, request: ReleaseRequest | MoreRequest) -> int:
        """Charge a release request now and run it in the background; returns its job id."""
        return self.jobs().submit(self.context(), request)

    def jobs(self) -> Jobs:
        """The store's release jobs (see :mod:`dpsql.jobs`)."""
        return self.store[JOBS]

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Release the store handle (idempotent)."""
        if not self._closed:
            self._closed = True
            self.links.close()
            self.store.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(path: str | Path, user: str) -> Session:
    """Open the store at ``path`` as ``user``.

    The Python API trusts its caller (it can read the file anyway); untrusted
    analysts come through ``dpsql serve``, which authenticates them.
    """
    store = open_store(path)
    try:
        return Session(store, user)
    except BaseException:
        store.close()
        raise


def init(path: str | Path, policy: Policy | str | Path,
         imports: Mapping[str, str | Path] | None = None, *, na: str | None = None,
         normalize: bool = True, admin: str | None = None,
         enforce_bounds: bool = False, outside: Handling = "refuse") -> tuple[Store, list[str]]:
    """Create a store, import tables and apply the first policy.

    With ``enforce_bounds`` the policy's numeric bounds become CHECK constraints
    of the imported tables (every value must fit; DP queries then skip clamping).
    Values outside the policy's domains are handled as ``outside`` says (see
    :data:`dpsql.outside.HANDLINGS`; the default refuses). Returns the open store
    and notes (which name what was found outside, for the administrator only).
    Nothing is left behind if any step fails.
    """
    from dpsql.outside import settle, summary

    if not isinstance(policy, Policy):
        policy = Policy.load(policy)
    admins = [u.name for u in policy.users.values() if u.role == "admin"]
    actor = admin or admins[0]
    target = Path(path)
    store = open_store(target, create=True, limits=IMPORT_LIMITS)
    try:
        notes: list[str] = []
        audited: list[str] = []
        for table, file in (imports or {}).items():
            bounds = {c.name: c.bounds for ds in policy.datasets.values() if ds.table == table
                      for c in ds.columns.values() if c.numeric and c.bounds is not None
                      } if enforce_bounds else {}
            checked = [ds for ds in policy.datasets.values() if ds.table == table]

            def prepare(cur: Any, rows: str, types: Mapping[str, str],
                        checked: list[Dataset] = checked) -> None:
                for ds in checked:
                    notes.extend(summary(settle(cur, rows, ds, types, outside, fresh=True),
                                         outside))

            renames = import_table(store, table, file, na=na, normalize=normalize,
                                   bounds=bounds, prepare=prepare)
            if renames:
                notes.append(f"{table}: renamed columns " + ", ".join(
                    f"{old} -> {new}" for old, new in renames.items()))
            audited += [ds.name for ds in checked]
        notes += check_policy(store, policy)
        apply_policy(store, policy, actor)
        for name in audited:
            Ledger(store, policy).record(actor, name, f"domain check of table "
                                         f"{policy.datasets[name].table} at import",
                                         Outcome.READ,
                                         DOMAIN_READ, action="domain_check")
    except BaseException:
        store.close()
        for leftover in (target, Path(str(target) + ".wal")):
            leftover.unlink(missing_ok=True)
        raise
    store.close()  # reopened without the import's limits, for whatever comes next
    return open_store(target), notes
