"""A release's worker process: a fresh interpreter, started and checked before the charge.

The owner starts ``python -I -c BOOT`` in ``/`` with a pipe (subprocess: fork
and exec at once, never a bare fork of a multi-threaded process). The worker never
imports the caller's ``__main__``, unlike multiprocessing's "spawn", which runs
a script again in the child and fails a release called from a script with no
``if __name__ == "__main__":`` guard. Startup is a handshake: the owner sends
its ``sys.path`` and the work (a function and its arguments, pickled); the
worker loads them and answers ``ready``. Only then is the request charged, so
a worker that cannot start or load its work (a broken interpreter, a
synthesizer defined in ``__main__``) costs nothing. After the charge the owner
sends ``go`` with the job's folder, and the worker reports progress and its
outcome up the pipe.

The worker dies with its owner: it reads the pipe, and the pipe closes when
the owner dies, so ``kill -9`` of the owner leaves no worker running.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from dpsql.errors import DPSQLError, ReleaseError
from dpsql.progress import Progress

READY_TIMEOUT = 300.0  # seconds for a worker to start and load its work (a loaded host)

#: Run by ``python -I -c`` in ``/``: the caller's ``__main__`` is never imported, and nothing
#: from the current directory or the PYTHON* variables is (isolated mode). The owner's
#: ``sys.path`` comes down the pipe before dpsql is imported: its folders are appended after
#: the interpreter's own, so none can shadow a module of the standard library or of an
#: installed package (a ``signal.py`` planted where the owner runs is never imported).
BOOT = """\
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to act on
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
sys.path.extend(p for p in conn.recv() if p and p not in sys.path)
try:
    from dpsql.worker import main
except BaseException as err:
    conn.send(("refused", type(err).__name__, str(err)))
    raise SystemExit(1) from None
main(conn)
"""

Work = Callable[..., None]


class WorkerFailed(Exception):
    """The worker raised ``name`` (not a dpsql error, so only its type name travels)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Worker:
    """The owner's handle on one worker process (see the module docstring)."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self._process = process
        self._conn = conn

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._process.pid

    @classmethod
    def start(cls, work: Work, args: tuple[Any, ...], *,
              timeout: float = READY_TIMEOUT) -> Worker:
        """Start a worker for ``work(folder, *args, report=...)`` and wait until it is ready.

        Raises ReleaseError when it cannot start or load the work: call it
        before charging, and the request is refused at no cost.
        """
        python = sys.executable
        if not python:
            raise ReleaseError("cannot start a release worker: this Python does not know its "
                               "interpreter (sys.executable is empty); nothing was charged")
        mine, theirs = multiprocessing.Pipe()
        try:
            process = subprocess.Popen([python, "-I", "-c", BOOT, str(theirs.fileno())],
                                       pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                       cwd="/")
        except OSError as err:
            mine.close()
            raise ReleaseError(f"cannot start a release worker ({python}: {err.strerror}); "
                               "nothing was charged") from err
        finally:
            theirs.close()
        worker = cls(process, mine)
        try:
            worker._handshake(work, args, timeout)
        except BaseException:
            worker.kill()
            worker.close()
            raise
        return worker

    def _handshake(self, work: Work, args: tuple[Any, ...], timeout: float) -> None:
        try:
            self._conn.send(list(sys.path))
            self._conn.send((work, args))
        except OSError:  # it died at once; the reply below says how
            pass
        except Exception as err:  # pickling: an option or a synthesizer that cannot travel
            raise ReleaseError(f"the release cannot be sent to a worker process "
                               f"({type(err).__name__}: {err}); a synthesizer and its options "
                               "must be picklable, defined in an importable module; nothing "
                               "was charged") from err
        if not self._conn.poll(timeout):
            raise ReleaseError(f"the release worker did not start within {timeout:.0f} s; "
                               "nothing was charged; try again when the host is less busy")
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            raise ReleaseError("the release worker ended as it started (its error, if any, is "
                               "on stderr); nothing was charged") from None
        if message[0] != "ready":
            _, name, text = message
            hint = (" (a synthesizer defined in the script that runs is not: define it in a "
                    "module)" if "__main__" in text else "")
            raise ReleaseError(f"the release worker cannot load its work ({name}: {text}); a "
                               f"synthesizer must be importable by its module{hint}; nothing "
                               "was charged")

    def run(self, folder: Path, report: Progress) -> None:
        """Let the worker work on ``folder``, relaying its progress, until it is done.

        Raises the worker's DPSQLError, or WorkerFailed with the name of what it
        raised (``WorkerDied`` when it ended without a word: killed, or out of memory).
        """
        try:
            self._conn.send(("go", str(folder)))
            while True:
                message = self._conn.recv()
                if message[0] == "progress":
                    report(*message[1:])
                elif message[0] == "done":
                    return
                else:
                    raise message[2] or WorkerFailed(message[1])
        except (EOFError, OSError):
            raise WorkerFailed("WorkerDied") from None

    def kill(self) -> None:
        """End the worker now (any thread); the owner's pending :meth:`run` then fails."""
        with contextlib.suppress(OSError):
            self._process.kill()

    def close(self) -> None:
        """Close the pipe (an idle worker then exits) and wait for the process to end."""
        self._conn.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            self._process.wait()


# -- in the worker process ----------------------------------------------------------------


def main(conn: Connection) -> None:
    """Load the work, answer ready, then on ``go`` run it and report up the pipe."""
    try:
        work, args = conn.recv()
    except (EOFError, OSError):
        return  # the owner gave up or died before sending the work
    except BaseException as err:  # the work cannot be loaded here: refused before the charge
        conn.send(("refused", type(err).__name__, str(err)))
        return
    conn.send(("ready",))
    try:
        _, folder = conn.recv()
    except (EOFError, OSError):
        return  # refused or cancelled before the work started, or the owner died
    threading.Thread(target=_exit_with_parent, args=(conn,), daemon=True,
                     name="dpsql-parent-watch").start()

    def report(stage: str, done: float, total: float | None = None) -> None:
        conn.send(("progress", stage, done, total))

    try:
        work(Path(folder), *args, report=report)
    except BaseException as err:  # the owner settles the job
        if os.environ.get("DPSQL_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        conn.send(("error", type(err).__name__, err if isinstance(err, DPSQLError) else None))
        return
    conn.send(("done",))


def _exit_with_parent(conn: Connection) -> None:
    """End this process when the owner's end of the pipe closes (the owner died)."""
    with contextlib.suppress(EOFError, OSError):
        conn.recv()
    os._exit(1)
