"""The docs are true: every snippet in README.md and docs/*.md runs, every repo path exists.

Each fenced block is read by its info string:

- ``python``: runs as a script in a subprocess;
- ``sh`` / ``bash`` / ``console``: every command line runs through bash, in order (a line
  ending in a backslash joined to the next), except installs and other programs' clients:
  ``pip``, ``python3 -m venv``, ``psql``, ``python examples/...`` (tests/test_examples.py runs
  the examples). ``export`` sets the environment of the lines after it. ``dpsql serve``
  starts in the background on a free port; later blocks' ``5433`` and password placeholders
  (``password=...``, ``:PASSWORD@``) become that port and the password typed at
  ``dpsql user add``'s two prompts; every other prompt reads ``y``. The server stops
  before the first block that does not name port 5433 (it holds the store's write lock);
- ``sql``: each statement runs through ``Session.sql`` as the analyst ``alice``;
- ``yaml``: a block with ``datasets:`` loads through ``dpsql.policy.Policy``;
- no info string: output, a transcript or a layout, never run; such a block may not begin
  like a command or code (tag it instead).

Blocks of one document run in order in one directory, a copy of the user's checkout: the
repository's top-level entries linked in, ``DPSQL_DB=adult.duckdb``, and the store the
README's set-up builds (``adult.duckdb`` from the bundled Adult sample, unless
the document builds it itself; ``acs.duckdb`` from the ACS test sample for documents that
name it), so a block sees what the blocks above it made.

A block that cannot run on purpose carries ``<!-- illustrative: why -->`` on the line just
before its fence; the marker is visible in the source and must say why. Blocks that release
with ``napsu_mq`` or ``modp`` (and the blocks after them in their document) are slow.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import dpsql
from dpsql.policy import Policy

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(.*)$")
ILLUSTRATIVE = re.compile(r"^<!-- illustrative: \S.* -->$")
SHELLS = {"sh", "bash", "console", "shell"}
RUN = {"python", "sql", "yaml", *SHELLS}
SLOW = re.compile(r"--synth (napsu_mq|modp)\b|synthesizer=\"(napsu_mq|modp)\"|get\(\"modp\"")
CODE_START = re.compile(r"^(dpsql |import |from \S+ import |SELECT |with dpsql)")
ADULT_INIT = ("dpsql init adult.duckdb --policy policies/adult.yaml "
              "--import adult=dpsql/data/adult_sample.csv")
ACS_INIT = ("dpsql init acs.duckdb --policy policies/acs.yaml --na N "
            "--import acs=tests/data/acs_sample.csv")
#: Installs, other programs' clients and the examples (tests/test_examples.py runs those).
SKIP = re.compile(r"^(python3? |psql |pip |\. )|pip install|-m venv")
PASSWORD = "docs-password"
PLACEHOLDERS = {"port=5433": "port={port}", ":5433/": ":{port}/",
                "password=...": f"password={PASSWORD}", ":PASSWORD@": f":{PASSWORD}@"}
TIMEOUT = 1200  # seconds; the slowest snippet (a modp release) takes about 2 minutes


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string, its text and whether it runs."""

    doc: Path
    line: int
    lang: str
    text: str
    illustrative: bool
    slow: bool

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` in order; a block after a slow one is slow too."""
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    start = lang = None
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if not fence:
            continue
        if start is None:
            start, lang = number, fence.group(1).strip()
            continue
        text = "\n".join(lines[start:number - 1]) + "\n"
        marked = start >= 2 and bool(ILLUSTRATIVE.match(lines[start - 2].strip()))
        slow = bool(SLOW.search(text)) or any(b.slow for b in found)
        found.append(Block(doc, start, lang, text, marked, slow))
        start = None
    assert start is None, f"{doc.name}:{start}: a fence is never closed"
    return found


ALL = [b for doc in DOCS for b in blocks(doc)]
RUNNABLE = [b for b in ALL if b.lang in RUN and not b.illustrative]


def commands(text: str) -> list[str]:
    """The command lines of a shell block (continuations joined), installs and clients left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip().removeprefix("$ ") for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#") and not SKIP.search(line)]


def answers(command: str) -> str:
    """What a user types at the command's prompts: a password twice, or yes."""
    return f"{PASSWORD}\n{PASSWORD}\n" if command.startswith("dpsql user add") else "y\n"


def statements(text: str) -> list[str]:
    """The statements of a SQL block, comments dropped."""
    code = re.sub(r"--[^\n]*", "", text)
    return [s.strip() for s in code.split(";") if s.strip()]


class Checkout:
    """A directory standing in for a user's checkout, where one document's blocks run."""

    def __init__(self, doc: Path, where: Path) -> None:
        self.where = where
        for entry in ROOT.iterdir():
            if not entry.name.startswith(".") and entry.name not in ("README.md", "docs"):
                (where / entry.name).symlink_to(entry)
        self.env = {**os.environ, "DPSQL_DB": "adult.duckdb",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
        self.done = 0
        self.server: subprocess.Popen[str] | None = None
        self.port = 0
        text = doc.read_text()
        if "dpsql init adult.duckdb" not in text:
            self.shell(ADULT_INIT)
        if "acs.duckdb" in text and "dpsql init acs.duckdb" not in text:
            self.shell(ACS_INIT)

    def shell(self, command: str) -> None:
        if command.startswith("export "):
            name, _, value = shlex.split(command, comments=True)[1].partition("=")
            self.env[name] = value
            return
        if command.startswith("dpsql serve"):
            self.serve(command)
            return
        result = subprocess.run(["bash", "-c", command], cwd=self.where, env=self.env,
                                input=answers(command), capture_output=True, text=True,
                                start_new_session=True, timeout=TIMEOUT)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"

    def serve(self, command: str) -> None:
        """Start the server in the background on a free port (the doc's 5433 may be taken)."""
        command = re.sub(r"--port \d+", "", command.partition("#")[0]) + " --port 0"
        log = self.where / "serve.log"
        with log.open("w") as out:
            self.server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.where,
                                           env=self.env, stdout=out, stderr=out,
                                           start_new_session=True)
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on [\d.]+:(\d+)", log.read_text())):
            assert self.server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        self.port = int(found.group(1))

    def stop(self) -> None:
        if self.server:
            self.server.terminate()
            self.server.wait(timeout=30)
            self.server = None

    def python(self, code: str) -> None:
        for placeholder, value in PLACEHOLDERS.items():
            code = code.replace(placeholder, value.format(port=self.port))
        result = subprocess.run([sys.executable, "-c", code], cwd=self.where, env=self.env,
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-3000:]

    def sql(self, code: str) -> None:
        with dpsql.connect(self.where / "adult.duckdb", user="alice") as alice:
            for statement in statements(code):
                alice.sql(statement)

    def run(self, block: Block) -> None:
        if "5433" not in block.text:
            self.stop()       # as a user must before opening the store another way
        if block.lang == "python":
            self.python(block.text)
        elif block.lang in SHELLS:
            for command in commands(block.text):
                self.shell(command)
        elif block.lang == "sql":
            self.sql(block.text)
        elif block.lang == "yaml" and "datasets:" in block.text:
            path = self.where / "snippet.yaml"
            path.write_text(block.text)
            Policy.load(path)


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """One checkout per document, made on first use and kept for the blocks after."""
    made: dict[Path, tuple[Checkout, list[Block]]] = {}

    def upto(block: Block) -> Checkout:
        if block.doc not in made:
            where = tmp_path_factory.mktemp(block.doc.stem)
            runnable = [b for b in RUNNABLE if b.doc == block.doc]
            made[block.doc] = Checkout(block.doc, where), runnable
        checkout, runnable = made[block.doc]
        while runnable[checkout.done] != block:
            checkout.done += 1
            checkout.run(runnable[checkout.done - 1])
        checkout.done += 1
        return checkout

    yield upto
    for checkout, _ in made.values():
        checkout.stop()


def _run(block: Block, checkouts) -> None:
    checkouts(block).run(block)


@pytest.mark.parametrize("block", [b for b in RUNNABLE if not b.slow], ids=lambda b: b.name)
def test_snippet_runs(block: Block, checkouts) -> None:
    _run(block, checkouts)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.slow], ids=lambda b: b.name)
def test_slow_snippet_runs(block: Block, checkouts) -> None:
    _run(block, checkouts)


def test_untagged_blocks_are_not_code() -> None:
    code = [b.name for b in ALL if not b.lang and CODE_START.match(b.text)]
    assert not code, f"tag these blocks (```sh, ```python, ```sql) so they run: {code}"


