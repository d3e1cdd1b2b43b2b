"""Union-find and spanning forests, the one copy MST, AIM's MST and NAPSU-MQ share."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpsql.synth.spanning import UnionFind, components, grow, spanning_forest


def test_union_find_joins_and_counts_components() -> None:
    forest = UnionFind("abcde")
    assert forest.count == 5
    assert forest.apart("a", "b")
    assert forest.union("a", "b")
    assert forest.union("c", "d")
    assert not forest.union("b", "a")  # already one
    forest.join("dce")
    assert forest.count == 2
    assert not forest.apart("c", "e")
    assert forest.apart("a", "e")
    groups = forest.components()
    assert groups["a"] == groups["b"] != groups["c"] == groups["d"] == groups["e"]


def test_components_of_cliques() -> None:
    groups = components(["a", "b", "c", "d"], [("a", "b", "c")])
    assert len({groups[c] for c in "abc"}) == 1
    assert groups["d"] == "d"


def test_spanning_forest_is_kruskal_in_the_order_given() -> None:
    edges = [(0, 1), (1, 2), (0, 2), (3, 4), (2, 3)]
    assert spanning_forest(range(5), edges) == [(0, 1), (1, 2), (3, 4), (2, 3)]
    assert spanning_forest(range(5), edges, joined=[(0, 1, 2)]) == [(3, 4), (2, 3)]
    assert spanning_forest(range(4), [(0, 1)]) == [(0, 1)]  # a forest when the graph is cut


def brute_force_maximum(nodes: int, weight: dict[tuple[int, int], int]) -> int:
    """The heaviest spanning tree's weight, by trying every set of nodes - 1 edges."""
    best = -1
    for tree in itertools.combinations(weight, nodes - 1):
        if len(spanning_forest(range(nodes), tree)) == nodes - 1:
            best = max(best, sum(weight[e] for e in tree))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_heaviest_first_gives_a_maximum_spanning_tree(seed: int) -> None:
    rng = np.random.default_rng(seed)
    weight = {e: int(rng.integers(0, 20)) for e in itertools.combinations(range(5), 2)}
    heaviest = sorted(weight, key=lambda e: -weight[e])
    tree = spanning_forest(range(5), heaviest)
    assert len(tree) == 4
    assert sum(weight[e] for e in tree) == brute_force_maximum(5, weight)


def test_grow_offers_only_edges_that_join_two_components() -> None:
    offered: list[list[tuple[str, str]]] = []

    def first(live: list[tuple[str, str]]) -> tuple[str, str]:
        offered.append(live)
        return live[0]

    candidates = list(itertools.combinations("abcd", 2))
    chosen = grow("abcd", candidates, first, joined=[("a", "b")])
    assert chosen == [("a", "c"), ("a", "d")]
    assert offered[0] == [e for e in candidates if e != ("a", "b")]
    assert ("b", "c") not in offered[1]
    assert ("c", "d") in offered[1]


def test_grow_stops_when_nothing_fits_or_after_its_rounds() -> None:
    candidates = list(itertools.combinations("abcd", 2))
    last = grow("abcd", candidates, lambda live: live[-1], fits=lambda e: "d" not in e)
    assert last == [("b", "c"), ("a", "c")]  # d never joins: a forest
    assert len(grow("abcd", candidates, lambda live: live[0], rounds=1)) == 1
