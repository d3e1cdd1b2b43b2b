"""Releases: submit, wait, add copies, list, show, synthesizers (``dpsql release ...``).

A release is charged when it is submitted and runs as a job (:mod:`dpsql.jobs`);
:func:`wait_release` follows it to the end, reporting progress. An interrupt of
the session (a statement timeout, a cancel request, Ctrl-C on the admin socket)
cancels the job it waits for: nothing is written and the charge stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dpsql.admin import operation
from dpsql.privacy import Number, PrivacyCost
from dpsql.progress import Progress
from dpsql.release import DryRun
from dpsql.session import Session


@dataclass(frozen=True)
class Submitted:
    """A release charged and queued as job ``job`` of ``user``, with its forecast's lines."""

    job: int
    user: str
    forecast: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"job": self.job, "forecast": self.forecast}


@operation("release.submit")
def submit_release(session: Session, *, dataset: str, synthesizer: str, name: str,
                   epsilon: Number | None = None, delta: Number | None = None,
                   rho: Number | None = None, rows: int | None = None, copies: int = 1,
                   columns: list[str] | None = None, seed: int | None = None,
                   replace: bool = False, options: dict[str, str] | None = None,
                   force: bool = False) -> Submitted:
    """Charge a release of ``dataset`` as ``released.<name>`` and queue it (admins only).

    A release whose forecast says it cannot beat ``independent`` is refused
    before the charge unless ``force``.
    """
    from dpsql.release import ReleaseRequest

    request = ReleaseRequest(dataset, synthesizer, name, epsilon, delta, rho, rows, copies,
                             columns, seed, replace, dict(options or {}), force)
    job = session.submit(request)
    return Submitted(job, session.user, session.jobs().forecast(job))


@operation("release.plan")
def plan_release(session: Session, *, dataset: str, synthesizer: str, name: str,
                 epsilon: Number | None = None, delta: Number | None = None,
                 rho: Number | None = None, rows: int | None = None, copies: int = 1,
                 columns: list[str] | None = None, seed: int | None = None,
                 replace: bool = False, options: dict[str, str] | None = None,
                 force: bool = False) -> DryRun:
    """What the release would do, and its forecast, with nothing charged (``--dry-run``)."""
    from dpsql.release import ReleaseRequest, dry_run

    request = ReleaseRequest(dataset, synthesizer, name, epsilon, delta, rho, rows, copies,
                             columns, seed, replace, dict(options or {}), force)
    return dry_run(session.context(), request)


@operation("release.more")
def submit_more(session: Session, *, name: str, copies: int, seed: int | None = None
                ) -> Submitted:
    """Queue ``copies`` more copies of release ``name`` from its stored DP state (no cost)."""
    from dpsql.release import MoreRequest

    return Submitted(session.submit(MoreRequest(name, copies, seed)), session.user)


@dataclass(frozen=True)
class Released:
    """A finished release: its table, provenance record and warnings; the user's budget left."""

    name: str
    table: str
    release_id: str
    record: dict[str, Any]
    warnings: list[str]
    remaining: PrivacyCost | None  # the waiting user's budget on the dataset
    delta: float | None
    held: str = ""  # why the release is unpublished (its fit failed a check), else ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql release --json``)."""
        return {"name": self.name, "table": self.table, "release_id": self.release_id,
                "record": self.record, "warnings": self.warnings,
                "remaining": self.remaining.as_dict(self.delta) if self.remaining else None,
                "held": self.held or None}


@operation("release.wait")
def wait_release(session: Session, *, job: int, progress: Progress | None = None) -> Released:
    """Wait for release job ``job`` of this process, reporting its progress.

    An interrupt of the session cancels the job and raises QueryCanceled; the
    charge stays.
    """
    result = session.jobs().wait(job, progress, session.interrupts)
    dataset = result.record["dataset"]["name"]
    standing = session.ledger.budget(session.user, dataset)
    return Released(result.name, result.table, result.release_id, result.record,
                    list(result.warnings), standing.remaining, session.policy.delta,
                    result.held)


@dataclass(frozen=True)
class Published:
    """A held release, published: its table now in ``released`` and its updated record."""

    name: str
    table: str
    release_id: str
    record: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql releases publish --json``)."""
        return {"name": self.name, "table": self.table, "release_id": self.release_id,
                "record": self.record}


@operation("release.publish")
def publish_release(session: Session, *, name: str) -> Published:
    """Publish release ``name``, held because its fit failed its diagnostics (admins; audited)."""
    result = session.publish(name)
    return Published(result.name, result.table, result.release_id, result.record)


@dataclass(frozen=True)
class ReleaseEntry:
    """One release row: who released what, when, and its whole provenance ``record``."""

    release_id: str
    name: str
    dataset: str
    synthesizer: str
    privacy: str
    released_by: str
    released_at: datetime
    superseded_by: str | None
    record: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql releases show --json``)."""
        return {"release_id": self.release_id, "name": self.name, "dataset": self.dataset,
                "synthesizer": self.synthesizer, "privacy": self.privacy,
                "released_by": self.released_by,
                "released_at": self.released_at.isoformat(timespec="seconds"),
                "superseded_by": self.superseded_by, "record": self.record}


@dataclass(frozen=True)
class Releases:
    """Releases, oldest first."""

    releases: list[ReleaseEntry]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"releases": [r.as_dict() for r in self.releases]}


@operation("release.list")
def list_releases(session: Session, *, include_superseded: bool = False) -> Releases:
    """The live releases (and the superseded ones with ``include_superseded``)."""
    from dpsql.provenance import releases

    return Releases([ReleaseEntry(**r) for r in releases(session.store,
                                                         include_superseded=include_superseded)])


@operation("release.show")
def show_release(session: Session, *, name: str) -> ReleaseEntry:
    """The live release ``name`` with its provenance (public: analysts may read it)."""
    from dpsql.provenance import find

    return ReleaseEntry(**find(session.store, name))


@dataclass(frozen=True)
class Synthesizer:
    """A synthesizer as declared, and whether it can run here."""

    name: str
    dp: bool
    dp_when: str | None
    output: str
    summary: str
    extra: str | None
    loadable: bool
    install: str | None  # the command that installs what it lacks

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"name": self.name, "dp": self.dp, "dp_when": self.dp_when,
                "output": self.output, "summary": self.summary, "extra": self.extra,
                "loadable": self.loadable, "install": self.install}


@dataclass(frozen=True)
class Synthesizers:
    """Every declared synthesizer, and the plugins refused (name: why)."""

    synthesizers: list[Synthesizer]
    refused: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"synthesizers": [s.as_dict() for s in self.synthesizers],
                "refused": dict(self.refused)}


@operation("release.synthesizers")
def list_synthesizers(session: Session | None) -> Synthesizers:
    """The synthesizers of this installation, from their declarations (none is imported)."""
    from dpsql.synth import base

    found = []
    for d in base.declarations():
        problem = d.unavailable()
        found.append(Synthesizer(d.name, d.is_dp, d.dp_when or None, d.output, d.summary,
                                 d.extra or None, problem is None,
                                 None if problem is None else d.install()))
    return Synthesizers(found, dict(sorted(base.refused().items())))
