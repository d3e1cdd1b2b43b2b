"""Releases as background jobs: charged at once, fitted in a worker process, written at the end.

:meth:`Jobs.submit` checks a release request in the caller's thread, starts its
worker process (:mod:`dpsql.worker`: a fresh interpreter that never imports
the caller's ``__main__``, checked ready) and only then charges it: a refused
request, or a worker that cannot start, costs nothing and raises there. The
job then runs on the store's one job thread, in order: it writes the bounded
source to a private temporary folder (:mod:`dpsql.scratch`), the worker fits
and samples from it and leaves its results there, and the owner writes them in
one store transaction. The folder is removed when the job ends, however it ends.

The worker dies with its owner (it watches the pipe between them), so ``kill -9``
of the owner leaves no fit running. Jobs are rows of ``dpsql.jobs``, which this
module owns (:data:`TABLES`: its schema and crash recovery) and alone writes; a
job's state moves as :class:`JobState` allows. When the store is next opened,
those a dead process left queued or running become ``interrupted``, their
requests are settled so by the ledger, and their folders are removed (their
charge stays; their table was never written, since the write is one
transaction).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import duckdb

from dpsql import scratch
from dpsql.context import Context
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import DPSQLError, InternalError, QueryCanceled, ReleaseError
from dpsql.ledger.books import interrupt_open
from dpsql.outcomes import Outcome
from dpsql.progress import Progress, silent
from dpsql.release import Charged, MoreRequest, ReleaseRequest, prepare
from dpsql.release.write import Release
from dpsql.store import Store, StoreKey, Tables, now
from dpsql.worker import Worker, WorkerFailed

COLUMNS = ("id", "user", "kind", "name", "dataset", "synthesizer", "state", "stage",
           "fraction", "submitted_at", "finished_at", "audit_id", "worker_pid", "error")


class JobState(str, Enum):
    """Where a release job stands; :data:`MOVES` says where each may go next."""

    QUEUED = "queued"  # charged, its worker started, waiting for the job thread
    RUNNING = "running"  # exporting its source, fitting or writing
    SUCCEEDED = "succeeded"  # its release is written
    FAILED = "failed"  # nothing written; the charge stays
    CANCELLED = "cancelled"  # nothing written; the charge stays
    INTERRUPTED = "interrupted"  # its process ended (found at the next open); the charge stays

    def __str__(self) -> str:
        return self.value

    @property
    def live(self) -> bool:
        """Whether the job may still move (queued or running)."""
        return bool(MOVES[self])


_ENDS = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                   JobState.INTERRUPTED})
#: The states each state may move to (an ended job moves no more).
MOVES: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, *(_ENDS - {JobState.SUCCEEDED})}),
    JobState.RUNNING: _ENDS,
    **{end: frozenset() for end in _ENDS},
}
#: The state a job ends in, by the outcome its request settles with.
ENDED_BY = {Outcome.RELEASED: JobState.SUCCEEDED, Outcome.HELD: JobState.SUCCEEDED,
            Outcome.CANCELLED: JobState.CANCELLED,
            Outcome.FAILED: JobState.FAILED}
LIVE = tuple(state.value for state in JobState if state.live)


def _recover(store: Store, cur: duckdb.DuckDBPyConnection) -> None:
    """Close the jobs a process that ended left queued or running: ``interrupted``.

    Their charge stays; the write of their result is one transaction, so nothing
    was written. Their temporary folders, which hold the bounded rows, are
    removed, also one made before its job row recorded it (:mod:`dpsql.scratch`),
    and the ledger settles their requests ``interrupted``. Runs after the
    ledger's recovery, in the open's transaction.
    """
    scratch.sweep(store.path)
    rows = cur.execute("SELECT audit_id, folder FROM dpsql.jobs WHERE list_contains(?, state)",
                       [list(LIVE)]).fetchall()
    for _, folder in rows:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)  # the bounded rows it exported
    interrupt_open(cur, [a for a, _ in rows if a is not None],
                   "the process running the release ended; nothing was written")
    cur.execute("UPDATE dpsql.jobs SET state = ?, finished_at = ?, "
                "error = 'the process running it ended; nothing was written' "
                "WHERE list_contains(?, state)", [JobState.INTERRUPTED.value, now(), list(LIVE)])


TABLES = Tables("jobs", {
    # 6: release jobs (dpsql.jobs), run in a worker process and listed by dpsql jobs.
    6: ("CREATE SEQUENCE dpsql.job_ids",
        """CREATE TABLE dpsql.jobs (
            id BIGINT PRIMARY KEY, user_name VARCHAR NOT NULL, kind VARCHAR NOT NULL,
            name VARCHAR NOT NULL, dataset VARCHAR, synthesizer VARCHAR,
            state VARCHAR NOT NULL, stage VARCHAR, fraction DOUBLE,
            submitted_at TIMESTAMP NOT NULL, finished_at TIMESTAMP, audit_id BIGINT,
            worker_pid INTEGER, folder VARCHAR, error VARCHAR)"""),
}, _recover)


_STOP_POLL = 0.1  # seconds a waiter takes, at most, to see that it was interrupted


class _Stop:
    """A waiter's stop button, pressed by an Interrupter (any thread, never blocking)."""

    def __init__(self) -> None:
        self.asked = False

    def interrupt(self) -> None:
        """Ask the waiter to cancel its job and stop waiting."""
        self.asked = True


