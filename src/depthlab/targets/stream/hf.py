"""An HF causal LM directory read one layer at a time: transformers' own classes on the meta device.

    source = HFLayerSource(Path("hf-dir"), TensorStore(files), device, torch.bfloat16, torch.float32)

The skeleton is transformers' own ``AutoModelForCausalLM`` built from the checkpoint's config (every family of
:mod:`depthlab.hf.families` that does not refuse streaming; LayerNorm Scaling restored from its config marker,
as :func:`depthlab.hf.load` does; MoE experts stored one by one are fused by transformers' own checkpoint
conversion, one layer at a time). Where the blocks and the final norm sit comes from the family's entry. Block 1's
input is what the model's own forward hands it (embedding scaled, position embeddings added: Gemma, GPT-2,
Granite), and the logits what the LM's own forward makes of the final norm's output (soft-capping, logit scaling).

A family whose blocks also read per-token values (``Family.token_args``: Gemma 4's per-layer embeddings,
DeepSeek-V4's ids for hash routing) gets them from the same forward, run on the batch's ids in the embedding step;
each block's call is handed its own (``calls[i](layer, h, ids)``). Several residual streams (DeepSeek-V4's
hyper-connections, ``(B, T, n, D)``) are held as ``(B, T, n·D)`` between blocks (``state_width``), as depthlab's
``mhc`` scheme holds its streams.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.targets.stream.safetensors import TensorStore
from depthlab.targets.stream.source import Call, LayerSource, PassOn, StandIn, stubs, swapped, zeros_like


class _Reached(Exception):
    """Raised by the first layer's stand-in: the model's forward got as far as block 1 (its input is ``h``)."""

    def __init__(self, h: torch.Tensor) -> None:
        super().__init__("block 1 reached")
        self.h = h


class _StopAtFirst(StandIn):
    """Stands in for block 1 (attributes read from it, :class:`StandIn`): stops the model's forward there."""

    def forward(self, *args, **kwargs):
        raise _Reached(args[0] if args and isinstance(args[0], torch.Tensor) else kwargs["hidden_states"])


