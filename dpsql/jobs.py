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
of the owner leaves no fit running. Jobs are rows of ``dpsql.jobs``; the store
marks those a dead process left queued or running ``interrupted`` when it is
next opened, and removes their folders (their charge stays; their table was
never written, since the write is one transaction).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from dpsql import scratch
from dpsql.context import Context
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import DPSQLError, QueryCanceled, ReleaseError
from dpsql.progress import Progress, silent
from dpsql.release import Charged, MoreRequest, Release, ReleaseRequest, prepare
from dpsql.store import Store, now
from dpsql.worker import Worker, WorkerFailed

LIVE = ("queued", "running")
COLUMNS = ("id", "user", "kind", "name", "dataset", "synthesizer", "state", "stage",
           "fraction", "submitted_at", "finished_at", "audit_id", "worker_pid", "error")


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
    """The release jobs of one open store: get it with :func:`jobs`."""

    def __init__(self) -> None:
        self.store: Store | None = None
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
                    "(nextval('dpsql.job_ids'), ?, ?, ?, ?, ?, 'queued', ?, ?, ?) RETURNING id",
                    [ctx.user, charged.kind, charged.name, charged.dataset, charged.synthesizer,
                     now(), charged.audit_id, worker.pid]).fetchone()
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

    def wait(self, job_id: int, progress: Progress | None = None) -> Release:
        """Wait for a job of this process, reporting its progress; returns its release.

        A KeyboardInterrupt (Ctrl-C) while waiting cancels the job and is re-raised;
        the charge stays.
        """
        job = self._job(job_id)
        report, seen = progress or silent, 0

        def news() -> bool:  # events past ``seen``, or the end
            return len(job.events) > seen or job.finished

        try:
            while True:
                with self._changed:
                    self._changed.wait_for(news, 0.5)
                    events, finished = job.events[seen:], job.finished
                seen += len(events)
                for event in events:
                    report(*event)
                if finished and not events:
                    break
        except KeyboardInterrupt:
            self.cancel(job_id, job.ctx.user, quiet=True)
            raise
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

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
        assert self.store is not None
        rows = self.store.cursor().execute(
            "SELECT id, user_name, kind, name, dataset, synthesizer, state, stage, fraction, "
            "submitted_at, finished_at, audit_id, worker_pid, error FROM dpsql.jobs "
            "ORDER BY id DESC").fetchall()
        out = [dict(zip(COLUMNS, row, strict=True)) for row in rows]
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
        outcome, reason = "released", None
        try:
            with scratch.folder(ctx.store.path) as folder:  # mode 0700, marked with its owner
                with job.export.statement():  # from here a cancel interrupts the export
                    self._check_cancelled(job)
                    _update(ctx.store, job.id, state="running", folder=str(folder))
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
        except _Cancelled:
            outcome, reason = "cancelled", f"cancelled by {job.cancelled_by}{charged.kept}"
            job.error = ReleaseError(f"job {job.id} was {reason}")
        except BaseException as err:  # settled, then raised in the waiter
            name = err.name if isinstance(err, WorkerFailed) else type(err).__name__
            outcome, (reason, wrapped) = "failed", charged.failure(name)
            job.error = err if isinstance(err, DPSQLError) else wrapped
            if not isinstance(err, (WorkerFailed, DPSQLError)):
                job.error.__cause__ = err
        finally:
            self._end_worker(job)  # a worker that never got its turn
        state = {"released": "succeeded", "cancelled": "cancelled"}.get(outcome, "failed")
        try:
            ctx.ledger.settle(charged.audit_id, outcome, reason)
            _update(ctx.store, job.id, state=state, finished_at=now(), error=reason)
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


def jobs(store: Store) -> Jobs:
    """The job runner of an open store (one per store; it closes with the store)."""
    runner = store.state(Jobs)
    runner.store = store
    return runner


def _fraction(done: float, total: float | None) -> float | None:
    return None if not total else min(1.0, done / total)


def _update(target: Store | duckdb.DuckDBPyConnection, job_id: int, **values: Any) -> None:
    """Set columns of one job row (in a transaction of its own, or in the cursor's)."""
    if isinstance(target, Store):
        with target.transaction() as cur:
            _update(cur, job_id, **values)
        return
    names = ", ".join(f"{name} = ?" for name in values)
    target.execute(f"UPDATE dpsql.jobs SET {names} WHERE id = ?", [*values.values(), job_id])
