"""The lanes of a sweep (depthlab.targets.stream.lanes): each born where it first differs from the base, the live
ones a prefix of the slots, and each layer applied to the runs of lanes that do not skip it, zeroing what they zero."""

from __future__ import annotations

from depthlab.targets.stream.lanes import Lane, Layout, removal_lanes, sublayer_lanes, swap_lanes


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


def test_swap_lanes_are_held_back_at_their_first_block_and_apply_it_after_the_second():
    """Pair (l, l+1) exchanged: born at l as a copy of x^l, skips layer l there, at layer l+1 applies layer l+1 and
    then layer l (Layout.after), and from l+2 on runs as the base does."""
    L = 4
    lanes = [Lane("base"), *swap_lanes(L)]
    assert [lane.key for lane in lanes[1:]] == ["swap:1", "swap:2", "swap:3"]
    layout = Layout.of(lanes, L)
    assert layout.born == [0, 1, 2, 3]
    assert layout.runs(1) == [(0, 1, ())] and layout.after(1) == []  # swap:1 holds x^1 back
    assert layout.runs(2) == [(0, 2, ())] and layout.after(2) == [(1, 2)]  # swap:1: layer 2, then 1; swap:2 held
    assert layout.runs(3) == [(0, 3, ())] and layout.after(3) == [(2, 3)]  # swap:1 runs on; swap:2: layer 3, then 2
    assert layout.runs(4) == [(0, 4, ())] and layout.after(4) == [(3, 4)]
