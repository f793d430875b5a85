"""The sweep: every lane of a model through one decoder layer at a time, each layer read once.

    target = open_streamed("path/to/hf-dir")                               # depthlab.targets.stream.open
    sweeper = Sweeper(target, SweepSettings(state_dir=root))                # root: the command's resume state
    sweeper.sweep("diagnose", batches, [Lane("base"), *removal_lanes(L)], keep_states=True, consumer=c)

**Lanes** (:mod:`~depthlab.targets.stream.lanes`): the base model and its variants (blocks skipped, branches
zeroed), applied together to each layer while it is loaded. At the end, every lane goes through the final norm and
the head, and its logits go to the *consumer* (losses, multiple-choice scores); the base lane's L+1 states go to it
too when ``keep_states`` (angular distance of all pairs, variance), and :class:`Taps` let it read a block, or the
head, while its weights are loaded (attention / MLP units, the logit lens).

**Memory.** One layer's weights (in the compute dtype; two while a swap lane applies the previous layer after the
current one, :mod:`~depthlab.targets.stream.lanes`) + the lanes + the base states of the batches in flight + one
layer call's activations. The lanes of a batch live in one tensor (slots, B, T, D), slots ordered by birth so the
live ones are a prefix, applied in chunks of at most ``max_rows`` token rows. When all batches' lanes would not fit
``lane_budget`` (by default: what the free memory leaves beside two copies of a layer and its activations), the
batches are split into groups, one pass over the weights each (each layer is then read once per group).

**Resume** (:mod:`~depthlab.targets.stream.resume`): with ``state_dir``, after each layer the live lanes (and the
new base state) are saved, after each group the consumer's sums; a sweep killed at any point and rerun with the same
inputs continues after the last saved layer, with the same numbers.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.progress import progress
from depthlab.targets.branches import UNITS, unit_modules, zeroed
from depthlab.targets.engine import MEMORY_FRACTION, available_memory, gib
from depthlab.targets.stream.lanes import EXPERT, Lane, Layout
from depthlab.targets.stream.resume import PassState, fingerprint

log = logging.getLogger(__name__)

#: Activations of one layer call: at most this many bytes (and this fraction of the free memory).
ACTIVATION_BYTES, ACTIVATION_FRACTION = 2 << 30, 0.1
#: Token rows per layer call on a CPU. Calls of tens of thousands of rows run their element-wise work out of
#: cache: 1.3-1.5x the time per row of calls of 2-4 thousand rows (benchmarks/streamed_8b.py --rows).
CPU_ROWS_PER_CALL = 4096


@dataclass
class SweepBatch:
    ids: torch.Tensor  # (B, T) token ids
    labels: torch.Tensor | None = None  # (B, T) next-token targets of held-out text; None for other batches
    payload: Any = None  # what the consumer needs besides (multiple choice: the chunk of choices)
    states: bool = True  # the base lane's states of this batch go to the consumer (held-out text)
    inputs: dict[str, Any] | None = None  # the model's inputs beside the ids (an image-text batch: pixels, image
    #                                       sizes, token types, the vision blocks skipped): its embedding and layer
    #                                       calls are made from them (the source's ``embed`` and ``calls_for``)


class Consumer(Protocol):
    """What a sweep hands its results to; its sums are saved after each group (resume)."""

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None: ...

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Taps:
    """What a consumer reads beside the lanes' logits, while the weights it needs are loaded (batches whose
    states are kept only). ``layer(j, index, batch, layer, call, x_in, x_out)``: block j (1-based) of the base
    lane, its input x^j and output x^{j+1}, the layer still materialised (with a ``layer`` tap, the consumer's
    sums are saved after every layer too, so a resumed sweep keeps what earlier layers added).
    ``head(index, batch, states, head, rows)``: the base's L+1 states with the final norm and head loaded, to decode
    them ``rows`` sequences at a time (the logit lens)."""

    layer: Callable[[int, int, SweepBatch, Any, Callable, torch.Tensor, torch.Tensor], None] | None = None
    head: Callable[[int, SweepBatch, list[torch.Tensor], Callable[[torch.Tensor], torch.Tensor], int], None] | None = None


@dataclass
class SweepSettings:
    state_dir: Path | None = None  # where the resume state lives (None: not resumable)
    lane_budget: int | None = None  # bytes for the lanes and kept states of a group (None: from free memory)
    max_rows: int | None = None  # token rows per layer call (None: from the activation budget)
    progress: bool = True  # a progress line with an ETA
    on_layer: Callable[[str, int, int], None] | None = None  # (pass, group, layer) after each saved layer


@dataclass
class SweepStats:
    """What the sweeps of one engine did (reported, and asserted by the tests)."""

    passes: int = 0  # sweeps run (a resumed-and-finished one counts)
    weight_passes: int = 0  # passes over the weights (groups of every sweep)
    layers_computed: int = 0  # layers read and applied in this process
    block_evals: int = 0  # (lane, batch, layer) applications
    token_evals: int = 0  # (lane, token, layer) applications: a layer's FLOPs per token times this is the work
    head_tokens: int = 0  # (lane, token) through the final norm and the head
    resumed: list[dict[str, int]] = field(default_factory=list)  # {"pass", "group", "layer"} continued after
    seconds: float = 0.0
    lane_bytes: int = 0  # the largest group's lanes + kept states (report: "stream_bytes")


class Sweeper:
    """Runs sweeps over a :class:`~depthlab.targets.stream.open.StreamTarget`'s layers."""

    def __init__(self, target: Any, settings: SweepSettings | None = None) -> None:
        self.target, self.source = target, target.source
        self.settings = settings or SweepSettings()
        self.stats = SweepStats()
        self._taps = Taps()
        self._resident = 2  # layers' weights the budget counts: as read and in the compute dtype (+1 with swap lanes)
        self.elem = torch.tensor([], dtype=self.source.compute_dtype).element_size()
        self.d_model = int(self.source.state_width)  # the state between blocks: n·D for n residual streams

    # ------------------------------------------------------------------ planning
    def _budget(self) -> tuple[int | None, int]:
        """(bytes for the lanes and kept states, or None when unbounded; token rows per layer call). From the
        free memory: a fraction of it, less two layers (the weights as read and in the compute dtype) and the
        activations of one layer call."""
        src, s = self.source, self.settings
        free = available_memory(self.target.device)
        layer = max(src.layer_numel(i) for i in range(src.n_layers)) * self.elem
        d_ff = int(self.target.info.get("d_ff") or 4 * self.d_model)
        per_row = self.elem * (3 * d_ff + 8 * self.d_model) + 4 * int(self.target.info.get("n_heads") or 1) * 512
        act = ACTIVATION_BYTES if free is None else min(ACTIVATION_BYTES, int(ACTIVATION_FRACTION * free))
        rows = s.max_rows or max(1, act // per_row)
        if not s.max_rows and self.target.device.type == "cpu":
            rows = min(rows, CPU_ROWS_PER_CALL)
        if s.lane_budget is not None:
            return s.lane_budget, rows
        if free is None:
            return None, rows
        return int(MEMORY_FRACTION * free) - self._resident * layer - rows * per_row, rows

    def _groups(self, batches: Sequence[SweepBatch], n_slots: int, keep_states: bool) -> list[range]:
        """Consecutive batches whose lanes (and kept states) fit the budget; one weight pass each."""
        room, _ = self._budget()
        per = [(n_slots + (self.source.n_layers + 1 if keep_states and b.states else 0)) * b.ids.numel()
               * self.d_model * self.elem for b in batches]
        if room is not None and per and max(per) > room:
            raise DepthlabError(
                f"not enough memory to stream {self.target.name!r}: one batch's {n_slots} lanes need {gib(max(per))}"
                f" beside one layer and its activations, and {gib(max(room, 0))} are left of the free memory; "
                "lower --batch-size or --seq-len")
        groups, start, used = [], 0, 0
        for i, n in enumerate(per):
            if room is not None and used + n > room and i > start:
                groups.append(range(start, i))
                start, used = i, 0
            used += n
        groups.append(range(start, len(batches)))
        self.stats.lane_bytes = max(self.stats.lane_bytes, max((sum(per[i] for i in g) for g in groups), default=0))
        return groups

    # ------------------------------------------------------------------ the sweep
    @torch.no_grad()
    def sweep(self, name: str, batches: Sequence[SweepBatch], lanes: Sequence[Lane], keep_states: bool,
              consumer: Consumer, show: bool = True, taps: Taps | None = None) -> None:
        """Every lane over every batch, layer by layer; results to ``consumer`` (see the module docstring).
        ``show``: its own progress (bar or ETA lines, as the settings say); a caller that reports a series of
        short sweeps in its own words passes False. ``taps``: what the consumer reads of the base lane while a
        layer or the head is loaded (:class:`Taps`; with ``keep_states``)."""
        L = self.source.n_layers
        layout = Layout.of(lanes, L)
        self._resident = 3 if any(lane.swap for lane in lanes) else 2  # a swap lane keeps the previous layer loaded
        self._rows = self._budget()[1]
        self._taps = taps or Taps()
        groups = self._groups(batches, len(lanes), keep_states)
        taps_on = [self._taps.layer is not None, self._taps.head is not None]  # what the consumer's sums hold
        state = PassState(self._state_root(), name,
                          fingerprint(name, self.source, batches, lanes, keep_states, taps_on, groups))
        t0 = time.perf_counter()
        self.stats.passes += 1
        done = state.done()
        if done is not None and state.applied(consumer, done):
            self.stats.resumed.append({"pass": name, "group": len(groups), "layer": L + 1})
            log.info("%s: finished in an earlier run; its saved results are used", name)
            return
        last = state.last_group()
        first = 0
        if last is not None and state.applied(consumer, last[1]):
            first = last[0] + 1
        desc = f"{name}: {L} layers, {len(lanes)} lane" + ("s" if len(lanes) > 1 else "")
        with progress(self._units(layout, batches, groups[first:]), desc, "block", self.settings.progress and show) as bar:
            for g in range(first, len(groups)):
                self._group(name, g, [batches[i] for i in groups[g]], groups[g].start, layout, keep_states, consumer,
                            state, bar)
                state.save_group(g, consumer.state_dict(), last=g == len(groups) - 1)
        self.stats.seconds += time.perf_counter() - t0

    def _state_root(self) -> Path | None:
        """Where this sweep saves its progress: the settings' directory, unless its disk cannot hold the saved
        lanes and states of a group twice over (then the sweep runs without, after a warning)."""
        root = self.settings.state_dir
        if root is None:
            return None
        root.mkdir(parents=True, exist_ok=True)
        need, free = 2 * self.stats.lane_bytes, shutil.disk_usage(root).free
        if need > free:
            log.warning("not saving the sweep's progress in %s: it needs about %s, %s are free (an interrupted sweep "
                        "will start over)", root, gib(need), gib(free))
            return None
        return root

    def _units(self, layout: Layout, batches: Sequence[SweepBatch], groups: list[range]) -> int:
        L = self.source.n_layers
        per_batch = sum(sum(b - a for a, b, _ in layout.runs(j)) + sum(b - a for a, b in layout.after(j))
                        for j in range(1, L + 1)) + len(layout.order)
        per_kept = (L if self._taps.layer else 0) + (L + 1 if self._taps.head else 0)  # tap calls per batch with states
        return sum(per_batch + (per_kept if batches[i].states else 0) for g in groups for i in g)

    def _group(self, name: str, g: int, batches: list[SweepBatch], offset: int, layout: Layout, keep_states: bool,
               consumer: Consumer, state: PassState, bar: Any) -> None:
        """One pass over the weights for the batches of group ``g``."""
        L = self.source.n_layers
        self.stats.weight_passes += 1
        per_layer = self._taps.layer is not None  # the consumer's sums change with each layer: saved with it
        saved = state.last_layer(g, keep_states, consumer=per_layer)
        if saved is not None and saved[3] is not None and not state.applied(consumer, saved[3]):
            saved = None  # damaged: this pass starts over (applied() said so and cleared it)
        if saved is None:
            bufs, kept = self._embed(batches, len(layout.order)), [[] for _ in batches]
            j0 = 0
            self._keep(kept, bufs, batches, keep_states)
            state.save_layer(g, 0, [b[:1] for b in bufs], _newest(kept) if keep_states else None,
                             consumer.state_dict() if per_layer else None)
        else:
            j0, live, saved_states, _ = saved
            bufs = [self._empty(b, len(layout.order)) for b in batches]
            for buf, part in zip(bufs, live):
                buf[: part.shape[0]] = part.to(buf.device)
            kept = [[s[i].to(self.target.device) for s in saved_states] if keep_states and b.states else []
                    for i, b in enumerate(batches)]
            self.stats.resumed.append({"pass": name, "group": g, "layer": j0})
            log.info("%s: resuming after layer %d of %d (saved in %s)", name, j0, L, state.dir)
        resident = KeptLayer()  # the previous layer, while swap lanes need it after the current one
        try:
            for j in range(j0 + 1, L + 1):
                self._layer(j, batches, bufs, layout, bar, (offset, kept), resident)
                self._keep(kept, bufs, batches, keep_states)
                n_live = layout.live(j)
                state.save_layer(g, j, [b[:n_live] for b in bufs], _newest(kept) if keep_states else None,
                                 consumer.state_dict() if per_layer else None)
                if self.settings.on_layer is not None:
                    self.settings.on_layer(name, g, j)
        finally:
            resident.close()
        self._head(batches, offset, bufs, kept, layout, consumer, bar)

    def _empty(self, batch: SweepBatch, n_slots: int) -> torch.Tensor:
        B, T = batch.ids.shape
        return torch.empty(n_slots, B, T, self.d_model, dtype=self.source.compute_dtype, device=self.target.device)

    def _embed(self, batches: list[SweepBatch], n_slots: int) -> list[torch.Tensor]:
        bufs = []
        with self.source.embedding() as embed:
            for b in batches:
                buf = self._empty(b, n_slots)
                ids = b.ids.to(self.target.device)
                buf[0] = embed(ids) if b.inputs is None else embed(ids, b.inputs)
                bufs.append(buf)
        return bufs

    @staticmethod
    def _keep(kept: list[list[torch.Tensor]], bufs: list[torch.Tensor], batches: list[SweepBatch], keep: bool) -> None:
        if keep:
            for k, buf, b in zip(kept, bufs, batches):
                if b.states:
                    k.append(buf[0].clone())

    def _layer(self, j: int, batches: list[SweepBatch], bufs: list[torch.Tensor], layout: Layout, bar: Any,
               kept: tuple[int, list[list[torch.Tensor]]], resident: KeptLayer) -> None:
        """Layer j (1-based): birth of the lanes that branch here, then the layer on every lane that runs it (a
        run of lanes zeroing a sublayer of it with that branch zeroed), then layer j-1 once more on the swap lanes of
        pair (j-1, j) (kept loaded from the step before, ``resident``; read again only after a resume), then the
        layer tap on the base lane of each batch whose states are kept (``kept``: the group's first batch index and
        its kept states). Layer j stays loaded past this step when the next layer's swap lanes need it."""
        for s in range(len(layout.order)):
            if layout.born[s] == j:
                for buf in bufs:
                    buf[s] = buf[0]
        runs, after = layout.runs(j), layout.after(j)
        prev = resident.take(j - 2) if after else None
        resident.close()
        if not runs:
            if prev is not None:
                prev[1].close()
            return  # every lane skips this block: it is not even read
        tap = self._taps.layer if runs[0][0] == 0 and not runs[0][2] else None  # the base runs block j whole
        with contextlib.ExitStack() as before, contextlib.ExitStack() as stack:  # layer j-1 (swap lanes), layer j
            if prev is not None:
                before.enter_context(prev[1])
            elif after:
                prev = (before.enter_context(self.source.layer(j - 2)), None)  # after a resume: read again
            layer = stack.enter_context(self.source.layer(j - 1))
            for i, (batch, buf) in enumerate(zip(batches, bufs)):
                calls = self.source.calls_for(batch)
                self._apply(j, layer, calls[j - 1], batch, buf, runs, bar)
                if after:
                    self._apply(j - 1, prev[0], calls[j - 2], batch, buf, [(a, b, ()) for a, b in after], bar)
                if tap is not None and kept[1][i]:
                    ids = batch.ids.to(self.target.device)  # blocks that read the token ids get this batch's
                    tap(j, kept[0] + i, batch, layer, lambda lay, h, c=calls[j - 1], t=ids: c(lay, h, t),
                        kept[1][i][-1], buf[0])
                    bar.update(1)
            if j < self.source.n_layers and layout.after(j + 1):
                resident.keep(j - 1, layer, stack.pop_all())  # the next layer's swap lanes apply it once more
        self.stats.layers_computed += 1

    def _apply(self, j: int, layer: Any, call: Callable, batch: SweepBatch, buf: torch.Tensor,
               runs: list[tuple[int, int, tuple[str, ...]]], bar: Any) -> None:
        """``layer`` (block j) on the slots of ``runs`` of one batch's lanes, each run with what it changes in the
        block (units zeroed, experts removed), in calls of at most ``max_rows`` token rows."""
        B, T = batch.ids.shape
        step = max(1, self._rows // (B * T))
        ids = batch.ids.to(self.target.device)
        for a, b, units in runs:
            with zeroed(*(unit_modules([layer], u)[0] for u in units if u in UNITS)), \
                    self._experts_removed(j, layer, units):
                for c in range(a, b, step):
                    d = min(b, c + step)
                    out = call(layer, buf[c:d].reshape((d - c) * B, T, -1), ids)
                    buf[c:d] = out.reshape(d - c, B, T, -1)
                    self.stats.block_evals += d - c
                    self.stats.token_evals += (d - c) * B * T
                    bar.update(d - c)

    def _experts_removed(self, j: int, layer: Any, changes: tuple[str, ...]) -> Any:
        """Block j computing without the experts ``changes`` names (``expert:E``), for the duration."""
        gone = [int(c[len(EXPERT):]) for c in changes if c.startswith(EXPERT)]
        if not gone:
            return contextlib.nullcontext()
        from depthlab.hf.experts import experts_removed, experts_spec, moe_layers

        config = self.source.skeleton.config.get_text_config()  # a wrapper's: its language tower's
        moe = moe_layers([layer], experts_spec(config), config)
        if not moe:
            raise DepthlabError(f"block {j} has no routed experts; a lane cannot remove experts {gone} from it")
        return experts_removed(moe, {1: gone})

    def _head(self, batches: list[SweepBatch], offset: int, bufs: list[torch.Tensor], kept: list[list[torch.Tensor]],
              layout: Layout, consumer: Consumer, bar: Any) -> None:
        L = self.source.n_layers
        with self.source.head() as head:
            for i, (batch, buf) in enumerate(zip(batches, bufs)):
                if kept[i]:
                    consumer.states(offset + i, batch, kept[i])
                    if self._taps.head is not None:
                        B, T = batch.ids.shape
                        self._taps.head(offset + i, batch, kept[i], head, max(1, self._rows // T))
                        self.stats.head_tokens += (L + 1) * batch.ids.numel()
                        bar.update(L + 1)
                for s, lane in enumerate(layout.order):
                    h = buf[s] if layout.born[s] <= L else buf[0]
                    consumer.logits(lane, offset + i, batch, head(h))
                    self.stats.head_tokens += batch.ids.numel()
                    bar.update(1)


class KeptLayer:
    """A layer kept loaded past its own step (the swap lanes of the next pair apply it after the next layer): its
    module and the stack that releases it."""

    def __init__(self) -> None:
        self.index, self.module, self.stack = -1, None, None

    def keep(self, index: int, module: Any, stack: contextlib.ExitStack) -> None:
        self.close()
        self.index, self.module, self.stack = index, module, stack

    def take(self, index: int) -> tuple[Any, contextlib.ExitStack] | None:
        """(module, its releasing stack) of layer ``index`` (0-based) if it is the one kept, handed over; else None."""
        if self.stack is None or self.index != index:
            return None
        out = (self.module, self.stack)
        self.index, self.module, self.stack = -1, None, None
        return out

    def close(self) -> None:
        if self.stack is not None:
            self.stack.close()
        self.index, self.module, self.stack = -1, None, None


def _newest(kept: list[list[torch.Tensor]]) -> list[torch.Tensor | None]:
    """The newest kept state of each batch (None for a batch whose states are not kept)."""
    return [k[-1] if k else None for k in kept]
