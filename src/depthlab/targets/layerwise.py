"""Models read one decoder layer at a time, for models larger than memory.

    target = open_layerwise("path/to/hf-dir", dtype=torch.bfloat16)   # or a depthlab run directory
    src = target.source
    h = src.embed(ids)                          # (B, T, D): the embedding read, used and released
    calls = src.layer_calls(T)                  # how the model calls each layer at length T (masks, rotary)
    for i in range(src.n_layers):
        with src.layer(i) as layer:             # layer i's tensors read, built into that layer alone
            h = calls[i](layer, h, ids)         # ... and released on exit (ids: for blocks that read them)
    with src.head() as head:                    # final norm + LM head
        logits = head(h)

The model is built once on the meta device (a *skeleton*: no memory), from the checkpoint's config:
transformers' own ``AutoModelForCausalLM`` for an HF directory (every family of :mod:`depthlab.hf.families`
that does not refuse streaming; LayerNorm Scaling restored from its config marker, as :func:`depthlab.hf.load` does;
MoE experts stored one by one are fused by transformers' own checkpoint conversion, one layer at a time), the
run's ``DecoderLM`` for a depthlab run. A module is *materialised* by loading its tensors from the memory-mapped safetensors
files (``load_state_dict(assign=True)``) and *released* by moving it back to ``meta``, so one layer's
tensors are alive at a time. How each layer is called (attention masks, rotary tables, per-layer
attention types) is recorded from the model's own forward run once per sequence length with stub
layers that return their input: nothing of the model's mask or rotary code is re-implemented. A family whose blocks
also read per-token values (``Family.token_args``: Gemma 4's per-layer embeddings, DeepSeek-V4's ids for hash
routing) gets them from the same forward, run on the batch's ids in the embedding step; each block's call is handed
its own (``calls[i](layer, h, ids)``). A multi-stream state (DeepSeek-V4's ``(B, T, n, D)``) is held as
``(B, T, n·D)`` between blocks (``state_width``), as depthlab's ``mhc`` scheme holds its streams.

:class:`WeightMeter` counts the bytes read, the reads of every tensor, and the bytes of weight tensors
alive at once (weak references to their storages): what the tests assert and the benchmark reports.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from depthlab.base.errors import DepthlabError, first_line
from depthlab.targets.verify import ST_DTYPE_BYTES, check_index, check_source, read_header  # noqa: F401

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"


# ---------------------------------------------------------------------------------------------- files
def safetensors_files(path: Path) -> list[Path]:
    """The weight files of an HF directory: those its index names, else every ``*.safetensors``."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DepthlabError(f"{str(index)!r} is damaged: {first_line(err)[:120]}") from None
        check_index(path, weight_map)
        return [path / name for name in dict.fromkeys(weight_map.values())]
    return sorted(path.glob("*.safetensors"))


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]
    offsets: tuple[int, int]  # begin, end within the file's data section

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def tensor_index(files: list[Path]) -> dict[str, TensorInfo]:
    """Every tensor of ``files`` by name, from their headers."""
    out: dict[str, TensorInfo] = {}
    for file in files:
        for name, meta in read_header(file).items():
            out[name] = TensorInfo(file, meta["dtype"], tuple(meta["shape"]), tuple(meta["data_offsets"]))
    return out


# ---------------------------------------------------------------------------------------------- accounting
@dataclass
class WeightMeter:
    """Bytes read from the checkpoint, reads per tensor, and weight bytes alive at once (their peak)."""

    bytes_read: int = 0
    reads: Counter = field(default_factory=Counter)
    live: int = 0
    peak: int = 0

    def track(self, name: str, stored_nbytes: int, tensor: torch.Tensor) -> None:
        self.bytes_read += stored_nbytes
        self.reads[name] += 1
        nbytes = tensor.untyped_storage().nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(tensor.untyped_storage(), self._freed, nbytes)

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


