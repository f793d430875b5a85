"""A model whose modules are read from the checkpoint one at a time, and how its own forward calls each layer.

    src = target.source                         # a LayerSource (HF: stream.hf.HFLayerSource; run: stream.run)
    with src.embedding() as embed:              # the embedding read, used and released on exit
        h = embed(ids)                          # (B, T, D): block 1's input
    calls = src.layer_calls(T)                  # how the model calls each layer at length T (masks, rotary)
    for i in range(src.n_layers):
        with src.layer(i) as layer:             # layer i's tensors read, built into that layer alone
            h = calls[i](layer, h, ids)         # ... and released on exit (ids: for blocks that read them)
    with src.head() as head:                    # final norm + LM head
        logits = head(h)

The model is built once on the meta device (a *skeleton*: no memory). A module is *materialised* by loading its
tensors from the memory-mapped safetensors files (``load_state_dict(assign=True)``) and *released* by moving it
back to ``meta``, so one layer's tensors are alive at a time. How each layer is called (attention masks, rotary
tables, per-layer attention types) is recorded from the model's own forward run once per sequence length with stub
layers that return their input (:class:`Call`): nothing of the model's mask or rotary code is re-implemented.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from depthlab.base.errors import DepthlabError, first_line
from depthlab.targets.stream.safetensors import TensorStore


# ---------------------------------------------------------------------------------------------- layer calls
@dataclass
class Call:
    """How the model called one layer: the arguments after the hidden states (masks, rotary tables). A family whose
    blocks also read per-token values (``Family.token_args``) gets them from ``tokens(ids)`` for the batch's ids,
    repeated over the lanes its rows stack; a block of several residual streams (``streams`` = (n, D), DeepSeek-V4's
    hyper-connections) is handed its (B, T, n, D) state and returns it, both flattened to (B, T, n·D) outside."""

    args: tuple
    kwargs: dict
    hidden_is_kwarg: bool
    streams: tuple[int, ...] = ()
    token_slots: tuple[tuple[str, int | None], ...] = ()  # (argument, its index in ``args``; None: a keyword)
    tokens: Callable[[torch.Tensor], dict[str, torch.Tensor]] | None = None  # ids (B, T) -> those arguments
    row_args: tuple[str, ...] = ()  # keyword arguments recorded for one row, expanded to the call's rows
    row_scaled: tuple[str | int, ...] = ()  # arguments (name, or index in args) that grow with the rows: repeated

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
        if self.row_scaled and h.shape[0] > 1:  # the one recorded row's, repeated (BLOOM's alibi: rows x heads)
            args, kwargs = list(args), dict(kwargs)
            for key in (k for k in self.row_scaled if k not in self.row_args):  # those already expanded above
                where, v = (args if isinstance(key, int) else kwargs), (args if isinstance(key, int) else kwargs)[key]
                where[key] = v.expand(h.shape[0], *v.shape[1:]) if v.shape[0] == 1 else \
                    v.repeat(h.shape[0], *[1] * (v.dim() - 1))  # a view where it can be: no copy per row
        if self.streams:
            h = h.unflatten(-1, self.streams)
        out = layer(*args, **{**kwargs, "hidden_states": h}) if self.hidden_is_kwarg else layer(h, *args, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.flatten(2) if self.streams else out


def _on_meta(x: Any) -> Any:
    """``x`` with every tensor in it (nested in tuples, lists, dicts) moved to the meta device."""
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, (tuple, list)):
        return type(x)(_on_meta(v) for v in x)
    if isinstance(x, dict):
        return {k: _on_meta(v) for k, v in x.items()}
    return x


def zeros_like(x: Any, device: torch.device, floats: torch.dtype | None = None) -> Any:
    """``x``'s structure with every tensor replaced by zeros of its shape and dtype (``floats`` for floating ones,
    when given) on ``device``."""
    if isinstance(x, torch.Tensor):
        dtype = floats if floats is not None and x.is_floating_point() else x.dtype
        return torch.zeros(x.shape, dtype=dtype, device=device)
    if isinstance(x, (tuple, list)):
        return type(x)(zeros_like(v, device, floats) for v in x)
    if isinstance(x, dict):
        return {k: zeros_like(v, device, floats) for k, v in x.items()}
    return x


def _returned(block: nn.Module, h: torch.Tensor) -> Any:
    """``h`` in the structure ``block.forward``'s code returns: ``(h, None, ...)`` when its return statements return a
    tuple of n (read from the source; annotations are not trusted: some say a tuple and return a tensor)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(type(block).forward))))
    except (OSError, TypeError, SyntaxError):
        return h
    fn = tree.body[0]
    returns, todo = [], list(getattr(fn, "body", []))
    while todo:  # the function's own statements, not those of functions defined inside it
        node = todo.pop()
        if isinstance(node, ast.Return):
            returns.append(node.value)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    sizes = {len(r.elts) if isinstance(r, ast.Tuple) else 0 for r in returns}
    if len(sizes) == 1 and min(sizes) > 1:
        return (h, *[None] * (sizes.pop() - 1))
    return h


