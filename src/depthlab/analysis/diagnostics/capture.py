"""One mechanism to read the residual stream of any layered model: hooks on its layers.

    cap = ResidualCapture(model, find_layers(model), forward=lambda ids: model(ids).logits)
    cap = capture_of(target)                        # the same for a loaded Target
    logits, states = cap.run(input_ids)             # states[l-1] = x^l, input of block l; states[L] = output of block L
    logits_wo_3 = cap.run_skipping(input_ids, states, {3})   # block 3 removed, blocks 4..L run again

Reading: a forward *pre*-hook on every layer records its hidden-state input ``x^l`` and a forward
hook on the last layer its output ``x^{L+1}``. This is the raw residual stream, never the model's
``hidden_states[-1]`` (which HF decoders return after the final norm).

Multi-stream states: a block that passes an n-stream state ``(B, T, n, D)`` between blocks (DeepSeek-V4's mHC)
is measured on the whole state, ``(B, T, n·D)``, the definition depthlab's own ``mhc`` scheme uses (its streams
travel as one ``(B, T, n·D)`` tensor): angular distance, variance and removal all see every stream. The states
returned are those flattened views; replay hands the blocks their own ``(B, T, n, D)`` shape back.

Sequence-flat states: a block that passes ``(N, D)`` (Qwen-VL's vision blocks: every image's patches in one
sequence) is measured as ``(1, N, D)``; replay hands it its own shape back.

Replay (layer removal): for the duration of one call, the ``forward`` of the first layers is
replaced by a function that returns the *cached* input of the first removed block (no compute),
and removed blocks pass their input straight on. The model's own ``forward`` then runs everything
else itself: embeddings (a gather), the attention masks and rotary tables it builds for every
layer, the remaining blocks, the final norm and the LM head (soft-capping etc. included). So the
same code serves depthlab models and any Hugging Face decoder or encoder, with no re-implementation
of masks or rotary embeddings that could drift from the model's own.

State shared between blocks (Gemma 4's KV sharing): a block argument that is a mutable mapping (``shared_kv_states``)
which a block writes and later blocks read. :meth:`ResidualCapture.run` keeps what each block wrote into it; replay
writes it back for the blocks it does not recompute (the cached prefix), so a later block reads what it read in the
full forward. A *removed* block writes nothing: when a block that still runs reads what it would have written
(block 3 reusing the keys and values of a skipped block 1), the removal has no defined output — no pruned model
computes it (``prune`` refuses to remove such a block) — and replay raises :class:`UnmeasurableRemoval` naming the
block, which the removal sweep reports as not measurable (None) rather than a number.
"""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.targets.layers import find_layers


class UnmeasurableRemoval(DepthlabError):
    """Removing ``blocks`` leaves a later block without the shared state they write (Gemma 4: the keys and values a
    KV-shared block reuses): the model without them is not defined, so their removal cannot be measured."""

    def __init__(self, blocks: Sequence[int], what: Sequence[str]) -> None:
        self.blocks = sorted(blocks)
        super().__init__(f"block(s) {self.blocks} cannot be skipped: a later block reads the state they write "
                         f"({', '.join(sorted(what))}; KV sharing), so no model without them computes these blocks' "
                         "output")


def _shared_maps(kwargs: dict) -> dict[str, MutableMapping]:
    """The block arguments that are mutable mappings: state blocks pass each other (Gemma 4's ``shared_kv_states``)."""
    return {k: v for k, v in kwargs.items() if isinstance(v, MutableMapping)}


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    h = kwargs.get("hidden_states")
    if isinstance(h, torch.Tensor):
        return h
    raise DepthlabError("a layer was called without a hidden-state tensor as first argument; cannot capture it")


