"""The lanes of a sweep (depthlab.targets.stream.lanes): each born where it first differs from the base, the live
ones a prefix of the slots, and each layer applied to the runs of lanes that do not skip it, zeroing what they zero."""

from __future__ import annotations

from depthlab.targets.stream.lanes import Lane, Layout, removal_lanes, sublayer_lanes


def test_removal_lanes_are_born_at_their_block_and_skip_only_it():
    L = 3
    layout = Layout.of([Lane("base"), *removal_lanes(L)], L)
    assert layout.born == [0, 1, 2, 3]  # "block l removed" branches off the base at block l
    assert [layout.live(j) for j in range(1, L + 1)] == [2, 3, 4]
    assert [layout.runs(j) for j in range(1, L + 1)] == [[(0, 1, ())], [(0, 2, ())], [(0, 3, ())]]  # lane j skips j


def test_lanes_skipping_what_the_base_skips_are_born_later_and_never_run_it():
    L = 4
    base = frozenset({2})
    lanes = [Lane("base", base), *removal_lanes(L, base)]
    assert [lane.key for lane in lanes[1:]] == ["removed:1", "removed:3", "removed:4"]
    layout = Layout.of(lanes, L)
    assert layout.born == [0, 1, 3, 4]
    assert layout.runs(2) == []  # every live lane skips block 2: it is not even read
    assert layout.runs(3) == [(0, 2, ())]


def test_unit_lanes_are_born_at_their_block_and_zero_only_it():
    L = 3
    lanes = [Lane("base"), *sublayer_lanes(L)]
    layout = Layout.of(lanes, L)
    assert layout.born == [0, 1, 1, 2, 2, 3, 3]  # attn:l and mlp:l branch off the base at block l
    assert layout.runs(2) == [(0, 3, ()), (3, 4, ("attn",)), (4, 5, ("mlp",))]
    assert layout.runs(3) == [(0, 5, ()), (5, 6, ("attn",)), (6, 7, ("mlp",))]
