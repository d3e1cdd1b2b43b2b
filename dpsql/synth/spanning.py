"""Union-find and spanning forests: the one copy the synthesizers that grow trees share.

- MST (:mod:`dpsql.synth.aim`) and NAPSU-MQ's selection (:mod:`dpsql.synth.napsu_mq.mst`)
  pick a tree of 2-way marginals one edge a round, each round a private choice
  among the pairs that join two components (:func:`grow`);
- NAPSU-MQ's cost estimate (the heaviest forest it may grow) and its junction tree
  (cliques joined by a maximum spanning tree on separator size) are Kruskal's
  algorithm: :func:`spanning_forest` over edges sorted heaviest first.

Everything here is public arithmetic on column names and on choices already made
privately: it reads no data and costs no budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)
Edge = tuple[T, T]


class UnionFind(Generic[T]):
    """Disjoint sets of ``items`` (path halving): which are already joined."""

    def __init__(self, items: Iterable[T]) -> None:
        self._parent: dict[T, T] = {x: x for x in items}
        self.count = len(self._parent)  # the number of components

    def find(self, x: T) -> T:
        """The representative of ``x``'s component."""
        parent = self._parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def apart(self, a: T, b: T) -> bool:
        """Whether ``a`` and ``b`` are in different components (an edge would join them)."""
        return self.find(a) != self.find(b)

    def union(self, a: T, b: T) -> bool:
        """Join the components of ``a`` and ``b``; False when they were one already."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self._parent[ra] = rb
        self.count -= 1
        return True

    def join(self, group: Iterable[T]) -> None:
        """Join every item of ``group`` into one component (a clique)."""
        for a, b in itertools.pairwise(group):
            self.union(a, b)

    def components(self) -> dict[T, T]:
        """Each item's representative: equal exactly for items of one component."""
        return {x: self.find(x) for x in self._parent}


def components(items: Iterable[T], groups: Iterable[Iterable[T]]) -> dict[T, T]:
    """Each item's representative once every group (clique) is joined."""
    forest: UnionFind[T] = UnionFind(items)
    for group in groups:
        forest.join(group)
    return forest.components()


def spanning_forest(items: Iterable[T], edges: Iterable[Edge[T]],
                    joined: Iterable[Iterable[T]] = ()) -> list[Edge[T]]:
    """Kruskal: the edges, in the order given, that join two components.

    The components start from ``joined`` (groups already one). Sorted heaviest
    first, the edges give a maximum spanning forest.
    """
    forest: UnionFind[T] = UnionFind(items)
    for group in joined:
        forest.join(group)
    return [(a, b) for a, b in edges if forest.union(a, b)]


def grow(items: Iterable[T], candidates: Sequence[Edge[T]],
         choose: Callable[[list[Edge[T]]], Edge[T]], *, joined: Iterable[Iterable[T]] = (),
         rounds: int | None = None,
         fits: Callable[[Edge[T]], bool] | None = None) -> list[Edge[T]]:
    """A tree grown one chosen edge a round (MST selection); the edges chosen, in order.

    Each round ``choose`` gets the candidates (in their order) that join two
    components, and fit when ``fits`` is given, and returns one of them. It
    stops after ``rounds`` (default: until the items are spanned) or when no
    candidate is left; fewer edges than rounds then means a forest.
    """
    forest: UnionFind[T] = UnionFind(items)
    for group in joined:
        forest.join(group)
    limit = forest.count - 1 if rounds is None else rounds
    chosen: list[Edge[T]] = []
    while len(chosen) < limit:
        live = [e for e in candidates if forest.apart(*e) and (fits is None or fits(e))]
        if not live:
            break
        pick = choose(live)
        forest.union(*pick)
        chosen.append(pick)
    return chosen