class StandIn(nn.Module):
    """Stands in for a block while the model's forward runs: what the model reads of the block itself (its
    ``attention_type``, ``block_type``, submodules) is read from the real block (on the meta device), and what it
    returns has the real block's structure (a tensor, or a tuple: ``hidden, attn_weights = layer(...)``), learnt by
    calling the real block on the meta device (no memory, no weight), the hidden state in the first place and zeros
    in the others."""

    def __init__(self, block: nn.Module | None = None) -> None:
        super().__init__()
        self.__dict__["_block"] = block  # not a submodule: the stand-in registers no tensors of its own

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            block = self.__dict__.get("_block")
            if block is None:
                raise
            return getattr(block, name)

    def returns(self, h: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        """``h`` in the structure the real block returns for this call (``h`` alone when it cannot be told)."""
        block = self.__dict__.get("_block")
        if block is None:
            return h
        state = {n: t.to("meta") for n, t in (*block.named_parameters(), *block.named_buffers())}
        try:  # the block on the meta device even when its weights are read (a sweep records calls mid-way)
            with torch.no_grad():
                out = torch.func.functional_call(block, state, _on_meta(args), _on_meta(kwargs))
        except Exception:  # noqa: BLE001 - a block that cannot run on the meta device (data-dependent routing)
            return _returned(block, h)
        if isinstance(out, (tuple, list)) and out:
            return type(out)((h, *zeros_like(tuple(out[1:]), h.device)))
        return h


class PassOn(StandIn):
    """Stands in for a module the engine applies itself (the final norm while the layer calls are recorded): returns
    its input; what the model reads of it (Zaya's ``norm.weight.dtype``) is read from the real one."""

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x


class Stub(StandIn):
    """Stands in for a layer while the model's forward runs: records its call (and with ``hidden``, its input),
    returns its input (in the real block's structure, :class:`StandIn`)."""

    def __init__(self, calls: list[Call | None], i: int, hidden: list | None = None,
                 block: nn.Module | None = None) -> None:
        super().__init__(block)
        self.calls, self.i, self.hidden = calls, i, hidden

    def forward(self, *args, **kwargs):
        kw = not args or not isinstance(args[0], torch.Tensor)
        h = kwargs.get("hidden_states") if kw else args[0]
        rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        self.calls[self.i] = Call(args if kw else args[1:], rest, kw)
        if self.hidden is not None:
            self.hidden.append(h)
        return self.returns(h, args, kwargs)


def stubs(layers: nn.ModuleList, calls: list[Call | None], hidden: list | None = None) -> nn.ModuleList:
    """A :class:`Stub` for each of ``layers`` (the skeleton's, on the meta device), recording into ``calls``."""
    return nn.ModuleList(Stub(calls, i, hidden, block) for i, block in enumerate(layers))


@contextlib.contextmanager
def swapped(owner: nn.Module, swaps: dict[str, nn.Module]) -> Iterator[None]:
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
    final_norm_attr: tuple[nn.Module, str] | None  # (owner, name) of the final norm (None: none), off while recording
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

    def stored_modules(self) -> tuple[nn.Module, ...]:
        """Every module whose tensors the checkpoint stores and this source may read (checked whole before the
        first layer: :mod:`~depthlab.targets.stream.verify`): the embedding, the layers, the head."""
        return (*self.embed_modules, *self.layers, *self.head_modules)

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
        """How the model's own forward calls each layer on a sequence of ``seq_len`` tokens (recorded for one row:
        masks and rotary tables broadcast over any number of rows; those that grow with the rows, found by recording
        two, are expanded or repeated to the rows of each call)."""
        if seq_len not in self._calls:
            calls = self._recorded(seq_len, 1)
            if any(c is None for c in calls):
                raise DepthlabError("the model's forward did not call every layer; cannot stream it")
            try:  # recorded again for two rows: the arguments that grow with the rows are repeated per call
                twice = self._recorded(seq_len, 2)
            except Exception:  # noqa: BLE001 - a model that records one row only: nothing repeated
                twice = [None] * self.n_layers
            for one, two in zip(calls, twice):
                one.row_scaled = _row_scaled(one, two)  # type: ignore[union-attr]
            self._calls[seq_len] = [self._bind(i, c) for i, c in enumerate(calls)]  # type: ignore[arg-type]
        return self._calls[seq_len]

    def _recorded(self, seq_len: int, rows: int) -> list[Call | None]:
        calls: list[Call | None] = [None] * self.n_layers
        with swapped(self.owner, {self.layers_attr: stubs(self.layers, calls)}), self._after_layers_off():
            self._record(seq_len, rows)
        return calls

    def calls_for(self, batch: Any) -> list[Call]:
        """How the model calls each layer on a sweep's ``batch`` (:class:`~depthlab.targets.stream.sweep.SweepBatch`):
        by its length (token ids alone), or as recorded from that batch's own inputs (an image-text batch)."""
        return self.layer_calls(batch.ids.shape[1])

    def _after_layers_off(self) -> contextlib.AbstractContextManager:
        """What the model applies after its last block (the final norm) replaced by identities."""
        if self.final_norm_attr is None:
            return contextlib.nullcontext()
        owner, name = self.final_norm_attr
        return swapped(owner, {name: PassOn(getattr(owner, name))})

    def _bind(self, i: int, call: Call) -> Call:
        """Layer ``i``'s recorded call, completed with what it needs beyond the recording (none here)."""
        return call

    def _record(self, seq_len: int, rows: int = 1) -> None:
        raise NotImplementedError


def _row_scaled(one: Call | None, two: Call | None) -> tuple[str | int, ...]:
    """The arguments (keyword names, positions in ``args``) of a call recorded for one row whose first dimension
    doubles when recorded for two (XGLM's mask, BLOOM's alibi): they belong to each row, and are repeated for the
    rows of a call."""
    if one is None or two is None or len(one.args) != len(two.args):
        return ()

    def grows(a: Any, b: Any) -> bool:
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim() > 0
                and a.shape[0] > 0 and b.shape[0] == 2 * a.shape[0])

    return (*(i for i, (a, b) in enumerate(zip(one.args, two.args)) if grows(a, b)),
            *(k for k, v in one.kwargs.items() if grows(v, two.kwargs.get(k))))

