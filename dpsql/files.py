"""Files and folders dpsql creates are private to their owner, whatever the umask.

A store file holds every sensitive row, the store secret, password verifiers
and the audit log; its write-ahead log holds recent rows too. DuckDB creates
both with the process's umask and has no setting for their mode, and it
deletes and re-creates the ``.wal`` at every checkpoint, so a mode set once
on the file does not last. The one rule that holds by construction is the
process's umask: :func:`private_umask` adds ``077`` to it in every process
that opens a store (the CLI, the server, a release worker, a script calling
``dpsql.connect``), so every file made afterwards is the owner's alone.

Folders dpsql makes for itself (the runtime folder of admin sockets, release
and free-query temporary folders) are made with mode 0700 and checked, not
trusted, when they already exist: another local user may have made them first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from dpsql.errors import ConfigurationError, StoreError

log = logging.getLogger("dpsql.files")

#: The permission bits of group and others: none of them is set on what dpsql makes.
OTHERS = 0o077


def private_umask() -> None:
    """Make every file this process creates from now on private to its owner (umask |= 077).

    Process-wide on purpose (see the module docstring); it only ever removes
    permissions, and it is set once, never swapped back and forth.
    """
    current = os.umask(OTHERS)
    os.umask(current | OTHERS)


def write_private(path: Path, data: str | bytes | Callable[[BinaryIO], None], *,
                  mode: int = 0o600) -> None:
    """Write ``path`` as a new file only its owner may read (``mode``), then move it there.

    ``data`` is text (UTF-8), bytes, or a function that writes to the open file.
    The file is made under a random name in the same folder (``O_EXCL``: never an
    existing file or a planted link), written through its descriptor, and
    renamed onto ``path``: a symbolic link or a file another user planted at
    ``path`` is replaced, never followed or written into, and a failure leaves
    no partial file.
    """
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as out:
            os.fchmod(out.fileno(), mode)
            if callable(data):
                data(out)
            else:
                out.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def private_folder(path: Path) -> Path:
    """``path`` as a folder of ours, mode 0700, for files of private data; made if absent.

    A folder that exists must be ours and not a link; one that others may write
    into (where they may have planted files or links) is refused.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ConfigurationError(
            f"{path} is not a folder of yours that only you may write into (owner uid "
            f"{info.st_uid}, mode {stat.filemode(info.st_mode)}); choose another folder")
    os.chmod(path, 0o700)
    return path


def store_files(path: Path) -> list[Path]:
    """The files of the store at ``path`` that exist now: the database and its WAL."""
    return [p for p in (path, path.with_name(path.name + ".wal")) if p.exists()]


def make_store_private(path: Path) -> list[str]:
    """Give the store's files mode 0600 when others could read them; the notices to show.

    A store (or WAL) of ours that others may read is fixed at once, with a
    notice, rather than refused: refusing would leave it readable until its
    owner acts. One owned by another user cannot be fixed by us and is refused,
    naming the command its owner runs.
    """
    notices = []
    for file in store_files(path):
        info = file.stat()
        if not info.st_mode & OTHERS:
            continue
        mode = stat.filemode(info.st_mode)
        if info.st_uid != os.getuid():
            raise StoreError(f"{file} may be read by other users ({mode}) and belongs to uid "
                             f"{info.st_uid}, not to you; its owner should run: chmod 600 "
                             f"{file}")
        file.chmod(0o600)
        notices.append(f"{file} could be read by other users ({mode}); dpsql made it private "
                       "(chmod 600): a store holds every sensitive row and the password "
                       "verifiers")
    for notice in notices:
        log.warning("%s", notice)
    return notices


def check_private(path: Path, kind: str) -> None:
    """Refuse ``path`` unless it is ours and nobody else may use it (mode 0700 / 0600)."""
    info = os.lstat(path)
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISSOCK
    if not wanted(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & OTHERS:
        raise ConfigurationError(
            f"{path} is not a private {kind} of uid {os.getuid()} (owner uid {info.st_uid}, "
            f"mode {stat.filemode(info.st_mode)}); dpsql refuses to use it: remove it "
            "(dpsql makes a new one) or set XDG_RUNTIME_DIR")


def runtime_dirs() -> list[Path]:
    """The folders this user's runtime files may be in, in the order they are tried.

    ``$XDG_RUNTIME_DIR/dpsql-<uid>`` when that is set (the session's private
    folder), else ``<tmp>/dpsql-<uid>`` and then ``~/.cache/dpsql-run``: anyone
    may create a name in a shared temporary folder before us, so the second is
    used when the first is not a folder of ours.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    name = f"dpsql-{os.getuid()}"
    return [Path(runtime) / name] if runtime else [
        Path(tempfile.gettempdir()) / name, Path.home() / ".cache" / "dpsql-run"]


def runtime_dir() -> Path:
    """The first of :func:`runtime_dirs` that is (or, made now, becomes) a private folder of ours.

    A squatter's folder (or link) is passed over, so it blocks nothing; a
    folder of ours whose mode others may use is refused (we did not make it so).
    """
    candidates = runtime_dirs()
    for candidate in candidates:
        candidate.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            candidate.mkdir(mode=0o700)
        if _ours(candidate):
            return candidate
    raise ConfigurationError(f"no private runtime folder: {', '.join(map(str, candidates))} "
                             "belong to other users; set XDG_RUNTIME_DIR to a folder of yours")


def runtime_file(name: str) -> Path:
    """Where the runtime file ``name`` is, or where a new one goes (:func:`runtime_dir`).

    It is in the first folder of ours that holds it: a server and its clients
    meet there even when the folders of ours changed between their starts (a
    squatter's folder made, then removed).
    """
    for folder in runtime_dirs():
        if os.path.lexists(folder) and _ours(folder) and os.path.lexists(folder / name):
            return folder / name
    return runtime_dir() / name


def _ours(folder: Path) -> bool:
    """Whether ``folder`` is a folder of ours (then it must be private), not a squatter's."""
    info = os.lstat(folder)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
        check_private(folder, "directory")
        return True
    log.warning("%s belongs to uid %d or is not a folder: another user made it; using the "
                "next private folder instead", folder, info.st_uid)
    return False
