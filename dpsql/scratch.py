"""Release jobs' private temporary folders: marked with their owner, removed on every exit.

A job's folder holds the bounded source's contingency table over the release's
columns while the fit runs. Its owner removes it when the job ends, however it
ends. An owner killed with SIGKILL cannot, so the folder carries a marker
naming the store and the owner process (pid and start time), written before
anything else goes in. When the store is next opened, :func:`sweep` removes
its folders whose owner has ended. The job row records the folder too, but
only once a store transaction commits, which may wait behind other writes: a
kill in between used to leave the folder with nobody to remove it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PREFIX = "dpsql-release-"
MARKER = "owner.json"

log = logging.getLogger("dpsql.scratch")


@contextlib.contextmanager
def folder(store: Path) -> Iterator[Path]:
    """A new private folder (0700) for a job of ``store``, marked, removed on exit."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        owner = {"store": str(store), "file": _identity(store), "pid": os.getpid(),
                 "started": _started(os.getpid()), "pid_namespace": _pid_namespace()}
        (path / MARKER).write_text(json.dumps(owner), "utf-8")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep(store: Path) -> list[Path]:
    """Remove the folders that jobs of ``store`` left behind when their owner died.

    Only this user's marked folders for this store whose owner process has
    ended (or, in another pid namespace, where that cannot be told, trusting
    the store's lock, which only a dead owner gives up with a job running).
    """
    removed = []
    identity = _identity(store)
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX):
                continue
            path = Path(entry.path)
            owner = _owner(path)
            if owner is None or (owner.get("store") != str(store)
                                 and owner.get("file") != identity):
                continue
            if _alive(owner):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            log.warning("removed %s, left by release job process %s of %s, which ended",
                        path, owner.get("pid"), store)
    return removed


def _owner(path: Path) -> dict[str, Any] | None:
    """The marker of ``path`` when it is a private folder of this user, else None."""
    try:
        info = os.lstat(path)
        if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                or info.st_mode & 0o077):
            return None
        owner = json.loads((path / MARKER).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _alive(owner: dict[str, Any]) -> bool:
    """Whether the process that made a folder still runs (a zombie has ended)."""
    if owner.get("pid_namespace") != _pid_namespace():
        return False  # no view of its processes from here: the store's lock decides
    pid = owner["pid"]
    if pid == os.getpid():
        return True
    started = _started(pid)
    if started is not None:
        return started == owner.get("started")  # a pid used again by another process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs as another user
        return True
    return _state(pid) not in ("Z", "X")


def _identity(path: Path) -> list[int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return [info.st_dev, info.st_ino]


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (Linux), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, Linux), None if unknown or ended."""
    fields = _proc_stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _state(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[0] if fields else None


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