class TensorStore:
    """Tensors of safetensors files, read on demand through ``safe_open`` (memory-mapped: a tensor stored in
    the dtype asked for is not even copied), counted by a :class:`WeightMeter`."""

    def __init__(self, files: list[Path]) -> None:
        self.index = tensor_index(files)
        self.meter = WeightMeter()

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def read(self, names: list[str], dtype: torch.dtype, device: torch.device,
             compute_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Floating tensors rounded to ``dtype`` (the weights' precision), then held in ``compute_dtype``."""
        from safetensors import safe_open

        missing = [n for n in names if n not in self.index]
        if missing:
            raise DepthlabError(f"the checkpoint lacks tensor(s) {missing[:3]}; it does not match its config")
        out: dict[str, torch.Tensor] = {}
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.index[name].file, []).append(name)
        for file, group in by_file.items():
            with safe_open(str(file), "pt", device="cpu") as f:
                for name in group:
                    t = f.get_tensor(name)
                    if t.is_floating_point():
                        t = t.to(device=device, dtype=dtype).to(compute_dtype or dtype)
                    else:
                        t = t.to(device)
                    self.meter.track(name, self.index[name].nbytes, t)
                    out[name] = t
        return out

    def nbytes(self, names: list[str] | None = None) -> int:
        return sum(self.index[n].nbytes for n in (names if names is not None else self.index))


# ---------------------------------------------------------------------------------------------- layer calls
@dataclass
class Call:
    """How the model called one layer: the arguments after the hidden states (masks, rotary tables). A family whose
    blocks also read per-token values (``Family.token_args``) gets them from ``tokens(ids)`` for the batch's ids,
    repeated over the streams its rows stack; a multi-stream block (``streams`` = (n, D)) is handed its (B, T, n, D)
    state and returns it, both flattened to (B, T, n·D) outside."""

    args: tuple
    kwargs: dict
    hidden_is_kwarg: bool
    streams: tuple[int, ...] = ()
    token_slots: tuple[tuple[str, int | None], ...] = ()  # (argument, its index in ``args``; None: a keyword)
    tokens: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None  # ids (B, T) -> those arguments
    row_args: tuple[str, ...] = ()  # keyword arguments recorded for one row, expanded to the call's rows

    def __call__(self, layer: nn.Module, h: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        args, kwargs = self.args, self.kwargs
        if self.token_slots:
            if ids is None or self.tokens is None:
                raise DepthlabError("this model's blocks read the token ids; the layer call needs them")
            values, rows = self.tokens(ids), h.shape[0] // ids.shape[0]
            args, kwargs = list(args), dict(kwargs)
            for name, pos in self.token_slots:
                v = values[name].repeat(rows, *[1] * (values[name].dim() - 1))  # stream-major rows, as the caller stacks
                if pos is None:
                    kwargs[name] = v
                else:
                    args[pos] = v
        for name in self.row_args:
            v = kwargs.get(name)
            if isinstance(v, torch.Tensor) and v.shape[0] == 1:
                kwargs = {**kwargs, name: v.expand(h.shape[0], *v.shape[1:])}
        if self.streams:
            h = h.unflatten(-1, self.streams)
        out = layer(*args, **{**kwargs, "hidden_states": h}) if self.hidden_is_kwarg else layer(h, *args, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.flatten(2) if self.streams else out


class _Stub(nn.Module):
    """Stands in for a layer while the model's forward runs: records its call (and with ``hidden``, its input),
    returns its input."""

    def __init__(self, calls: list[Call | None], i: int, hidden: list | None = None) -> None:
        super().__init__()
        self.calls, self.i, self.hidden = calls, i, hidden

    def forward(self, *args, **kwargs):
        kw = not args or not isinstance(args[0], torch.Tensor)
        h = kwargs.get("hidden_states") if kw else args[0]
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        self.calls[self.i] = Call(args if kw else args[1:], rest, kw)
        if self.hidden is not None:
            self.hidden.append(h)
        return h


@contextlib.contextmanager
def _swapped(owner: nn.Module, swaps: dict[str, nn.Module]) -> Iterator[None]:
    """Submodules of ``owner`` replaced for the duration (``owner._modules`` set directly)."""
    saved = {name: owner._modules[name] for name in swaps}
    try:
        owner._modules.update(swaps)
        yield
    finally:
        owner._modules.update(saved)


# ---------------------------------------------------------------------------------------------- the source
class LayerSource:
    """A model on the meta device whose modules are materialised from a :class:`TensorStore` on demand."""

    skeleton: nn.Module
    owner: nn.Module  # holds the layer list ...
    layers_attr: str  # ... under this name
    embed_modules: tuple[nn.Module, ...]  # applied in order to token ids
    head_modules: tuple[nn.Module, ...]  # final norm, LM head
    final_norm_attr: tuple[nn.Module, str]  # (owner, name) of the final norm, swapped out while recording calls
    state_width: int  # width of the residual state between blocks as the engine holds it ((B, T, n·D) for n streams)
    check_finite: bool = False  # refuse NaN/inf weights as they are read (depthlab runs, as load_run does)

    def __init__(self, store: TensorStore, device: torch.device, dtype: torch.dtype, compute_dtype: torch.dtype,
                 aliases: dict[str, str]) -> None:
        self.store, self.device, self.dtype, self.compute_dtype = store, device, dtype, compute_dtype
        self.aliases = aliases  # key -> key actually stored (a tied head reads the embedding)
        self._calls: dict[int, list[Call]] = {}

    # ------------------------------------------------------------------ structure
    def _names(self) -> dict[int, str]:
        """Module -> its dotted name in the skeleton (cached: the structure never changes)."""
        if getattr(self, "_names_cache", None) is None:
            self._names_cache = {id(m): name for name, m in self.skeleton.named_modules()}
        return self._names_cache

    @property
    def layers(self) -> nn.ModuleList:
        return getattr(self.owner, self.layers_attr)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def keys_of(self, module: nn.Module) -> list[str]:
        """Checkpoint keys of ``module``'s tensors (aliases resolved)."""
        prefix = self._names()[id(module)]
        keys = [f"{prefix}.{k}" if prefix else k for k in module.state_dict()]
        return [self.aliases.get(k, k) if k not in self.store else k for k in keys]

    def layer_nbytes(self, i: int) -> int:
        """Bytes layer ``i`` (0-based) occupies in the checkpoint."""
        return self.store.nbytes(self.keys_of(self.layers[i]))

    def layer_numel(self, i: int) -> int:
        """Elements of layer ``i``'s tensors."""
        return sum(self.store.index[k].numel for k in self.keys_of(self.layers[i]))

    # ------------------------------------------------------------------ materialising
    def materialise(self, module: nn.Module) -> None:
        local = list(module.state_dict())
        keys = self.keys_of(module)
        tensors = self.store.read(keys, self.dtype, self.device, self.compute_dtype)
        state = {k: tensors[key] for k, key in zip(local, keys)}
        del tensors
        if self.check_finite:
            bad = next((k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
            if bad is not None:
                raise DepthlabError(f"the checkpoint holds NaN/inf weights ({self.keys_of(module)[local.index(bad)]}); "
                                    "refusing to use it")
        self._fill_computed(module)  # before the weights: an initialisation may touch them too
        try:
            module.load_state_dict(state, strict=True, assign=True)
            module.requires_grad_(False)  # no autograd graph may keep a released layer's weights alive
        except RuntimeError as err:
            raise DepthlabError(f"the checkpoint does not match its config: {first_line(err)[:200]}") from None
        left = [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
        if left:
            raise DepthlabError(f"cannot stream {type(module).__name__}: it holds tensors the checkpoint lacks {left[:3]}")

    def _fill_computed(self, module: nn.Module) -> None:
        """Tensors ``module`` computes rather than stores (none here; HF models: non-persistent buffers)."""

    @staticmethod
    def release(module: nn.Module) -> None:
        module.to("meta")

    @contextlib.contextmanager
    def layer(self, i: int) -> Iterator[nn.Module]:
        """Layer ``i`` (0-based) with its weights, released on exit."""
        layer = self.layers[i]
        self.materialise(layer)
        try:
            yield layer
        finally:
            self.release(layer)

    @contextlib.contextmanager
    def head(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """Final norm + LM head: residual stream (B, T, D) -> logits (B, T, V); released on exit."""
        for m in self.head_modules:
            self.materialise(m)
        try:
            def head(h: torch.Tensor) -> torch.Tensor:
                for m in self.head_modules:
                    h = m(h)
                return h
            yield head
        finally:
            for m in self.head_modules:
                self.release(m)

    @contextlib.contextmanager
    def embedding(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """Token ids (B, T) -> the input of block 1 (B, T, D); released on exit."""
        for m in self.embed_modules:
            self.materialise(m)
        try:
            def embed(ids: torch.Tensor) -> torch.Tensor:
                h = ids
                for m in self.embed_modules:
                    h = m(h)
                return h
            yield embed
        finally:
            for m in self.embed_modules:
                self.release(m)

    # ------------------------------------------------------------------ calls
    def layer_calls(self, seq_len: int) -> list[Call]:
        """How the model's own forward calls each layer on a sequence of ``seq_len`` tokens (batch 1:
        masks and rotary tables broadcast over any number of rows)."""
        if seq_len not in self._calls:
            calls: list[Call | None] = [None] * self.n_layers
            stubs = nn.ModuleList(_Stub(calls, i) for i in range(self.n_layers))
            with _swapped(self.owner, {self.layers_attr: stubs}), self._after_layers_off():
                self._record(seq_len)
            if any(c is None for c in calls):
                raise DepthlabError("the model's forward did not call every layer; cannot stream it")
            self._calls[seq_len] = [self._bind(i, c) for i, c in enumerate(calls)]  # type: ignore[arg-type]
        return self._calls[seq_len]

    def _after_layers_off(self) -> contextlib.AbstractContextManager:
        """What the model applies after its last block (the final norm) replaced by identities."""
        owner, name = self.final_norm_attr
        return _swapped(owner, {name: nn.Identity()})

    def _bind(self, i: int, call: Call) -> Call:
        """Layer ``i``'s recorded call, completed with what it needs beyond the recording (none here)."""
        return call

    def _record(self, seq_len: int) -> None:
        raise NotImplementedError


class _Reached(Exception):
    """Raised by the first layer's stand-in: the model's forward got as far as block 1 (its input is ``h``)."""

    def __init__(self, h: torch.Tensor) -> None:
        super().__init__("block 1 reached")
        self.h = h


class _StopAtFirst(nn.Module):
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
        return torch.zeros(out.shape, dtype=out.dtype if not out.is_floating_point() else self.dtype, device=self.device)


class _Given(nn.Module):
    """Stands in for the base model under the LM head: returns the (normed) residual stream it is given."""

    def __init__(self, h: torch.Tensor) -> None:
        super().__init__()
        self.h = h

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
    return (mapping, sources) if sources else ([], {})


class HFLayerSource(LayerSource):
    """An HF causal LM directory: transformers' own classes, built from its config on the meta device; where the
    blocks and the final norm sit comes from the family's entry (:mod:`depthlab.hf.families`). Block 1's input
    is what the model's own forward hands it (embedding scaled, position embeddings added: Gemma, GPT-2, Granite),
    and the logits what the LM's own forward makes of the final norm's output (soft-capping, logit scaling)."""

    def __init__(self, path: Path, store: TensorStore, device: torch.device, dtype: torch.dtype,
                 compute_dtype: torch.dtype) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        from depthlab.hf.families import family_of, split_path
        from depthlab.hf.lns import apply_layernorm_scaling, layernorm_scaling_marker

        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        self.family = family_of(config.model_type, "stream")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=compute_dtype)
        if layernorm_scaling_marker(model.config) is not None:
            apply_layernorm_scaling(model)  # hooks on the meta layers' norms: they stay through every load
        self.skeleton = model.eval()
        self.owner, self.layers_attr = split_path(model, self.family.layers)
        self.final_norm_attr = split_path(model, self.family.final_norm)
        self.collapse_attr = split_path(model, self.family.collapse) if self.family.collapse else None
        self.base_attr = self.family.layers.split(".")[0]  # the LM's base model, under its head
        names = self._names()
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = {f"{names[id(head)]}.weight": f"{names[id(embed)]}.weight"}
        super().__init__(store, device, dtype, compute_dtype, tied)
        self.mapping, self.sources = _conversion(model, store)
        after = [getattr(*a) for a in (self.collapse_attr, self.final_norm_attr) if a is not None]
        inner = [m for m in self.owner.children() if m is not self.layers and all(m is not a for a in after)]
        for m in inner:
            if not m.state_dict():
                self._fill_computed(m)  # rotary tables: small and computed, not stored; built once on the device
        self.embed_modules = tuple(m for m in inner if m.state_dict())
        self.head_modules = (*after, head)
        n = int(getattr(config, self.family.streams)) if self.family.streams else 1
        self.streams = (n, config.hidden_size) if self.family.streams else ()
        self.state_width = n * config.hidden_size
        self._tokens: dict[tuple, list[dict[str, torch.Tensor]]] = {}  # per-token block inputs, by batch

    # ------------------------------------------------------------------ checkpoint keys
    def keys_of(self, module: nn.Module) -> list[str]:
        """Checkpoint keys of ``module``'s tensors: those transformers converts them from, else its own (tied aliases
        resolved)."""
        if not self.sources:
            return super().keys_of(module)
        prefix = self._names()[id(module)]
        out: list[str] = []
        for key in (f"{prefix}.{k}" if prefix else k for k in module.state_dict()):
            out.extend(self.sources.get(key) or [key if key in self.store else self.aliases.get(key, key)])
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

        tensors = self.store.read(self.keys_of(module), self.dtype, self.device, self.compute_dtype)
        self._fill_computed(module)  # before the weights: an initialisation may touch them too
        convert_and_load_state_dict_in_model(self.skeleton, tensors,
                                             LoadStateDictConfig(weight_mapping=self.mapping, dtype=self.compute_dtype))
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
            for n in meta:
                setattr(sub, n, torch.empty_like(getattr(sub, n), device=self.device))
            with torch.no_grad():
                self.skeleton._init_weights(sub)

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
        for m in self.embed_modules:
            self.materialise(m)
        try:
            yield self._embed_all if self.family.token_args else self._embed_first
        finally:
            for m in self.embed_modules:
                self.release(m)

    def _embed_first(self, ids: torch.Tensor) -> torch.Tensor:
        """The model's forward up to block 1, stopped there."""
        stops = nn.ModuleList([_StopAtFirst()])
        with _swapped(self.owner, {self.layers_attr: stops}), torch.no_grad():
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
        stubs = nn.ModuleList(_Stub(calls, i, hidden) for i in range(self.n_layers))
        with _swapped(self.owner, {self.layers_attr: stubs}), self._after_layers_off(), torch.no_grad():
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
                stack.enter_context(_swapped(attr[0], {attr[1]: nn.Identity()}))
        return stack

    def _bind(self, i: int, call: Call) -> Call:
        slots = self._token_slots(call)
        tokens = (lambda ids: self.token_inputs(ids)[i]) if slots else None
        return Call(call.args, call.kwargs, call.hidden_is_kwarg, self.streams, slots, tokens, self.family.row_args)

    @contextlib.contextmanager
    def head(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """The streams collapsed (DeepSeek-V4), the final norm, then the LM's own forward from there (LM head,
        soft-capping, logit scaling); released on exit."""
        *after, lm_head = self.head_modules
        for m in self.head_modules:
            self.materialise(m)
        try:
            def head(h: torch.Tensor) -> torch.Tensor:
                ids = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)
                h = h.unflatten(-1, self.streams) if self.streams else h
                for m in after:
                    h = m(h)
                with _swapped(self.skeleton, {self.base_attr: _Given(h)}):
                    return self.skeleton(input_ids=ids, use_cache=False).logits
            yield head
        finally:
            for m in self.head_modules:
                self.release(m)

    def _record(self, seq_len: int) -> None:
        ids = torch.zeros(1, seq_len, dtype=torch.long, device=self.device)
        stored = {name: _ZerosOf(m, self.compute_dtype, self.device) for name, m in self.owner.named_children()
                  if any(m is e for e in self.embed_modules)}  # embedding tables (and projections): zeros of their shape
        with torch.no_grad(), _swapped(self.owner, stored):
            self.owner(input_ids=ids, use_cache=False)


def _ids_key(ids: torch.Tensor) -> tuple:
    """A batch of token ids as a dictionary key (its shape, device and values)."""
    return (tuple(ids.shape), str(ids.device), hash(ids.cpu().numpy().tobytes()))


class RunLayerSource(LayerSource):
    """A depthlab run's checkpoint: its ``DecoderLM`` (blocks from the scheme registry) on the meta device."""

    def __init__(self, cfg: Any, store: TensorStore, device: torch.device, dtype: torch.dtype,
                 compute_dtype: torch.dtype) -> None:
        from depthlab.models.decoder import DecoderLM

        with torch.device("meta"):
            model = DecoderLM(cfg)
        self.skeleton, self.owner, self.layers_attr = model.eval(), model, "blocks"
        super().__init__(store, device, dtype, compute_dtype, {"lm_head.weight": "embed.weight"})
        self.embed_modules = (model.embed, model.embed_norm)
        self.check_finite = True
        self.head_modules = (model.norm, model.lm_head)
        self.final_norm_attr = (model, "norm")
        self.state_width = cfg.d_model

    def _record(self, seq_len: int) -> None:
        self.skeleton.run_blocks(torch.zeros(1, seq_len, self.skeleton.cfg.d_model, dtype=self.compute_dtype,
                                             device=self.device))


# ---------------------------------------------------------------------------------------------- targets
@dataclass
class StreamTarget:
    """What :class:`~depthlab.targets.Target` says of a model, for one read layer by layer (``source``)."""

    source: LayerSource
    name: str
    kind: str  # "hf-causal-lm" | "depthlab"
    tokenizer: Any
    info: dict[str, Any]
    max_seq_len: int | None
    device: torch.device
    path: Path | None = None  # the HF directory or the run's checkpoint directory
    batches_for: Callable[[Any], Any] | None = None
    causal: bool = True
    plan: Any = None  # the EnginePlan that chose to stream it (depthlab.targets.engine), when one did

    @property
    def n_params(self) -> int:
        return self.info["n_params"]


@dataclass(frozen=True)
class Located:
    """A streamable checkpoint found on disk, before anything is built."""

    kind: str  # "hf" | "run"
    path: Path  # HF directory, or the run's checkpoint directory
    files: tuple[Path, ...]
    config: dict[str, Any]  # HF config.json, or the run's config.json
    run: Any = field(default=None, compare=False)  # a run: its checkpoint opened (depthlab.targets.runs.RunCheckpoint)


def locate(name: str) -> Located | str:
    """The streamable checkpoint ``name`` designates, or a sentence saying why it is not streamable."""
    from depthlab.hf.families import check_config, family_of

    path = Path(name).expanduser()
    if not path.is_dir():
        return f"{name!r} is not a directory (streaming reads HF safetensors directories and depthlab runs)"
    if (path / "checkpoint").is_dir() or (path / "trainer_state.json").is_file() or path.name == "checkpoint":
        return _locate_run(path)
    if not (path / "config.json").is_file():
        return f"{name!r} holds no config.json"
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        return f"its config.json is unreadable ({first_line(err)[:100]})"
    model_type = config.get("model_type") if isinstance(config, dict) else None
    try:
        family_of(model_type, "stream")
        check_config(config, "stream")  # what this config of the family cannot do (Gemma 4's KV sharing)
    except DepthlabError as err:
        return first_line(err)
    files = safetensors_files(path)
    if not files:
        return f"{name!r} holds no *.safetensors weights (streaming memory-maps safetensors files)"
    return Located("hf", path, tuple(files), config)


def _locate_run(path: Path) -> Located | str:
    """A run's newest intact checkpoint, opened by the one run loader without reading its tensors."""
    from depthlab.targets.runs import open_run

    try:
        run = open_run(path, weights=False)
    except DepthlabError as err:
        return first_line(err)
    if run.kind.name != "lm":
        return f"a {run.kind.name} run is not streamable (only decoder LM runs are)"
    return Located("run", run.path, (run.path / "model.safetensors",), run.config, run)


def stored_bytes(located: Located, dtype: torch.dtype) -> int:
    """Bytes the whole model takes in memory in ``dtype`` (floating tensors converted), from the headers."""
    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for info in tensor_index(list(located.files)).values():
        total += info.numel * size if info.dtype.startswith(("F", "BF")) else info.nbytes
    return total


def open_layerwise(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   compute_dtype: torch.dtype | None = None, found: Located | None = None) -> StreamTarget:
    """``name`` (an HF safetensors directory or a depthlab run) as a :class:`StreamTarget`; weights in
    ``dtype``, each layer computed in ``compute_dtype`` (default ``dtype``). ``found``: ``locate(name)`` done."""
    found = found if found is not None else locate(name)
    if isinstance(found, str):
        raise DepthlabError(f"cannot stream {name!r}: {found}")
    device = torch.device(device)
    compute_dtype = compute_dtype or dtype
    store = TensorStore(list(found.files))
    if found.kind == "run":
        target = _run_target(found, name, store, device, dtype, compute_dtype)
        check_source(target.source, str(found.path))  # the whole checkpoint, before the first layer
        return target
    from depthlab.data.tokenizers import model_tokenizer

    source = HFLayerSource(found.path, store, device, dtype, compute_dtype)
    check_source(source, str(found.path))  # the whole checkpoint, before the first layer
    cfg = source.skeleton.config
    info = {"source": str(found.path), "architecture": type(source.skeleton).__name__, "model_type": cfg.model_type,
            "n_layers": source.n_layers, "d_model": cfg.hidden_size, "n_heads": cfg.num_attention_heads,
            "n_kv_heads": getattr(cfg, "num_key_value_heads", None), "d_ff": getattr(cfg, "intermediate_size", None),
            "vocab_size": cfg.vocab_size, "n_params": sum(i.numel for i in store.index.values()),
            "layernorm_scaling": getattr(cfg, "layernorm_scaling", None), "depthlab_export": getattr(cfg, "depthlab", None),
            "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    return StreamTarget(source, name, "hf-causal-lm", model_tokenizer(found.path), info,
                        getattr(cfg, "max_position_embeddings", None), device, found.path)


def _run_target(found: Located, name: str, store: TensorStore, device: torch.device, dtype: torch.dtype,
                compute_dtype: torch.dtype) -> StreamTarget:
    """A depthlab run, opened by the one run loader (:func:`depthlab.targets.runs.open_run`: scheme checked against the
    weights' metadata, tokenizer beside the checkpoint), its blocks from the scheme registry."""
    run = found.run
    source = RunLayerSource(run.model_cfg, store, device, dtype, compute_dtype)
    n_params = sum(p.numel() for p in {id(p): p for p in source.skeleton.parameters()}.values())
    info = {**run.info(name, n_params), "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    return StreamTarget(source, name, "depthlab", run.tokenizer, info, run.model_cfg.max_seq_len, device, found.path)
