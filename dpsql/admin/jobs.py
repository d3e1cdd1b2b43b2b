"""Release jobs: list them with their progress, cancel one (``dpsql jobs``, ``jobs cancel``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dpsql.admin import operation
from dpsql.session import Session


@dataclass(frozen=True)
class Job:
    """A release job; ``stage`` and ``fraction``: its progress (live ones of this process)."""

    id: int
    user: str
    kind: str
    name: str
    dataset: str | None
    synthesizer: str | None
    state: str
    stage: str | None
    fraction: float | None
    submitted_at: datetime
    finished_at: datetime | None
    audit_id: int | None
    worker_pid: int | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"id": self.id, "user": self.user, "kind": self.kind, "name": self.name,
                "dataset": self.dataset, "synthesizer": self.synthesizer, "state": self.state,
                "stage": self.stage, "fraction": self.fraction,
                "submitted_at": self.submitted_at.isoformat(timespec="seconds"),
                "finished_at": self.finished_at.isoformat(timespec="seconds")
                if self.finished_at else None,
                "audit_id": self.audit_id, "worker_pid": self.worker_pid, "error": self.error}


@dataclass(frozen=True)
class Jobs:
    """Release jobs, newest first."""

    jobs: list[Job]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"jobs": [j.as_dict() for j in self.jobs]}


@operation("job.list")
def list_jobs(session: Session) -> Jobs:
    """Every release job of the store, newest first (admins only)."""
    session.require_admin("list release jobs")
    return Jobs([Job(**row) for row in session.jobs().list()])


@dataclass(frozen=True)
class Cancelled:
    """Job ``job`` was cancelled: nothing was written and its charge stays."""

    job: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"job": self.job, "state": "cancelled", "written": False, "charge": "stays"}


@operation("job.cancel")
def cancel_job(session: Session, *, job: int) -> Cancelled:
    """Cancel queued or running job ``job`` and wait until it is settled (admins only)."""
    session.require_admin("cancel release jobs")
    session.jobs().cancel(job, session.user)
    return Cancelled(job)
