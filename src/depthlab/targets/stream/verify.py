"""The whole checkpoint of a streamed model checked before its first layer is read.

    check_source(source, where)          # every tensor the model reads: there, of its shape and a float dtype;
                                         # nothing stored the model has no place for; every weight finite

Every header and the index were checked when the store was built (:func:`~depthlab.targets.stream.safetensors.read_header`,
:func:`~depthlab.targets.stream.safetensors.check_index`).

The in-memory engine finds all of this when it loads the model (``depthlab.hf.loading``); the streamed engine
reads one layer at a time, so without these checks a damaged checkpoint surfaced mid-sweep (a raw
``SafetensorError`` after minutes of work) or never (a config.json claiming 3 layers over 4 layers of weights
gave a 3-layer diagnosis; an untied model without its head was pruned into a checkpoint without one). So the check
holds the checkpoint against the skeleton built from config.json, for any family, by what the skeleton itself says:

* **present**: every tensor of every module the engine reads (embedding, every layer, final norm, head). The head is
  the embedding only where the skeleton ties them (``tie_word_embeddings``); MoE experts stored one by one (which
  transformers fuses on load) are each required, by a dry run of transformers' own conversion on meta tensors;
* **of its shape and a floating dtype**: stored tensors against the skeleton's, converted ones by that dry run;
* **nothing beyond**: a stored tensor the model has no place for (a layer past config.json's layer count, whatever
  the family calls the count: GPT-2's ``n_layer``, ...) is refused, as the in-memory loader refuses it, save what
  transformers itself ignores on load (``_keys_to_ignore_on_load_unexpected``: DeepSeek's MTP layers);
* **finite**: every floating weight, read once, one tensor at a time (in chunks: the memory of one chunk), without
  counting in the engine's :class:`~depthlab.targets.stream.safetensors.WeightMeter`.

Each failure is one line naming the directory, the tensor and (for a shape or dtype) the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line
from depthlab.targets.stream.safetensors import FLOAT_DTYPES

#: Elements checked for finiteness at a time (memory: that many floats and flags).
CHUNK = 1 << 22


@dataclass
class _Expected:
    """What the engine will read, by checkpoint key."""

    direct: dict[str, torch.Tensor] = field(default_factory=dict)  # stored as the skeleton holds it
    converted: dict[str, list[str]] = field(default_factory=dict)  # skeleton key -> checkpoint keys it is built from
    head: str | None = None  # the checkpoint key of an untied head

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self.direct, *(k for ks in self.converted.values() for k in ks)]))


def check_source(source: Any, where: str, finite: bool = True) -> None:
    """Every tensor the streamed model ``source`` (a :class:`~depthlab.targets.stream.source.LayerSource`) will read:
    present, of the shape its skeleton expects and of a floating dtype where the skeleton holds floats; nothing
    stored that the model has no place for; every floating weight finite (``finite``). One line naming ``where`` and
    the tensor."""
    expected = _expected(source)
    _check_present(source, expected, where)
    _check_unexpected(source, expected, where)
    _check_direct(source, expected, where)
    if expected.converted:
        _check_converted(source, expected, where)
    if finite:
        store = source.store
        _check_finite(store, sorted(expected.keys(), key=lambda k: (str(store.index[k].file), k)), where)


# ---------------------------------------------------------------------------------------------- what is read
def _stored_modules(source: Any) -> tuple[torch.nn.Module, ...]:
    stored = getattr(source, "stored_modules", None)
    return stored() if callable(stored) else (*source.embed_modules, *source.layers, *source.head_modules)


def _expected(source: Any) -> _Expected:
    """Each skeleton tensor of the modules the engine reads, by the checkpoint key(s) it is read from."""
    store, names = source.store, source._names()
    sources: dict[str, list[str]] = getattr(source, "sources", None) or {}
    converted = _converted_targets(source) if sources else set()
    head = _untied_head(source)
    out = _Expected()
    for module in _stored_modules(source):
        prefix = names[id(module)]
        for local, t in module.state_dict(keep_vars=True).items():
            full = f"{prefix}.{local}" if prefix else local
            if full not in sources and full not in store:
                full = source.aliases.get(full, full)  # a tied head reads the embedding
            srcs = sources.get(full)
            if srcs and full in converted:
                out.converted[full] = srcs
            else:
                key = srcs[0] if srcs else full
                out.direct[key] = t
                if full == head:
                    out.head = key
    return out


def _untied_head(source: Any) -> str | None:
    """The skeleton key of the LM head's weight when it is not the embedding's (an untied model), else None."""
    skeleton = getattr(source, "skeleton", None)
    get_in, get_out = (getattr(skeleton, n, None) for n in ("get_input_embeddings", "get_output_embeddings"))
    if not callable(get_in) or not callable(get_out):
        return None
    embed, head = get_in(), get_out()
    if head is None or embed is None or head.weight is embed.weight:
        return None
    names = source._names()
    return f"{names[id(head)]}.weight" if id(head) in names else None


def _converted_targets(source: Any) -> set[str]:
    """Skeleton keys built by one of transformers' weight converters (experts stored one by one, fused on load), as
    opposed to those only renamed."""
    from transformers.core_model_loading import WeightConverter, rename_source_key

    mapping = getattr(source, "mapping", None) or []
    renamings = [t for t in mapping if not isinstance(t, WeightConverter)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    out = set()
    for target, keys in source.sources.items():
        if any(rename_source_key(k, renamings, converters)[1] is not None for k in keys):
            out.add(target)
    return out


def _layer_prefix(source: Any) -> str | None:
    """The skeleton's dotted name of its block list (``model.layers``, GPT-2's ``transformer.h``)."""
    try:
        return source._names()[id(source.layers)]
    except (KeyError, AttributeError):
        return None


def _layer_of(key: str, prefix: str | None) -> int | None:
    """The 0-based layer index of a skeleton key under the block list, else None."""
    if not prefix:
        return None
    m = re.match(rf"{re.escape(prefix)}\.(\d+)\.", key)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------------- the checks
def _check_present(source: Any, expected: _Expected, where: str) -> None:
    store = source.store
    missing = [k for k in expected.direct if k not in store]
    if not missing:
        return
    if expected.head in missing:
        raise DepthlabError(f"cannot stream {where!r}: its head is not tied to the embedding (config.json: "
                            f"tie_word_embeddings false), but the weights hold no {expected.head!r}; refusing to "
                            "use it (plain transformers would draw a random head)")
    prefix, n = _layer_prefix(source), source.n_layers
    layers = sorted({i for k in missing if (i := _layer_of(k, prefix)) is not None})
    whole = [i for i in layers if not any(_layer_of(k, prefix) == i and k in store for k in expected.direct)]
    if whole:
        raise DepthlabError(f"cannot stream {where!r}: config.json says {n} layers, the weights lack layer(s) "
                            f"{whole[:6]} (missing tensor {missing[0]!r}); fix the layer count or the weights")
    raise DepthlabError(f"cannot stream {where!r}: the weights lack tensor {missing[0]!r}"
                        + (f" of layer {layers[0] + 1}" if layers else "") + " that the config needs")


def _check_unexpected(source: Any, expected: _Expected, where: str) -> None:
    """Nothing stored the model has no place for (a layer beyond the config's count above all)."""
    store, skeleton = source.store, source.skeleton
    read = set(expected.keys())
    placed = set(skeleton.state_dict())  # every tensor the model holds, read by the engine or not (in-memory's rule)
    targets = {k: t for t, ks in (getattr(source, "sources", None) or {}).items() for k in ks}
    ignored = [re.compile(p) for p in getattr(skeleton, "_keys_to_ignore_on_load_unexpected", None) or ()]
    extra = [k for k in store.index if k not in read and targets.get(k, k) not in placed
             and not any(p.search(k) for p in ignored)]
    if not extra:
        return
    prefix, n = _layer_prefix(source), source.n_layers
    layers = sorted({i for k in extra if (i := _layer_of(targets.get(k, k), prefix)) is not None and i >= n})
    if layers:
        first = next(k for k in extra if _layer_of(targets.get(k, k), prefix) in layers)
        raise DepthlabError(f"cannot stream {where!r}: config.json says {n} layers, but the weights hold layer(s) "
                            f"{layers[:6]} beyond them (e.g. {first!r}); fix the layer count or the weights")
    raise DepthlabError(f"cannot stream {where!r}: the weights hold tensors the config has no place for, e.g. "
                        f"{extra[0]!r} (in {store.index[extra[0]].file.name!r}); refusing to guess what they are")


def _check_direct(source: Any, expected: _Expected, where: str) -> None:
    """Tensors read as stored: the skeleton's shape, a floating dtype where it holds floats."""
    index = source.store.index
    for key, t in expected.direct.items():
        info = index[key]
        if tuple(info.shape) != tuple(t.shape):
            raise DepthlabError(f"cannot stream {where!r}: tensor {key!r} in {info.file.name!r} is {list(info.shape)}, "
                                f"the config makes it {list(t.shape)}")
        if t.is_floating_point() and info.dtype not in FLOAT_DTYPES:
            raise DepthlabError(f"cannot stream {where!r}: tensor {key!r} in {info.file.name!r} is stored as "
                                f"{info.dtype}, not a floating dtype ({', '.join(FLOAT_DTYPES)})")


def _check_converted(source: Any, expected: _Expected, where: str) -> None:
    """Tensors transformers builds from several stored ones (experts stored one by one): every source there, of a
    floating dtype, and the conversion, run on meta tensors of the stored shapes, giving the skeleton's shape."""
    index = source.store.index
    state = source.skeleton.state_dict()
    for target, keys in expected.converted.items():
        for key in keys:
            if state[target].is_floating_point() and index[key].dtype not in FLOAT_DTYPES:
                raise DepthlabError(f"cannot stream {where!r}: tensor {key!r} in {index[key].file.name!r} is stored as "
                                    f"{index[key].dtype}, not a floating dtype ({', '.join(FLOAT_DTYPES)})")
        try:
            shapes = _dry_convert(source, keys)
        except Exception as err:  # noqa: BLE001 - a conversion that cannot run (sizes that do not stack) is the finding
            shapes, why = {}, first_line(err)[:160]
        else:
            why = None
        want = tuple(state[target].shape)
        got = shapes.get(target)
        if got == want:
            continue
        lacking = _lacking(source, target, keys, want)
        if lacking:
            raise DepthlabError(f"cannot stream {where!r}: the weights lack tensor {lacking[0]!r} ({target!r} is built "
                                f"from {len(keys) + len(lacking)} tensors stored one by one, {len(lacking)} missing)")
        said = f"gives {list(got)}" if got is not None else f"fails ({why})" if why else "gives nothing"
        raise DepthlabError(f"cannot stream {where!r}: {target!r}, built from {len(keys)} stored tensors "
                            f"(e.g. {keys[0]!r}), {said}; the config makes it {list(want)}")


def _dry_convert(source: Any, keys: list[str]) -> dict[str, tuple[int, ...]]:
    """transformers' own conversion of the checkpoint tensors ``keys`` (as its loader groups them), run on meta tensors
    of their stored shapes: skeleton key -> the shape it would get. Nothing is read or assigned."""
    from copy import deepcopy

    from transformers.core_model_loading import WeightConverter, dot_natural_key, rename_source_key

    skeleton, index = source.skeleton, source.store.index
    renamings = [t for t in source.mapping if not isinstance(t, WeightConverter)]
    converters = [t for t in source.mapping if isinstance(t, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    groups: dict[str, Any] = {}
    for key in sorted(keys, key=dot_natural_key):
        target, pattern = rename_source_key(key, renamings, converters)
        if pattern is None:
            continue
        info = index[key]
        meta = torch.empty(info.shape, dtype=torch.float32, device="meta")
        groups.setdefault(target, deepcopy(by_pattern[pattern])).add_tensor(target, key, pattern, lambda m=meta: m)
    out: dict[str, tuple[int, ...]] = {}
    for target, converter in groups.items():
        for name, value in converter.convert(target, model=skeleton, config=skeleton.config).items():
            value = value[0] if isinstance(value, list) else value
            out[name] = tuple(value.shape)
    return out


def _lacking(source: Any, target: str, keys: list[str], want: tuple[int, ...]) -> list[str]:
    """The checkpoint keys missing from a family of keys stored one by one (``...experts.<i>.w1.weight``): for each
    stored name with its index replaced by ``<i>``, the indices below the number of entries the target stacks (its
    first dimension) or any sibling holds that are absent."""
    stacks = re.compile(r"^(.*\.)(\d+)(\..*)$")
    families: dict[tuple[str, str], set[int]] = {}
    for key in keys:
        m = stacks.match(key)
        if m:
            families.setdefault((m.group(1), m.group(3)), set()).add(int(m.group(2)))
    if not families:
        return []
    seen = set().union(*families.values())
    count = max(max(seen) + 1, want[0] if want else 0)
    return [f"{a}{i}{b}" for (a, b), have in sorted(families.items()) for i in range(count)
            if i not in have and f"{a}{i}{b}" not in source.store]


def _check_finite(store: Any, keys: list[str], where: str) -> None:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for key in keys:
        by_file.setdefault(store.index[key].file, []).append(key)
    for file, names in by_file.items():
        with safe_open(str(file), "pt", device="cpu") as f:
            for key in dict.fromkeys(names):
                if store.index[key].dtype not in FLOAT_DTYPES:
                    continue
                flat = f.get_tensor(key).reshape(-1)
                for a in range(0, flat.numel(), CHUNK):
                    chunk = flat[a:a + CHUNK]
                    if not bool(torch.isfinite(chunk.float() if chunk.element_size() == 1 else chunk).all()):
                        raise DepthlabError(f"cannot stream {where!r}: it holds NaN/inf weights ({key} in "
                                            f"{file.name!r}); refusing to use it")
                del flat
