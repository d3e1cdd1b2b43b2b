"""The house's floors: no import circle in dpsql, and every import goes down the layers.

The layers are listed once, in docs/architecture.md (the ```layers block, top
first); this test reads them there. An import counts wherever it is written: at
module top, inside a function (a lazy import ties two modules as much as any) or
under ``TYPE_CHECKING`` (a type named from above is a dependency on above too).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpsql"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The dpsql modules ``name`` imports: anywhere in it, ``TYPE_CHECKING`` blocks too.

    ``from package import module`` counts as an import of the module.
    """
    tree = ast.parse(path.read_text("utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    names = set(known)
    return {name: imports(name, path, names) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def layers() -> list[list[str]]:
    """The layers of docs/architecture.md, top first: each a list of module patterns."""
    text = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block is not None, "docs/architecture.md has no ```layers block"
    rows = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    return [[p.strip() for p in row.split(",") if p.strip()] for row in rows if row]


def layer_of(name: str, floors: list[list[str]]) -> int:
    """The floor (0 = top) of module ``name``: where the longest entry that covers it stands.

    The block names modules and packages relative to ``dpsql`` (``cli``,
    ``query.answer``); an entry covers its module and everything under it, and a
    longer entry (``synth.base``) places a module apart from its package (``synth``).
    ``__init__`` is the package ``dpsql`` itself.
    """
    relative = name.partition(".")[2] or "__init__"
    covering = [(len(p), number) for number, patterns in enumerate(floors) for p in patterns
                if relative == p or relative.startswith(p + ".")]
    if not covering:
        raise AssertionError(f"{name} is on no floor of docs/architecture.md's layers")
    return max(covering)[1]


def upward(edges: dict[str, set[str]], floors: list[list[str]]) -> Iterator[str]:
    for name, targets in sorted(edges.items()):
        mine = layer_of(name, floors)
        for target in sorted(targets):
            theirs = layer_of(target, floors)
            if theirs < mine:
                yield f"{name} (floor {mine}) imports {target} (floor {theirs}, above it)"


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_import_goes_down_the_layers() -> None:
    floors = layers()
    wrong = list(upward(graph(), floors))
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_a_circle_and_an_upward_import() -> None:
    """The checks themselves, on made-up graphs: a circle and an upward edge are found."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    floors = [["cli"], ["store"]]
    assert list(upward({"dpsql.store": {"dpsql.cli"}, "dpsql.cli": set()}, floors)) == [
        "dpsql.store (floor 1) imports dpsql.cli (floor 0, above it)"]


#: The modules still over the limit, each with the size it may not grow past: a ratchet.
#: Splitting one takes it off this list (the test fails while it is listed but short).
OVER_THE_LIMIT: dict[str, int] = {}
LIMIT = 500


def test_every_module_is_under_500_lines_or_shrinking() -> None:
    sizes = {name: len(path.read_text("utf-8").splitlines()) for name, path in modules().items()}
    grown = {name: n for name, n in sizes.items()
             if n > OVER_THE_LIMIT.get(name, LIMIT)}
    assert not grown, f"modules over {LIMIT} lines (split them) or grown past their ceiling: " \
        f"{grown}"
    split = [name for name in OVER_THE_LIMIT if sizes.get(name, 0) <= LIMIT]
    assert not split, f"{split} are within {LIMIT} lines now: take them off OVER_THE_LIMIT"
