"""The lanes of a sweep: variants of one model carried through its layers side by side.

    lanes = [Lane("base"), *removal_lanes(L)]      # the model, and the model without block l for each l
    lanes += swap_lanes(L)                         # the model with blocks l and l+1 exchanged, l = 1..L-1
    layout = Layout.of(lanes, L)                   # slots ordered by birth; which slots run layer j, zeroing what

A *lane* is the model with a set of blocks skipped (``Lane.skip``), of attention / MLP branches zeroed
(``Lane.zero``) or of routed experts removed (``Lane.experts``: the block computes as the model without them,
:func:`depthlab.hf.experts.experts_removed`); the first lane of a sweep is the *base*. Block j of every lane uses
the same weights, so the sweep reads layer j once and applies it to every live lane that does not skip it. A lane is
born as a copy of the base at the first layer where they differ (``block i removed``: at layer i, a copy of the base's
input of block i), so it costs only the layers after it: the removal lanes cost sum_j j block evaluations, as the
in-memory replay does.

A *swap* lane (``Lane.swap = l``: blocks l and l+1 exchanged, each with its own weights and its own call) is born at
layer l as a copy of the base's x^l and *held back* there (it does not apply layer l); at layer l+1 it applies layer
l+1 and then layer l again (:meth:`Layout.after`), so the sweep keeps layer l's weights loaded for one more layer:
two layers resident instead of one while a swap lane needs them, and no layer read twice. From l+2 on it runs as
the base does. The L-1 swap lanes cost sum_l (L - l + 1) block evaluations: about the removal lanes' cost again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from depthlab.targets.branches import UNITS


@dataclass(frozen=True)
class Lane:
    key: str  # e.g. "base", "removed:3", "joint:4,5", "attn:3" (part of the resume fingerprint)
    skip: frozenset[int] = frozenset()  # 1-based blocks this lane skips
    zero: frozenset[tuple[int, str]] = frozenset()  # (1-based block, unit): sublayers whose branch is zeroed (attn, mlp)
    swap: int = 0  # 1-based l: blocks l and l+1 exchanged (block l+1 applied to x^l, then block l); 0: none
    experts: frozenset[tuple[int, int]] = frozenset()  # (1-based block, 0-based expert): routed experts removed

    def units_at(self, j: int) -> tuple[str, ...]:
        """The units of block j this lane zeroes, in block order."""
        return tuple(u for u in UNITS if (j, u) in self.zero)

    def changes_at(self, j: int) -> tuple[str, ...]:
        """What this lane changes in block j: the units it zeroes, then ``expert:E`` for each expert it removes."""
        return self.units_at(j) + tuple(f"{EXPERT}{e}" for b, e in sorted(self.experts) if b == j)


#: The prefix of a removed expert in :meth:`Lane.changes_at` (``expert:3``).
EXPERT = "expert:"


def removal_lanes(n_layers: int, base_skip: frozenset[int] = frozenset()) -> list[Lane]:
    """One lane per block not in ``base_skip``: the base's skips plus that block."""
    return [Lane(f"removed:{l}", base_skip | {l}) for l in range(1, n_layers + 1) if l not in base_skip]


def sublayer_lanes(n_layers: int) -> list[Lane]:
    """One lane per (unit, block), units outermost: the model with that block's attention (or MLP) branch zeroed
    (:mod:`~depthlab.targets.branches`). Each is born at its block, as a removal lane is."""
    return [Lane(f"{u}:{l}", zero=frozenset({(l, u)})) for u in UNITS for l in range(1, n_layers + 1)]


def swap_lanes(n_layers: int) -> list[Lane]:
    """One lane per adjacent pair (l, l+1), l = 1..L-1: the model with the two blocks exchanged (the swap test)."""
    return [Lane(f"swap:{l}", swap=l) for l in range(1, n_layers)]


@dataclass
class Layout:
    """Slots of the lanes (ordered by birth: the live ones are a prefix) and where each is born."""

    order: list[int]  # slot -> lane index
    born: list[int]  # slot -> layer (1-based) at which it branches off the base (0: the base; L+1: never)
    lanes: list[Lane]  # slot -> its lane (blocks skipped, sublayers zeroed)

    @classmethod
    def of(cls, lanes: Sequence[Lane], n_layers: int) -> Layout:
        base = lanes[0]

        def birth(s: Lane) -> int:
            return next((j for j in range(1, n_layers + 1) if (j in s.skip) != (j in base.skip)
                         or s.changes_at(j) != base.changes_at(j) or (s.swap == j and base.swap != j)),
                        n_layers + 1)

        births = [0] + [birth(s) for s in lanes[1:]]
        order = sorted(range(len(lanes)), key=lambda i: (births[i], i))
        return cls(order, [births[i] for i in order], [lanes[i] for i in order])

    def live(self, j: int) -> int:
        """Number of live slots at layer j (the base and every lane born at or before j)."""
        return sum(1 for b in self.born if b <= j)

    def runs(self, j: int) -> list[tuple[int, int, tuple[str, ...]]]:
        """Contiguous [a, b) slot ranges of the live lanes that apply layer j, each with what they change in it
        (:meth:`Lane.changes_at`: the units they zero, the experts they remove; a swap lane of pair (j, j+1) holds its
        state back at layer j: it applies layer j after layer j+1)."""
        out: list[tuple[int, int, tuple[str, ...]]] = []
        for s in range(self.live(j)):
            if j in self.lanes[s].skip or self.lanes[s].swap == j:
                continue
            units = self.lanes[s].changes_at(j)
            if out and out[-1][1] == s and out[-1][2] == units:
                out[-1] = (out[-1][0], s + 1, units)
            else:
                out.append((s, s + 1, units))
        return out

    def after(self, j: int) -> list[tuple[int, int]]:
        """Contiguous [a, b) slot ranges that apply layer j-1 after layer j: the swap lanes of pair (j-1, j). While they
        run, layer j-1 stays loaded beside layer j."""
        out: list[tuple[int, int]] = []
        for s in range(self.live(j)):
            if j > 1 and self.lanes[s].swap == j - 1:
                if out and out[-1][1] == s:
                    out[-1] = (out[-1][0], s + 1)
                else:
                    out.append((s, s + 1))
        return out