class _Cancelled(Exception):
    """The job was cancelled before its result was written."""


@dataclass
class _Job:
    """A job of this process: its request, its progress so far and how it ended."""

    id: int
    ctx: Context
    charged: Charged
    worker: Worker | None  # started before the charge, waiting for the job's turn; then None
    events: list[tuple[str, float, float | None]] = field(default_factory=list)
    export: Interrupter = field(default_factory=Interrupter)  # stops the source's export
    cancelled_by: str | None = None
    writing: bool = False
    finished: bool = False
    result: Release | None = None
    error: BaseException | None = None


class Jobs:
    """The release jobs of one open store (a store service: ``store[JOBS]``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._jobs: dict[int, _Job] = {}
        self._changed = threading.Condition()  # guards every _Job's fields
        self._runner = ThreadPoolExecutor(1, thread_name_prefix="dpsql-jobs")

    def submit(self, ctx: Context, request: ReleaseRequest | MoreRequest) -> int:
        """Check ``request``, start its worker, then charge it and queue it; returns the job id."""
        workers: list[Worker] = []

        def start(work: Callable[..., None], args: tuple[Any, ...]) -> None:
            workers.append(Worker.start(work, args))

        try:
            charged = prepare(ctx, request, start)
            [worker] = workers
            with ctx.store.transaction() as cur:
                row = cur.execute(
                    "INSERT INTO dpsql.jobs (id, user_name, kind, name, dataset, synthesizer, "
                    "state, submitted_at, audit_id, worker_pid) VALUES "
                    "(nextval('dpsql.job_ids'), ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    [ctx.user, charged.kind, charged.name, charged.dataset, charged.synthesizer,
                     JobState.QUEUED.value, now(), charged.audit_id, worker.pid]).fetchone()
            assert row is not None
            job = _Job(int(row[0]), ctx, charged, worker)
            with self._changed:
                self._jobs[job.id] = job
            self._runner.submit(self._run, job)
        except BaseException:
            for started in workers:
                started.kill()
                started.close()
            raise
        return job.id

    def forecast(self, job_id: int) -> list[str]:
        """The forecast's lines of a fresh release job of this process (none for more copies)."""
        with self._changed:
            job = self._jobs.get(job_id)
        plan = job.charged.plan if job is not None else None
        return list(plan.forecast_record["lines"]) if plan is not None else []

    def wait(self, job_id: int, progress: Progress | None = None,
             interrupts: Interrupter | None = None) -> Release:
        """Wait for a job of this process, reporting its progress; returns its release.

        A KeyboardInterrupt (Ctrl-C) while waiting cancels the job and is re-raised;
        so does an interrupt of ``interrupts`` (a statement timeout, a cancel request,
        a client's Ctrl-C on the admin socket), which then raises QueryCanceled. The
        charge stays.
        """
        job = self._job(job_id)
        stop = _Stop()
        try:
            with interrupts.running(stop) if interrupts is not None else nullcontext():
                self._follow(job, progress or silent, stop)
        except (KeyboardInterrupt, QueryCanceled):  # Ctrl-C, or interrupted before it began
            self.cancel(job_id, job.ctx.user, quiet=True)
            raise
        if stop.asked:
            self.cancel(job_id, job.ctx.user, quiet=True)
            if job.result is None:  # else it was written before the stop: it stands
                raise QueryCanceled()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def _follow(self, job: _Job, report: Progress, stop: _Stop) -> None:
        """Report the job's progress until it ends or ``stop`` is asked."""
        seen = 0

        def news() -> bool:  # events past ``seen``, the end, or a stop
            return len(job.events) > seen or job.finished or stop.asked

        while not stop.asked:
            with self._changed:
                self._changed.wait_for(news, _STOP_POLL)
                events, finished = job.events[seen:], job.finished
            seen += len(events)
            for event in events:
                report(*event)
            if finished and not events:
                return

    def cancel(self, job_id: int, by: str, *, quiet: bool = False) -> None:
        """Stop a queued or running job and wait until it is settled (the charge stays).

        Refused once its result is being written; ``quiet`` returns instead.
        """
        with self._changed:
            job = self._jobs.get(job_id)
            if job is None or job.finished or job.writing or job.cancelled_by:
                if quiet:
                    return
                raise ReleaseError(f"job {job_id} is not queued or running in this process"
                                   + ("; it is writing its result" if job and job.writing
                                      else "") + "; see dpsql jobs")
            job.cancelled_by = by
            if job.worker is not None:
                job.worker.kill()
            job.export.interrupt()  # the engine's query or job, while the source is exported
            self._changed.wait_for(lambda: job.finished)

    def list(self) -> list[dict[str, Any]]:
        """Every job of the store, newest first, with the live progress of this process's."""
        rows = self.store.cursor().execute(
            "SELECT id, user_name, kind, name, dataset, synthesizer, state, stage, fraction, "
            "submitted_at, finished_at, audit_id, worker_pid, error FROM dpsql.jobs "
            "ORDER BY id DESC").fetchall()
        out = [dict(zip(COLUMNS, row, strict=True)) for row in rows]
        for item in out:
            item["state"] = JobState(item["state"])
        with self._changed:
            for item in out:
                job = self._jobs.get(item["id"])
                if job is not None and not job.finished and job.events:
                    stage, done, total = job.events[-1]
                    item["stage"], item["fraction"] = stage, _fraction(done, total)
        return out

    def cancel_all(self, by: str) -> None:
        """Cancel this process's queued and running jobs, oldest first (the charges stay).

        A job already writing its result finishes.
        """
        with self._changed:
            live = [j.id for j in self._jobs.values() if not j.finished]
        for job_id in live:
            self.cancel(job_id, by, quiet=True)

    def close(self) -> None:
        """Wait for the queued and running jobs (Ctrl-C cancels them), then stop."""
        try:
            self._runner.shutdown(wait=True)
        except KeyboardInterrupt:
            self.cancel_all("shutdown")
            raise

    # -- the job thread ---------------------------------------------------------------
    def _job(self, job_id: int) -> _Job:
        with self._changed:
            job = self._jobs.get(job_id)
        if job is None:
            raise ReleaseError(f"no job {job_id} in this process; see dpsql jobs")
        return job

    def _run(self, job: _Job) -> None:
        ctx, charged = job.ctx, job.charged
        outcome, reason = Outcome.RELEASED, None
        try:
            with scratch.folder(ctx.store.path) as folder:  # mode 0700, marked with its owner
                with job.export.statement():  # from here a cancel interrupts the export
                    self._check_cancelled(job)
                    _move(ctx.store, job.id, JobState.QUEUED, JobState.RUNNING,
                          folder=str(folder))
                    try:
                        charged.export(ctx, folder, job.export)
                    except QueryCanceled:
                        self._check_cancelled(job)
                        raise
                self._in_worker(job, folder)
                with self._changed:
                    self._check_cancelled(job)
                    job.writing = True
                job.result = charged.write(ctx, folder, self._reporter(job))
                if job.result.held:
                    outcome, reason = Outcome.HELD, job.result.held
        except _Cancelled:
            outcome = Outcome.CANCELLED
            reason = f"cancelled by {job.cancelled_by}{charged.kept}"
            job.error = ReleaseError(f"job {job.id} was {reason}")
        except BaseException as err:  # settled, then raised in the waiter
            name = err.name if isinstance(err, WorkerFailed) else type(err).__name__
            outcome, (reason, wrapped) = Outcome.FAILED, charged.failure(name)
            job.error = err if isinstance(err, DPSQLError) else wrapped
            if not isinstance(err, (WorkerFailed, DPSQLError)):
                job.error.__cause__ = err
        finally:
            self._end_worker(job)  # a worker that never got its turn
        try:
            ctx.ledger.settle(charged.audit_id, outcome, reason)
            _move(ctx.store, job.id, None, ENDED_BY[outcome], finished_at=now(), error=reason)
        finally:  # a waiter never waits for a job that ended
            with self._changed:
                job.finished = True
                self._changed.notify_all()

    def _check_cancelled(self, job: _Job) -> None:
        if job.cancelled_by is not None:
            raise _Cancelled()

    def _reporter(self, job: _Job) -> Progress:
        """A Progress that records events for the waiters and the stage in the job's row."""
        def report(stage: str, done: float, total: float | None = None) -> None:
            with self._changed:
                changed = not job.events or job.events[-1][0] != stage
                job.events.append((stage, done, total))
                self._changed.notify_all()
            if changed:
                _update(job.ctx.store, job.id, stage=stage, fraction=_fraction(done, total))
        return report

    def _in_worker(self, job: _Job, folder: Path) -> None:
        """Let the job's worker fit and sample from ``folder``, relaying its progress."""
        with self._changed:
            self._check_cancelled(job)
            worker = job.worker
        assert worker is not None
        try:
            worker.run(folder, self._reporter(job))
        except WorkerFailed:
            self._check_cancelled(job)  # killed by a cancel
            raise
        finally:
            self._end_worker(job)  # before its folder goes

    def _end_worker(self, job: _Job) -> None:
        """Stop the job's worker, whether it finished, failed or never got its turn."""
        with self._changed:
            worker, job.worker = job.worker, None
        if worker is not None:
            worker.close()


