"""The shape of a NAPSU-MQ model: canonical features and the junction tree.

The max-entropy model over full marginals of ``cliques`` is over-parametrized:
the indicators of a marginal table's cells are linearly dependent (they sum to
one, and lower-order marginals appear in several tables). The canonical
parametrization (Koller & Friedman 2009, Sec. 4.4.2.1; Abbeel et al. 2006;
the paper's Supplement C) keeps, for every non-empty scope ``D`` inside some
clique, one indicator ``[x_D = v]`` per assignment ``v`` with no component equal
to the reference value 0. These features are linearly independent, together
with the constant span every cell indicator of every clique, and so carry the
same information while making ``theta`` identifiable.

A cell indicator is recovered from the features through a Kronecker product:
per column, ``[x_j = 0] = 1 - sum_u [x_j = u]`` and ``[x_j = w] = [x_j = w]``.
:func:`cell_map` builds that matrix for any measured scope.

:class:`Structure` is frozen and hashable so that compiled JAX functions can be
cached per model structure and reused across fits, chains and copies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dpsql.errors import ConfigurationError
from dpsql.synth.spanning import spanning_forest

MAX_CLIQUE_CELLS = 200_000  # a junction-tree clique larger than this is refused


@dataclass(frozen=True)
class Structure:
    """Model structure: column sizes, cliques, canonical features and a junction tree.

    ``cliques`` are the scopes of the marginals the model matches (column
    indices, sorted). ``tree`` holds the junction tree's cliques (sorted column
    indices) in an order where every parent precedes its children;
    ``parent[i]`` is the index of the parent of tree clique ``i`` (-1 for a root).
    """

    sizes: tuple[int, ...]
    cliques: tuple[tuple[int, ...], ...]
    tree: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]

    @classmethod
    def build(cls, sizes: Sequence[int], cliques: Sequence[Sequence[int]]) -> Structure:
        """The structure for ``cliques`` over columns of ``sizes`` (each column in a clique)."""
        sizes = tuple(int(s) for s in sizes)
        scopes = _maximal(sorted({tuple(sorted(set(c))) for c in cliques if c}))
        covered = {j for c in scopes for j in c}
        if covered != set(range(len(sizes))):
            missing = sorted(set(range(len(sizes))) - covered)
            raise ConfigurationError(f"columns {missing} are in no clique")
        tree, parent = junction_tree(sizes, scopes)
        return cls(sizes, tuple(scopes), tree, parent)

    # -- canonical features ---------------------------------------------------------
    @cached_property
    def scopes(self) -> tuple[tuple[int, ...], ...]:
        """Every non-empty scope inside some clique with at least one feature, ordered."""
        closed = {s for c in self.cliques for r in range(1, len(c) + 1)
                  for s in itertools.combinations(c, r)}
        return tuple(sorted((s for s in closed if all(self.sizes[j] > 1 for j in s)),
                            key=lambda s: (len(s), s)))

    @cached_property
    def offsets(self) -> dict[tuple[int, ...], int]:
        """Index of each scope's first feature in ``theta``."""
        out, at = {}, 0
        for scope in self.scopes:
            out[scope] = at
            at += self.scope_features(scope)
        return out

    def scope_features(self, scope: Sequence[int]) -> int:
        """Number of canonical features of ``scope``: prod(k_j - 1)."""
        return math.prod(self.sizes[j] - 1 for j in scope)

    @property
    def dim(self) -> int:
        """Number of canonical parameters (the length of ``theta``)."""
        return sum(self.scope_features(s) for s in self.scopes)

    # -- theta -> junction-tree log-potentials --------------------------------------------
    @cached_property
    def assigned(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per tree clique, the scopes whose parameters live in its log-potential.

        Each scope goes to the first tree clique that contains it.
        """
        out: list[list[tuple[int, ...]]] = [[] for _ in self.tree]
        for scope in self.scopes:
            home = next(i for i, c in enumerate(self.tree) if set(scope) <= set(c))
            out[home].append(scope)
        return tuple(tuple(s) for s in out)

    def tree_shape(self, i: int) -> tuple[int, ...]:
        """Table shape of tree clique ``i``."""
        return tuple(self.sizes[j] for j in self.tree[i])

    def separator(self, i: int) -> tuple[int, ...]:
        """Columns tree clique ``i`` shares with its parent (sorted; empty for a root)."""
        p = self.parent[i]
        return () if p < 0 else tuple(j for j in self.tree[i] if j in self.tree[p])


def _maximal(scopes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Drop scopes contained in another scope."""
    return [s for s in scopes if not any(set(s) < set(t) for t in scopes)]


def junction_tree(sizes: Sequence[int], cliques: Sequence[Sequence[int]]
                  ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """A junction tree (forest) of the graph whose cliques are ``cliques``.

    Triangulates by greedy elimination (fewest added table cells first, the
    min-weight heuristic), keeps the maximal elimination cliques, joins them by
    a maximum spanning tree on separator size, and orders each component from
    its largest clique down. Returns (tree cliques, parent indices).
    """
    d = len(sizes)
    adj: dict[int, set[int]] = {j: set() for j in range(d)}
    for c in cliques:
        for a, b in itertools.combinations(c, 2):
            adj[a].add(b)
            adj[b].add(a)
    left = set(range(d))
    found: list[tuple[int, ...]] = []

    def weight(v: int) -> tuple[int, int]:
        nb = adj[v] & left
        fill = sum(1 for a, b in itertools.combinations(nb, 2) if b not in adj[a])
        return math.prod(sizes[j] for j in nb | {v}), fill

    while left:
        v = min(sorted(left), key=weight)
        clique = tuple(sorted((adj[v] & left) | {v}))
        for a, b in itertools.combinations(adj[v] & left, 2):
            adj[a].add(b)
            adj[b].add(a)
        left.remove(v)
        found.append(clique)
    tree_cliques = _maximal(sorted(set(found)))
    for c in tree_cliques:
        cells = math.prod(sizes[j] for j in c)
        if cells > MAX_CLIQUE_CELLS:
            raise ConfigurationError(
                f"the chosen marginals make a model clique of {cells:,} cells (columns {list(c)});"
                " choose fewer or sparser marginals, or coarser bins")
    return _spanning_tree(tree_cliques)


def _spanning_tree(cliques: list[tuple[int, ...]]
                   ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    edges = sorted(((len(set(a) & set(b)), i, j)
                    for (i, a), (j, b) in itertools.combinations(enumerate(cliques), 2)
                    if set(a) & set(b)), key=lambda e: (-e[0], e[1], e[2]))
    links: dict[int, set[int]] = {i: set() for i in range(len(cliques))}
    for i, j in spanning_forest(range(len(cliques)), [(i, j) for _, i, j in edges]):
        links[i].add(j)
        links[j].add(i)
    order: list[int] = []
    parent_of: dict[int, int] = {}
    seen: set[int] = set()
    by_size = sorted(range(len(cliques)), key=lambda i: (-len(cliques[i]), i))
    for start in by_size:
        if start in seen:
            continue
        seen.add(start)
        parent_of[start] = -1
        queue = [start]
        while queue:
            i = queue.pop(0)
            order.append(i)
            for j in sorted(links[i]):
                if j not in seen:
                    seen.add(j)
                    parent_of[j] = i
                    queue.append(j)
    position = {old: new for new, old in enumerate(order)}
    tree = tuple(cliques[i] for i in order)
    parent = tuple(-1 if parent_of[i] < 0 else position[parent_of[i]] for i in order)
    return tree, parent


def cell_map(structure: Structure, scope: Sequence[int]) -> np.ndarray:
    """Matrix mapping ``[1, features]`` to the cell indicators of the marginal over ``scope``.

    Row ``w`` (cells in C order of ``scope``) gives ``[x_scope = w]`` as a linear
    combination of the constant (column 0) and the canonical features (column
    ``1 + index``). ``scope`` must lie inside one of the model's cliques.
    """
    scope = tuple(scope)
    if scope and not any(set(scope) <= set(c) for c in structure.cliques):
        raise ConfigurationError(f"columns {list(scope)} are not inside one model clique")
    # Per column: basis (1, [x=1], ..., [x=k-1]) -> cells [x=0], ..., [x=k-1].
    blocks = []
    for j in scope:
        k = structure.sizes[j]
        block = np.eye(k)
        block[0, 1:] = -1.0
        blocks.append(block)
    kron: np.ndarray = np.ones((1, 1))
    for block in blocks:
        kron = np.kron(kron, block)
    # Columns of the Kronecker basis: each picks, per column, the constant (0) or a value.
    out = np.zeros((kron.shape[0], structure.dim + 1))
    for col, pick in enumerate(itertools.product(*(range(structure.sizes[j]) for j in scope))):
        chosen = sorted((j, v) for j, v in zip(scope, pick, strict=True) if v > 0)
        if not chosen:
            out[:, 0] += kron[:, col]
            continue
        sub = tuple(j for j, _ in chosen)
        flat = 0
        for j, v in chosen:
            flat = flat * (structure.sizes[j] - 1) + (v - 1)
        out[:, 1 + structure.offsets[sub] + flat] += kron[:, col]
    return out