def test_every_info_string_is_known() -> None:
    # ```layers is data: tests/test_architecture.py reads docs/architecture.md's floors there
    unknown = [(b.name, b.lang) for b in ALL if b.lang and b.lang not in RUN | {"text", "layers"}]
    assert not unknown


def test_markers_stand_before_a_block() -> None:
    starts = {(b.doc, b.line) for b in ALL}
    stray = [f"{doc.name}:{n}" for doc in DOCS
             for n, line in enumerate(doc.read_text().splitlines(), 1)
             if line.strip().startswith("<!-- illustrative") and (doc, n + 1) not in starts]
    assert not stray, "an illustrative marker must sit on the line before a fence"


TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
BACKTICKED = re.compile(r"`([^`\s]+)`")
LINKED = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def mentioned_paths(doc: Path) -> list[tuple[str, Path]]:
    """Paths a reader would look for: backticked repo paths, relative links, anything ../."""
    text = doc.read_text()
    found = []
    for token in BACKTICKED.findall(text):
        token = token.rstrip(".,:;")
        first = token.split("/")[0]
        if "/" in token and (first in TOP or first == "..") and not re.search(r"[<>*{}$=]", token):
            found.append((token, ROOT / token))
    for link in LINKED.findall(text):
        if "://" not in link and not link.startswith("mailto:"):
            found.append((link, doc.parent / link))
    return found


def inside_checkout(path: Path) -> bool:
    """Whether ``path`` exists within the repository (``../shared`` is not a user's)."""
    real = path.resolve()
    return real.exists() and (real == ROOT or ROOT in real.parents)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_mentioned_paths_exist_in_the_checkout(doc: Path) -> None:
    missing = [text for text, path in mentioned_paths(doc) if not inside_checkout(path)]
    assert not missing, f"{doc.name} names paths a checkout does not have: {missing}"


def test_the_checkout_check_sees_a_missing_path(tmp_path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("see `examples/no_such.py`, `../shared/data/a.csv` and [it](nowhere.md)\n")
    named = [text for text, path in mentioned_paths(doc) if not inside_checkout(path)]
    assert named == ["examples/no_such.py", "../shared/data/a.csv", "nowhere.md"]


def test_shell_blocks_run_dpsql_commands_only() -> None:
    text = ("python3 -m venv .venv && pip install .\n"
            "dpsql release adult --synth joint \\\n    --name t   # comment\n"
            "dpsql serve --db x\n$ dpsql audit\n")
    assert commands(text) == ["dpsql release adult --synth joint  --name t   # comment",
                              "dpsql serve --db x", "dpsql audit"]