class _ZerosOf(nn.Module):
    """Stands in for a stored module (an embedding table, a projection) while the layer calls are recorded: zeros of
    the shape it would return, found by running it on the meta device."""

    def __init__(self, module: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.module, self.dtype, self.device = module, dtype, device

    def __getattr__(self, name: str) -> Any:  # the model may read the table's own attributes (its weight's device)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["module"], name)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x  # noqa: E731
        out = self.module(*(meta(a) for a in args), **{k: meta(v) for k, v in kwargs.items()})
        return zeros_like(out, self.device, self.dtype)


class _Given(StandIn):
    """Stands in for the base model under the LM head: returns the (normed) residual stream it is given; what the
    LM reads of its base model (Falcon-H1's ``lm_head_multiplier``) is read from the real one (:class:`StandIn`)."""

    def __init__(self, h: torch.Tensor, base: nn.Module | None = None) -> None:
        super().__init__(base)
        self.h = h

    def __getattr__(self, name: str) -> Any:
        got = super().__getattr__(name)
        # a submodule the LM calls in its base model's place (OPT's model.decoder) stands in too
        return _Given(self.h, got) if isinstance(got, nn.Module) else got

    def forward(self, *args, **kwargs):
        return _Output(self.h)


class _Output:
    """A base model's output holding only the last hidden state (every other field None: caches, router logits)."""

    def __init__(self, h: torch.Tensor) -> None:
        self.last_hidden_state = h

    def __getattr__(self, name: str) -> None:
        return None

    def __getitem__(self, i: int) -> torch.Tensor:
        if i != 0:
            raise IndexError(i)
        return self.last_hidden_state


def _conversion(model: nn.Module, store: TensorStore) -> tuple[list, dict[str, list[str]]]:
    """transformers' checkpoint conversion of ``model`` (MoE experts stored one by one, fused in the modules) and
    each converted module key -> the checkpoint keys it is built from; ([], {}) when the checkpoint holds the
    modules' own keys."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    mapping = get_model_conversion_mapping(model)
    if not mapping:
        return [], {}
    renamings = [t for t in mapping if not isinstance(t, WeightConverter)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    sources: dict[str, list[str]] = {}
    for key in store.index:
        target, _ = rename_source_key(key, renamings, converters)
        if target != key:
            sources.setdefault(target, []).append(key)
        for split in (c for c in converters if len(c.target_patterns) > 1 and c.target_patterns[0] in target):
            for other in split.target_patterns[1:]:  # one stored tensor split in several (a fused q/k/v): each
                sources.setdefault(target.replace(split.target_patterns[0], other), []).append(key)
    return (mapping, sources) if sources else ([], {})


class HFLayerSource(LayerSource):
    """An HF causal LM directory: transformers' own classes, built from its config on the meta device; where the
    blocks and the final norm sit comes from the family's entry (:mod:`depthlab.hf.families`). Block 1's input
    is what the model's own forward hands it (embedding scaled, position embeddings added: Gemma, GPT-2, Granite),
    and the logits what the LM's own forward makes of the final norm's output (soft-capping, logit scaling)."""

    def __init__(self, path: Path, store: TensorStore, device: torch.device, dtype: torch.dtype,
                 compute_dtype: torch.dtype) -> None:
        from transformers import AutoConfig

        from depthlab.hf.families import split_path
        from depthlab.hf.lns import apply_layernorm_scaling, layernorm_scaling_marker

        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        self.family, model = self._skeleton(config, compute_dtype)
        if layernorm_scaling_marker(model.config) is not None:
            apply_layernorm_scaling(model)  # hooks on the meta layers' norms: they stay through every load
        self.skeleton = model.eval()
        self.owner, self.layers_attr = split_path(model, self.family.layers)
        # none: the LM head reads the last block's output (GPT-1, XLNet)
        self.final_norm_attr = split_path(model, self.family.final_norm) if self.family.final_norm else None
        self.collapse_attr = split_path(model, self.family.collapse) if self.family.collapse else None
        self.lm, self.base_attr = self._lm(model)  # the module making the logits, and its base model's name in it
        names = self._names()
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = {f"{names[id(head)]}.weight": f"{names[id(embed)]}.weight"} if head.weight is embed.weight else {}
        super().__init__(store, device, dtype, compute_dtype, tied)
        self.mapping, self.sources = _conversion(model, store)
        after = [getattr(*a) for a in (self.collapse_attr, self.final_norm_attr) if a is not None]
        inner = [m for m in self.owner.children() if m is not self.layers and all(m is not a for a in after)]
        for m in inner:
            if not m.state_dict():
                self._fill_computed(m)  # rotary tables: small and computed, not stored; built once on the device
        self.embed_modules = tuple(m for m in inner if m.state_dict())
        self.head_modules = (*after, *self._head_extras(head), head)
        self._n_after = len(after)
        self._owner_read = False  # the owner's own tensors (not its children's): read at the first forward
        text = config.get_text_config()  # the config itself, or an image-text wrapper's text_config
        n = int(getattr(text, self.family.streams)) if self.family.streams else 1
        self.streams = (n, text.hidden_size) if self.family.streams else ()
        self.state_width = n * text.hidden_size
        self._tokens: dict[tuple, list[dict[str, torch.Tensor]]] = {}  # per-token block inputs, by batch

    def _skeleton(self, config: Any, compute_dtype: torch.dtype) -> tuple[Any, nn.Module]:
        """(the family's entry, the model on the meta device): transformers' causal LM of the config (an image-text
        wrapper's tower: :class:`depthlab.targets.stream.wrapper.WrapperLayerSource`)."""
        from transformers import AutoModelForCausalLM

        from depthlab.hf.families import family_of

        family = family_of(config, "stream")  # a row, or the layout inferred
        with torch.device("meta"):
            return family, AutoModelForCausalLM.from_config(config, dtype=compute_dtype)

    def _head_extras(self, head: nn.Module) -> list[nn.Module]:
        """The LM's modules besides its base model and output embedding that its forward applies (ModernBERT's
        prediction head ahead of its decoder): read with the head."""
        return [m for name, m in self.lm.named_children() if name != self.base_attr and m is not head and m.state_dict()]

    def _owner_tensors(self) -> None:
        """The block list's owner's own tensors (an input scale or bias: Zaya; a computed normaliser: RecurrentGemma),
        not its children's: read (or computed) once, before its forward first runs, and kept (they are small)."""
        if self._owner_read:
            return
        owner, prefix = self.owner, self._names()[id(self.owner)]
        computed = [n for n, t in owner._buffers.items() if t is not None and t.is_meta
                    and n in owner._non_persistent_buffers_set]
        for n in computed:
            owner._buffers[n] = torch.empty_like(owner._buffers[n], device=self.device)
        if computed:
            from transformers import PreTrainedModel

            with torch.no_grad():  # the owner's own _init_weights when it is a transformers model (Gemma 3n's reads it)
                (owner if isinstance(owner, PreTrainedModel) else self._initialiser(owner))._init_weights(owner)
        stored = [n for n, t in (*owner._parameters.items(), *owner._buffers.items()) if t is not None and t.is_meta]
        keys = [f"{prefix}.{n}" if prefix else n for n in stored]
        tensors = self.store.read(keys, self.dtype, self.device, self.compute_dtype) if keys else {}
        for n, key in zip(stored, keys):
            if n in owner._parameters:
                owner._parameters[n] = nn.Parameter(tensors[key], requires_grad=False)
            else:
                owner._buffers[n] = tensors[key]
        self._owner_read = True

    def _lm(self, model: nn.Module) -> tuple[nn.Module, str]:
        """(the module whose forward makes the logits, the name of its base model in it): the causal LM itself."""
        return model, self.family.layers.split(".")[0]

    # ------------------------------------------------------------------ checkpoint keys
    def keys_of(self, module: nn.Module) -> list[str]:
        """Checkpoint keys of ``module``'s tensors: those transformers converts them from, else its own (tied aliases
        resolved)."""
        if not self.sources:
            return super().keys_of(module)
        prefix = self._names()[id(module)]
        out: list[str] = []
        for key in (f"{prefix}.{k}" if prefix else k for k in module.state_dict()):
            alias = self.aliases.get(key, key)  # a tied head: the embedding's key, where the checkpoint stores it
            out.extend(self.sources.get(key) or ([key] if key in self.store else self.sources.get(alias) or [alias]))
        return list(dict.fromkeys(out))

    def materialise(self, module: nn.Module) -> None:
        prefix = self._names()[id(module)]
        if any(k.startswith(f"{prefix}.") for k in self.sources):
            self._materialise_converted(module)
        else:
            super().materialise(module)

    def _materialise_converted(self, module: nn.Module) -> None:
        """transformers' own loader, given this module's checkpoint tensors only (MoE experts fused as it fuses them)."""
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig
        from transformers.utils import logging as hf_logging

        tensors = self.store.read(self.keys_of(module), self.dtype, self.device, self.compute_dtype)
        self._fill_computed(module)  # before the weights: an initialisation may touch them too
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # its "Loading weights" bar, once per layer: the sweep shows its own progress
        try:
            convert_and_load_state_dict_in_model(self.skeleton, tensors, LoadStateDictConfig(
                weight_mapping=self.mapping, dtype=self.compute_dtype))
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        del tensors
        module.requires_grad_(False)
        left = [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
        if left:
            raise DepthlabError(f"cannot stream {type(module).__name__}: it holds tensors the checkpoint lacks {left[:3]}")

    def _fill_computed(self, module: nn.Module) -> None:
        """Non-persistent buffers (rotary tables, Gemma's embedding scale) made on the device by transformers' own
        initialisation of the module that holds them."""
        for sub in module.modules():
            meta = [n for n in sub._non_persistent_buffers_set if getattr(sub, n, None) is not None and getattr(sub, n).is_meta]
            if not meta:
                continue
            for n in meta:  # NaN until initialised: what the module's own initialisation leaves is seen
                empty = torch.empty_like(getattr(sub, n), device=self.device)
                setattr(sub, n, empty.fill_(float("nan")) if empty.is_floating_point() else empty)
            with torch.no_grad():
                self._initialiser(sub)._init_weights(sub)
            if any(getattr(sub, n).is_floating_point() and bool(getattr(sub, n).isnan().any()) for n in meta):
                self._fill_from_above(sub, meta)

    def _fill_from_above(self, sub: nn.Module, names: list[str]) -> None:
        """``sub``'s buffers ``names`` made by an enclosing module's initialisation (Falcon-H1's model sets each
        mixer's ``mup_vector``): the enclosing modules' initialisations, innermost first, until none is NaN; what
        they would set of their own tensors is put back."""
        path = self._names()[id(sub)].split(".")
        for k in range(len(path) - 1, -1, -1):
            above = self.skeleton.get_submodule(".".join(path[:k]))
            own = {n: t for n, t in (*above._parameters.items(), *above._buffers.items()) if t is not None}
            saved = {n: t.detach().clone() for n, t in own.items() if not t.is_meta}
            with torch.no_grad():
                self._initialiser(above)._init_weights(above)
                for n, t in saved.items():
                    (above._parameters.get(n) if n in above._parameters else above._buffers[n]).copy_(t)
            if not any(getattr(sub, n).is_floating_point() and bool(getattr(sub, n).isnan().any()) for n in names):
                return

    def _initialiser(self, module: nn.Module) -> nn.Module:
        """The transformers model whose ``_init_weights`` makes ``module``'s computed buffers: the skeleton."""
        return self.skeleton

    # ------------------------------------------------------------------ embedding, head, calls
    @contextlib.contextmanager
    def embedding(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """Token ids (B, T) -> the input of block 1 (B, T, D), as the model's own forward computes it; a family whose
        blocks read per-token values (``Family.token_args``) keeps each block's, for its layer calls."""
        self._tokens.clear()
        with self._embedding() as embed:
            yield embed

    @contextlib.contextmanager
    def _embedding(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        self._owner_tensors()
        for m in self.embed_modules:
            self.materialise(m)
        try:
            yield self._embed_all if self.family.token_args else self._embed_first
        finally:
            for m in self.embed_modules:
                self.release(m)

    def _embed_first(self, ids: torch.Tensor) -> torch.Tensor:
        """The model's forward up to block 1, stopped there."""
        stops = nn.ModuleList([_StopAtFirst(self.layers[0])])
        with swapped(self.owner, {self.layers_attr: stops}), torch.no_grad():
            try:
                self.owner(input_ids=ids, use_cache=False)
            except _Reached as reached:
                return reached.h.flatten(2) if self.streams else reached.h
        raise DepthlabError("the model's forward never called its first block; cannot stream it")

    def _embed_all(self, ids: torch.Tensor) -> torch.Tensor:
        """The model's forward over stand-ins for every block: block 1's input, and each block's per-token
        arguments kept (by the batch's ids) for :meth:`token_inputs`."""
        calls: list[Call | None] = [None] * self.n_layers
        hidden: list[torch.Tensor] = []
        with swapped(self.owner, {self.layers_attr: stubs(self.layers, calls, hidden)}), self._after_layers_off(), \
                torch.no_grad():
            self.owner(input_ids=ids, use_cache=False)
        if not hidden or any(c is None for c in calls):
            raise DepthlabError("the model's forward did not call every layer; cannot stream it")
        slots = self._token_slots(calls[0])
        self._tokens[_ids_key(ids)] = [{name: (c.args[pos] if pos is not None else c.kwargs[name]) for name, pos in slots}
                                       for c in calls]
        return hidden[0].flatten(2) if self.streams else hidden[0]

    def token_inputs(self, ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Each block's per-token arguments for a batch of ids (B, T): kept by the embedding step, or computed again
        (a sweep resumed after its embedding step)."""
        key = _ids_key(ids)
        if key not in self._tokens:
            with self._embedding() as embed:
                embed(ids)
        return self._tokens[key]

    def _token_slots(self, call: Call) -> tuple[tuple[str, int | None], ...]:
        """Where each of ``Family.token_args`` sits in a recorded ``call``: None when the model passes it by keyword,
        else its index after the hidden states (from the block's signature)."""
        params = list(inspect.signature(self.layers[0].forward).parameters)[1:]
        return tuple((name, None if name in call.kwargs or name not in params else params.index(name))
                     for name in self.family.token_args)

    def _after_layers_off(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        for attr in (self.collapse_attr, self.final_norm_attr):
            if attr is not None:
                stack.enter_context(swapped(attr[0], {attr[1]: PassOn(getattr(*attr))}))
        return stack

    def _bind(self, i: int, call: Call) -> Call:
        slots = self._token_slots(call)
        tokens = (lambda ids: self.token_inputs(ids)[i]) if slots else None
        given = {name for name, _ in slots} | {pos for _, pos in slots}  # per-token values come from the ids
        return Call(call.args, call.kwargs, call.hidden_is_kwarg, self.streams, slots, tokens, self.family.row_args,
                    tuple(k for k in call.row_scaled if k not in given))

    @contextlib.contextmanager
    def head(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """The streams collapsed (DeepSeek-V4), the final norm, then the LM's own forward from there (LM head,
        soft-capping, logit scaling); released on exit."""
        after = self.head_modules[:self._n_after]  # what the engine applies; the LM's forward applies the rest
        for m in self.head_modules:
            self.materialise(m)
        try:
            def head(h: torch.Tensor) -> torch.Tensor:
                ids = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)
                h = h.unflatten(-1, self.streams) if self.streams else h
                for m in after:
                    h = m(h)
                with swapped(self.lm, {self.base_attr: _Given(h, getattr(self.lm, self.base_attr))}):
                    return self.lm(input_ids=ids, use_cache=False).logits
            yield head
        finally:
            for m in self.head_modules:
                self.release(m)

    def _record(self, seq_len: int, rows: int = 1) -> None:
        self._owner_tensors()
        ids = torch.zeros(rows, seq_len, dtype=torch.long, device=self.device)
        stored = {name: _ZerosOf(m, self.compute_dtype, self.device) for name, m in self.owner.named_children()
                  if any(m is e for e in self.embed_modules)}  # embedding tables (and projections): zeros of their shape
        with torch.no_grad(), swapped(self.owner, stored):
            self.owner(input_ids=ids, use_cache=False)


def _ids_key(ids: torch.Tensor) -> tuple:
    """A batch of token ids as a dictionary key (its shape, device and values)."""
    return (tuple(ids.shape), str(ids.device), hash(ids.cpu().numpy().tobytes()))

