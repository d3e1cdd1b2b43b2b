"""The dpsql command line, shared by the CLI and ``CALL dpsql('...')``: grammar, flows, text.

Each command on a store is declared once (:mod:`~dpsql.commands.common`): its
options and help, and a flow that runs typed operations of :mod:`dpsql.admin`
through a :class:`~dpsql.commands.door.Door` and renders their results as text
(pure functions, in each module and :mod:`~dpsql.commands.render`). The CLI
(:mod:`dpsql.cli`) runs the flows at a terminal; ``CALL dpsql`` parses the same
command line without running click (:func:`~dpsql.commands.common.parse`) and
runs the flow with its own door, which refuses every file and prompt.

Modules: ``admin`` (policy, budget, audit), ``user``, ``release`` (and
``release_text``), ``jobs``, ``query``. Each imports what a command runs inside
it, so that ``--help`` loads no heavy module.
"""

from __future__ import annotations

import importlib

#: The modules that declare commands on the root group.
MODULES = ("admin", "jobs", "query", "release", "user")


def load() -> None:
    """Declare every command (importing each module once)."""
    for module in MODULES:
        importlib.import_module(f"dpsql.commands.{module}")