#: Jobs of each open store: ``store[JOBS]``.
JOBS: StoreKey[Jobs] = StoreKey("jobs")


def _fraction(done: float, total: float | None) -> float | None:
    return None if not total else min(1.0, done / total)


def _update(store: Store, job_id: int, **values: Any) -> None:
    """Set columns of one job row other than its state, in a transaction of its own."""
    names = ", ".join(f"{name} = ?" for name in values)
    with store.transaction() as cur:
        cur.execute(f"UPDATE dpsql.jobs SET {names} WHERE id = ?", [*values.values(), job_id])


def _move(store: Store, job_id: int, old: JobState | None, new: JobState,
          **values: Any) -> None:
    """Move job ``job_id`` from ``old`` (None: any live state) to ``new``, setting ``values``.

    A move :data:`MOVES` does not allow is a bug: it raises and changes nothing.
    """
    sources = [s.value for s in JobState if new in MOVES[s] and old in (None, s)]
    names = "".join(f", {name} = ?" for name in values)
    with store.transaction() as cur:
        done = cur.execute(f"UPDATE dpsql.jobs SET state = ?{names} WHERE id = ? "
                           "AND list_contains(?, state)",
                           [new.value, *values.values(), job_id, sources]).fetchone()
        if not done or done[0] != 1:
            raise InternalError(f"job {job_id} cannot become {new.value}; this is a bug in "
                                "dpsql")
