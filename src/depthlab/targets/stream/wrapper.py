"""An image-text-to-text wrapper read one language layer at a time: its language tower on text, and on image-text
batches (what its vision tower is measured by).

    source = WrapperLayerSource(Path("qwen2.5-vl"), TensorStore(files), device, torch.bfloat16, torch.float32)
    with source.embedding() as embed:
        h = embed(ids)                            # text: the language model's own forward up to block 1
        h = embed(ids, {"pixel_values": ..., "image_grid_thw": ..., SKIP: (2,)})   # an image-text batch
    calls = source.calls_for(batch)               # how the model calls each layer on that batch

The skeleton is transformers' own wrapper (``AutoModelForImageTextToText``) on the meta device; the language tower's
entry (:func:`depthlab.hf.wrappers.tower_family`: its text family, based inside the wrapper) says where the blocks,
the final norm and the head sit, so text streams exactly as the text family does (checkpoint keys through
transformers' own conversion mapping: Gemma 3, LLaVA, PaliGemma and Mistral 3 store the legacy layout).

An **image-text batch** (:class:`~depthlab.targets.stream.sweep.SweepBatch` with ``inputs``) is embedded by the
wrapper's own base-model forward over stand-ins for every language block: the vision tower, its projector and the
scattering of the image features into the text embeddings are the model's own (the vision tower and projector are
read whole for the embedding step, released after it: a few percent of a wrapper's weights), the vision blocks in
``inputs[SKIP]`` pass their input on, and each language block's call (M-RoPE positions, Gemma 3's bidirectional
image mask, Gemma 4's per-layer inputs) is recorded for that batch. What the model adds to the stream between
blocks (Qwen3-VL's deepstack features, after the first blocks) is recorded too, as each block's input minus the
previous one's, and added after the block when the sweep applies it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.targets.stream.hf import HFLayerSource
from depthlab.targets.stream.source import Call, stubs, swapped

#: The key of an image-text batch's ``inputs`` naming the 1-based vision blocks it skips (a tuple).
SKIP = "skip_vision_blocks"


class _Added(Call):
    """A recorded call whose block is followed, in the model's forward, by an addition to the stream (Qwen3-VL's
    deepstack features at the image positions): the block, then the recorded difference."""

    def __init__(self, call: Call, delta: torch.Tensor) -> None:
        super().__init__(call.args, call.kwargs, call.hidden_is_kwarg, call.streams, call.token_slots, call.tokens,
                         call.row_args, call.row_scaled)
        self.delta = delta

    def __call__(self, layer: nn.Module, h: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        return super().__call__(layer, h, ids) + self.delta.to(h.dtype)


@contextlib.contextmanager
def skipped(blocks: list[nn.Module]) -> Iterator[None]:
    """``blocks`` hand their input on (their output is replaced by a forward hook that runs before transformers'
    own, so its recorded ``hidden_states`` see the replacement)."""
    def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        h = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs["hidden_states"]
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handles = [b.register_forward_hook(hook, with_kwargs=True, prepend=True) for b in blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _outside(root: nn.Module, keep: tuple[nn.Module, ...]) -> list[nn.Module]:
    """The submodules of ``root`` holding none of ``keep`` (nor being one), as high up as they go: a wrapper's
    vision tower and projector, given its language tower and LM head."""
    out = []
    for child in root.children():
        if any(child is k for k in keep):
            continue
        if any(m is k for m in child.modules() for k in keep):
            out.extend(_outside(child, keep))
        elif child.state_dict():
            out.append(child)
    return out


class WrapperLayerSource(HFLayerSource):
    """The language tower of an image-text-to-text wrapper, one layer at a time (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        head = self.skeleton.get_output_embeddings()
        self.image_modules = tuple(_outside(self.skeleton, (self.owner, head)))
        self._image_live = False
        self._image_calls: dict[int, tuple[dict, list[Call]]] = {}  # id(batch inputs) -> (them, the calls)

    # ------------------------------------------------------------------ structure
    def _skeleton(self, config: Any, compute_dtype: torch.dtype) -> tuple[Any, nn.Module]:
        from transformers import AutoModelForImageTextToText

        from depthlab.hf.wrappers import tower_family

        family = tower_family(config, "language", "stream")
        with torch.device("meta"):
            return family, AutoModelForImageTextToText.from_config(config, dtype=compute_dtype)

    def _lm(self, model: nn.Module) -> tuple[nn.Module, str]:
        """The wrapper makes the logits; Llama 4's causal LM inside it does (its wrapper's forward raises)."""
        from depthlab.hf.families import get_path
        from depthlab.hf.wrappers import wrapper_of

        inner = wrapper_of(model.config).text_lm
        if not inner:
            return model, self.family.layers.split(".")[0]
        return get_path(model, inner), self.family.layers[len(inner) + 1:].split(".")[0]

    def _head_extras(self, head: nn.Module) -> list[nn.Module]:
        """None: the wrapper's other modules are its image towers (:attr:`image_modules`)."""
        return []

    def _initialiser(self, module: nn.Module) -> nn.Module:
        """The innermost transformers model holding ``module`` (a wrapper's CLIP / SigLIP vision tower initialises
        its own position ids; the wrapper's ``_init_weights`` does not know them)."""
        from transformers import PreTrainedModel

        name = self._names()[id(module)]
        owners = [(n, m) for n, m in self.skeleton.named_modules() if isinstance(m, PreTrainedModel)
                  and (n == "" or name == n or name.startswith(n + "."))]
        return max(owners, key=lambda nm: len(nm[0]))[1]

    def stored_modules(self) -> tuple[nn.Module, ...]:
        return (*super().stored_modules(), *self.image_modules)

    def vision_blocks(self) -> nn.ModuleList:
        from depthlab.hf.families import get_path
        from depthlab.hf.wrappers import tower_family

        return get_path(self.skeleton, tower_family(self.skeleton.config, "vision").layers)

    # ------------------------------------------------------------------ image-text batches
    @contextlib.contextmanager
    def embedding(self) -> Iterator[Callable[..., torch.Tensor]]:
        """:meth:`HFLayerSource.embedding`, also taking an image-text batch's ``inputs`` (the vision tower and
        projector read at the first such batch, released on exit). A sweep embeds each group of batches at once:
        the calls recorded for the previous group are dropped here."""
        self._image_calls.clear()
        try:
            with super().embedding() as embed:
                yield lambda ids, inputs=None: embed(ids) if inputs is None else self._embed_image(ids, inputs)
        finally:
            self._release_images()

    def _release_images(self) -> None:
        if self._image_live:
            for m in self.image_modules:
                self.release(m)
            self._image_live = False

    @contextlib.contextmanager
    def images(self) -> Iterator[None]:
        """The vision tower and projector read (with the language embedding) for the body, released after."""
        with self.embedding():
            self._materialise_images()
            yield

    def _materialise_images(self) -> None:
        if not self._image_live:
            for m in self.image_modules:
                self.materialise(m)
            self._image_live = True

    def _model_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, self.compute_dtype if v.is_floating_point() else v.dtype)
                for k, v in inputs.items() if k not in (SKIP, "input_ids")}

    def run_images(self, ids: torch.Tensor, inputs: dict[str, Any], stubs: nn.ModuleList) -> Any:
        """The wrapper's base-model forward on an image-text batch, the language blocks replaced by ``stubs``, the
        final norm by an identity, the vision blocks of ``inputs[SKIP]`` handing their input on."""
        self._materialise_images()
        vision = self.vision_blocks()
        gone = [vision[b - 1] for b in inputs.get(SKIP, ())]
        runner = self.lm if self.lm is not self.skeleton else self.skeleton
        base = getattr(runner, self.base_attr)
        with swapped(self.owner, {self.layers_attr: stubs}), self._after_layers_off(), skipped(gone), torch.no_grad():
            return base(input_ids=ids, **self._model_inputs(inputs), use_cache=False)

    def _embed_image(self, ids: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """Block 1's input for an image-text batch; each block's call (and what follows it) kept for the batch."""
        calls: list[Call | None] = [None] * self.n_layers
        hidden: list[torch.Tensor] = []
        out = self.run_images(ids, inputs, stubs(self.layers, calls, hidden))
        if len(hidden) != self.n_layers or any(c is None for c in calls):
            raise DepthlabError("the wrapper's forward did not call every language block on an image-text batch; "
                                "cannot stream it")
        last = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        after = [*hidden[1:], last]
        bound = []
        for i, call in enumerate(calls):
            c = self._bind_recorded(call)
            delta = after[i] - hidden[i]
            bound.append(_Added(c, delta) if bool(delta.any()) else c)
        self._image_calls[id(inputs)] = (inputs, bound)
        return hidden[0].flatten(2) if self.streams else hidden[0]

    def _bind_recorded(self, call: Call) -> Call:
        """The recorded call with its per-token arguments (Gemma 4) kept as recorded for this batch."""
        slots = self._token_slots(call) if self.family.token_args else ()
        if not slots:
            return Call(call.args, call.kwargs, call.hidden_is_kwarg, self.streams, (), None, self.family.row_args)
        values = {name: (call.args[pos] if pos is not None else call.kwargs[name]) for name, pos in slots}
        return Call(call.args, call.kwargs, call.hidden_is_kwarg, self.streams, slots, lambda _ids, v=values: v,
                    self.family.row_args)

    def calls_for(self, batch: Any) -> list[Call]:
        if batch.inputs is None:
            return super().calls_for(batch)
        if id(batch.inputs) not in self._image_calls:  # a sweep resumed after its embedding step: recorded again
            with HFLayerSource.embedding(self):
                try:
                    self._embed_image(batch.ids.to(self.device), batch.inputs)
                finally:
                    self._release_images()
        return self._image_calls[id(batch.inputs)][1]

    def vision_states(self, ids: torch.Tensor, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """The vision tower's residual states x^1..x^{L+1} on an image-text batch (every image's patches: (B, T, D),
        or (1, N, D) for a tower holding one flat sequence), read by hooks while the language blocks are stubbed:
        what the in-memory capture measures."""
        vision = self.vision_blocks()
        states: list[torch.Tensor | None] = [None] * (len(vision) + 1)

        def pre(i: int):
            def hook(_m, args, kwargs):
                states[i] = (args[0] if args and isinstance(args[0], torch.Tensor) else kwargs["hidden_states"]).clone()
            return hook

        def post(_m, _a, _k, out):
            states[-1] = (out[0] if isinstance(out, tuple) else out).clone()

        handles = [b.register_forward_pre_hook(pre(i), with_kwargs=True) for i, b in enumerate(vision)]
        handles.append(vision[-1].register_forward_hook(post, with_kwargs=True))
        try:
            self.run_images(ids, inputs, stubs(self.layers, [None] * self.n_layers))
        finally:
            for h in handles:
                h.remove()
        return [s.unsqueeze(0) if s.dim() == 2 else s for s in states]  # type: ignore[union-attr]
