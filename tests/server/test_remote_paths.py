"""A remote administrator (CALL dpsql, the console) names no file of the server, in any command.

Every command's every path parameter is tried with a path on the server (the
store's own file first, which an earlier exemption let through), so a command
added later with a path of its own is covered without editing this test.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

import dpsql
from dpsql.cli import _load_commands, cli
from dpsql.commands.common import AdminCommand, CallerOption, LocalFile, LocalPath
from dpsql.errors import AccessDenied, ConfigurationError
from dpsql.imports import tables
from dpsql.server import procedure


def commands(group: click.Group, words: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command below ``group`` with the words that name it."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*words, name))
        else:
            yield (*words, name), command


def path_parameters(command: click.Command) -> list[click.Parameter]:
    """Its parameters that name a file (--db's default, the served store, excepted)."""
    return [p for p in command.params if isinstance(p.type, LocalPath | LocalFile)
            and not isinstance(p, CallerOption)]


def command_lines(target: str) -> Iterator[str]:
    """A command line for each path parameter of each command, giving it ``target``."""
    _load_commands()
    for words, command in commands(cli):
        if not isinstance(command, AdminCommand):  # the terminal's own (init, serve, shell)
            continue
        for param in path_parameters(command):
            args = list(words)
            for other in command.params:  # the other required arguments, plausibly filled
                if isinstance(other, click.Argument) and other is not param and other.required:
                    args.append("adult")
            if isinstance(param, click.Argument):
                args.insert(len(words) + command.params.index(param), target)
            else:
                args += [param.opts[0], target]
            yield shlex.join(args)


def test_every_command_with_a_path_is_covered():
    lines = list(command_lines("/x"))
    for expected in ("policy check /x", "policy apply /x", "policy draft /x",
                     "policy draft --output /x", "export adult /x", "query -f /x",
                     "evaluate adult --out /x"):
        assert expected in lines, lines  # the walk finds the commands known to take paths


@pytest.fixture
def admin_with_release(store_path: Path) -> Iterator[dpsql.Session]:
    with dpsql.connect(store_path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="adult", epsilon=1, rows=50,
                      seed=1)
        yield admin


def test_the_terminals_own_commands_do_not_run_remotely(admin_with_release):
    _load_commands()
    own = [words for words, command in commands(cli) if not isinstance(command, AdminCommand)]
    assert {("init",), ("serve",), ("shell",), ("demo",)} <= set(own)
    for words in own:
        with pytest.raises(ConfigurationError, match="runs over SQL"):
            procedure.call(admin_with_release, " ".join(words))


def test_a_remote_caller_names_no_path_in_any_command(admin_with_release, store_path, tmp_path):
    for target in (str(store_path), str(tmp_path / "elsewhere.yaml"), "-", "relative.yaml"):
        for line in command_lines(target):
            with pytest.raises(AccessDenied, match="no file of the server") as refused:
                procedure.call(admin_with_release, line)
            assert refused.value.code == "access_denied", line
    # evaluate writes its report to a default path: refused as well
    with pytest.raises(AccessDenied, match="no file of the server"):
        procedure.call(admin_with_release, "evaluate adult")
    assert not (tmp_path / "elsewhere.yaml").exists()
    assert not list(store_path.parent.glob("*_report"))
    assert tables(admin_with_release.store)  # the store is whole


def test_the_reported_overwrite_of_the_live_store_is_refused(admin_with_release, store_path):
    for line in (f"policy draft --table adult -o {store_path}", f"policy check {store_path}",
                 f"policy draft --table adult -o {store_path}.wal"):
        with pytest.raises(AccessDenied):
            procedure.call(admin_with_release, line)
    answer = procedure.call(admin_with_release, "budget show --json")
    assert answer.table is not None
    assert answer.table.num_rows >= 2  # the ledger is intact