def _output_hidden(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise DepthlabError(f"a layer returned {type(out).__name__}, not a tensor or a tuple starting with one")


@dataclass
class LayerCall:
    """How a layer was called in the last captured forward (for re-running it alone)."""

    args: tuple  # positional arguments after the hidden states
    kwargs: dict  # keyword arguments (masks, rotary tables, ...)
    hidden_is_kwarg: bool  # the hidden states came as ``hidden_states=``
    tuple_out: int  # 0: the layer returned a tensor; n: a tuple of n items
    streams: tuple[int, ...] = ()  # (n, D) of a multi-stream layer: h given and returned as (B, T, n·D)

    def __call__(self, layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
        if self.streams and h.dim() == 3:
            return self(layer, h.unflatten(-1, self.streams)).flatten(2)
        if self.hidden_is_kwarg:
            out = layer(*self.args, **{**self.kwargs, "hidden_states": h})
        else:
            out = layer(h, *self.args, **self.kwargs)
        return _output_hidden(out)


@dataclass
class ResidualCapture:
    """Hooks on ``layers`` of ``model``; ``forward(input_ids)`` runs the model (returns logits or None)."""

    model: nn.Module
    layers: Sequence[nn.Module]
    forward: Callable[[torch.Tensor], torch.Tensor | None]
    _tuple_out: list[int] = field(default_factory=list, repr=False)
    _streams: tuple[int, ...] = field(default=(), repr=False)  # (n, D) of a multi-stream state; () for (B, T, D)
    _flat: bool = field(default=False, repr=False)  # the blocks pass (N, D), measured as (1, N, D)
    _writes: list[dict[str, dict]] = field(default_factory=list, repr=False)  # block i: {argument: {key: value}} it wrote
    _writes_of: Any = field(default=None, repr=False)  # states[0] of the run that wrote _writes
    _writers: dict[int, set[str]] = field(default_factory=dict, repr=False)  # 1-based block -> "arg[key]" it writes

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    # ------------------------------------------------------------------ reading
    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, keep_calls: bool = False
            ) -> tuple[torch.Tensor | None, list[torch.Tensor]] | tuple[torch.Tensor | None, list[torch.Tensor], list[LayerCall]]:
        """Run the model once; return (its output, the L+1 residual states[, how each layer was called])."""
        L = self.n_layers
        states: list[torch.Tensor | None] = [None] * (L + 1)
        calls: list[LayerCall | None] = [None] * L
        tuple_out = [0] * L
        handles = []
        before: list[dict[str, tuple[MutableMapping, dict]]] = [{} for _ in range(L)]
        writes: list[dict[str, dict]] = [{} for _ in range(L)]

        def pre(i: int):
            def hook(_m, args, kwargs):
                if states[i] is not None:
                    raise DepthlabError(f"layer {i + 1} ran twice in one forward; cannot read its residual stream")
                states[i] = _hidden_of(args, kwargs)
                before[i] = {k: (m, dict(m)) for k, m in _shared_maps(kwargs).items()}
                if keep_calls:
                    kw = args == () or not isinstance(args[0], torch.Tensor)
                    rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
                    calls[i] = LayerCall(args if kw else args[1:], rest, kw, 0)
            return hook

        def post(i: int):
            def hook(_m, _args, _kwargs, out):
                tuple_out[i] = len(out) if isinstance(out, (tuple, list)) else 0
                for k, (m, old) in before[i].items():
                    new = {key: v for key, v in m.items() if old.get(key) is not v}
                    if new:
                        writes[i][k] = new
                if i == L - 1:
                    states[L] = _output_hidden(out)
            return hook

        try:
            for i, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(pre(i), with_kwargs=True))
                handles.append(layer.register_forward_hook(post(i), with_kwargs=True))
            out = self.forward(input_ids)
        finally:
            for h in handles:
                h.remove()
        missing = [i + 1 for i, s in enumerate(states) if s is None]
        if missing:
            raise DepthlabError(f"the model's forward did not run block(s) {missing[:5]}; cannot read its residual stream")
        self._tuple_out = tuple_out
        if states[0].dim() == 4:  # (B, T, n, D): measured as the whole n-stream state
            self._streams = tuple(states[0].shape[2:])
            states = [st.flatten(2) for st in states]
        self._flat = states[0].dim() == 2
        if self._flat:  # (N, D): one sequence of N tokens
            states = [st.unsqueeze(0) for st in states]
        self._remember_writes(writes, states[0])
        if keep_calls:
            for c, n in zip(calls, tuple_out):
                c.tuple_out, c.streams = n, self._streams
            return out, states, calls  # type: ignore[return-value]
        return out, states  # type: ignore[return-value]

    def _remember_writes(self, writes: list[dict[str, dict]], first_state: torch.Tensor) -> None:
        """Keep what each block wrote into shared state in the last run (for replay) and which blocks write at all."""
        self._writes, self._writes_of = writes, first_state
        for i, w in enumerate(writes):
            if w:
                self._writers.setdefault(i + 1, set()).update(f"{k}[{key!r}]" for k, m in w.items() for key in m)

    def _replayed_writes(self, states: Sequence[torch.Tensor], i: int) -> dict[str, dict]:
        """What block ``i`` (1-based, not recomputed) wrote into shared state when ``states`` were captured."""
        w = self._writes[i - 1] if len(self._writes) >= i else {}
        if w and states[0] is not self._writes_of:
            raise RuntimeError("replaying states of an earlier run: the blocks' shared state (KV sharing) is kept "
                               "for the last run() only")
        return w

    @contextlib.contextmanager
    def _unmeasurable(self, removed: Iterable[int]) -> Iterator[None]:
        """A later block failing to find the shared state a removed block writes -> :class:`UnmeasurableRemoval`."""
        lost = {b: self._writers[b] for b in removed if b in self._writers}
        try:
            yield
        except KeyError as err:
            keys = {w for ws in lost.values() for w in ws}
            if lost and err.args and any(w.endswith(f"[{err.args[0]!r}]") for w in keys):
                raise UnmeasurableRemoval(list(lost), keys) from None
            raise

    # ------------------------------------------------------------------ replay
    @contextlib.contextmanager
    def _patched(self, states: Sequence[torch.Tensor] | None, skip: Iterable[int], start: int | None = None
                 ) -> Iterator[None]:
        """Blocks in ``skip`` (1-based) pass their input on. With cached ``states``, the blocks before
        the first of them (or before ``start``, when given) are not computed either: each emits its own cached
        output, so what the model reads between blocks (transformers' recorded ``hidden_states``: LLaVA's
        feature layer; Qwen3-VL's deepstack taps) is what the full forward read."""
        skip = sorted(set(skip))
        if (not skip and start is None) or (skip and (skip[0] < 1 or skip[-1] > self.n_layers)):
            raise ValueError(f"blocks to skip must lie in 1..{self.n_layers}, got {skip}")
        if start is not None and (states is None or not 1 <= start <= self.n_layers + 1):
            raise ValueError(f"start must lie in 1..{self.n_layers + 1} and come with cached states, got {start}")
        if not self._tuple_out:
            raise RuntimeError("call run() once before replaying")
        first = (start if start is not None else skip[0]) if states is not None else 1
        if first > self.n_layers:  # the last state itself: every block passes it on
            skip, first = list(range(1, self.n_layers + 1)), self.n_layers
            states = [*states[:-2], states[-1]]  # block L "receives" x^{L+1} and passes it on
        bypass = set(range(1, first)) | set(skip)
        runs = states is not None and any(j not in bypass for j in range(first, self.n_layers + 1))
        saved: dict[int, Any] = {}

        def make(i: int):  # i: 1-based block
            n_out, emit = self._tuple_out[i - 1], states[i] if (states is not None and i < first) else None
            if emit is not None and self._streams and emit.dim() == 3:
                emit = emit.unflatten(-1, self._streams)
            if emit is not None and self._flat and emit.dim() == 3:
                emit = emit[0]
            wrote = self._replayed_writes(states, i) if (runs and i < first) else {}  # type: ignore[arg-type]

            def forward(*args, **kwargs):
                for k, w in wrote.items():  # the cached block's writes to shared state, as in the captured run
                    kwargs[k].update(w)
                h = emit if emit is not None else _hidden_of(args, kwargs)
                return (h,) + (None,) * (n_out - 1) if n_out else h
            return forward

        try:
            for i in sorted(bypass):
                layer = self.layers[i - 1]
                saved[i] = layer.__dict__.get("forward")  # an instance-level forward (e.g. accelerate) to restore
                layer.forward = make(i)
            with self._unmeasurable(b for b in skip if b >= first):
                yield
        finally:
            for i, old in saved.items():
                layer = self.layers[i - 1]
                del layer.forward
                if old is not None:
                    layer.forward = old

    @torch.no_grad()
    def run_skipping(self, input_ids: torch.Tensor, states: Sequence[torch.Tensor], skip: Iterable[int]) -> torch.Tensor | None:
        """The model's output with the blocks in ``skip`` removed, reusing ``states`` (from :meth:`run`
        on the same ``input_ids``) so that only the blocks after the first removed one are computed."""
        with self._patched(states, skip):
            return self.forward(input_ids)

    @torch.no_grad()
    def run_from(self, input_ids: torch.Tensor, states: Sequence[torch.Tensor], start: int) -> torch.Tensor | None:
        """The model's output computed from the cached state ``states[start-1]`` (the input of block ``start``,
        1-based; ``L + 1``: the last block's output): blocks ``start..L``, the final norm and the head run, the
        blocks before it are not computed. Unchanged model: the full output. With a sublayer of block ``start``
        zeroed (:func:`~depthlab.analysis.diagnostics.sublayers.zeroed`), the model without that sublayer."""
        with self._patched(states, (), start=start):
            return self.forward(input_ids)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, states: Sequence[torch.Tensor], index: int) -> torch.Tensor | None:
        """The logit lens: ``states[index]`` (0: the input of block 1 .. L: the output of block L) decoded by the
        model's own final norm and head, every block passed over (the model's forward, so soft-capping and any
        other head code is the model's own). ``index = L`` gives the model's logits."""
        with self._patched(states, range(index + 1, self.n_layers + 1), start=index + 1):
            return self.forward(input_ids)

    @torch.no_grad()
    def run_removed(self, input_ids: torch.Tensor, skip: Iterable[int]) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """:meth:`run` on the model with the blocks in ``skip`` removed: its output and its L+1 states,
        where ``states[l-1]`` is what block l receives (a removed block's input passes on unchanged).
        Given these states, ``run_skipping(ids, states, {m} | {s in skip if s > m})`` is the model without
        ``skip`` and block m, computing only the blocks after m: the prefix reuse of greedy removal."""
        skip = set(skip)
        if not skip:
            return self.run(input_ids)  # type: ignore[return-value]
        if not self._tuple_out:
            self.run(input_ids[:1, :2])  # learn the layers' output format
        with self._patched(None, skip):
            return self.run(input_ids)  # type: ignore[return-value]

    @torch.no_grad()
    def run_without(self, input_ids: torch.Tensor, skip: Iterable[int]) -> torch.Tensor | None:
        """The model's output with the blocks in ``skip`` removed, computed from scratch (no cache)."""
        if not self._tuple_out:
            self.run(input_ids[:1, :2])  # learn the layers' output format
        with self._patched(None, skip):
            return self.forward(input_ids)


def capture_of(target: Any) -> ResidualCapture:
    """The capture of a :class:`~depthlab.targets.Target`: hooks on its layers, its own forward."""
    return ResidualCapture(target.model, find_layers(target.model, target.tower), target.forward_fn())
