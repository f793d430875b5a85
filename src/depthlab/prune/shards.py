"""A pruned HF checkpoint written shard by shard, without ever holding the model.

    write_pruned_shards(Path("big-model"), [21, 22, 23], Path("pruned"), provenance={"method": "angular-block"})

Each source safetensors file becomes one output file holding its kept tensors, their bytes copied straight
from the source file in chunks (a few MiB of memory whatever the model's size): the tensors of a removed
layer are skipped, layer indices are renumbered (``model.layers.{old}.`` -> ``model.layers.{new}.``; the
prefix is the family entry's ``layers``), and a checkpoint marked with LayerNorm Scaling gets each kept
layer's pre-norms (weight, and bias where there is one) scaled by the 1/sqrt(l) of its *original* depth l
(as :func:`depthlab.hf.fold_layernorm_scaling` does in memory; the marker is dropped), so plain
``transformers`` loads the same function. The config is cut as :func:`depthlab.prune.export.drop_layers`
cuts it (:func:`depthlab.hf.families.cut_config`). Tensors keep the checkpoint's dtype. Every file is
written under a temporary name and renamed; ``config.json`` comes last.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import publish
from depthlab.hf.families import INFERRED, Family, layer_slice_index
from depthlab.hf.wrappers import check_tower, cut_tower, tower_config, tower_family, tower_layers, wrapper_of
from depthlab.targets.engine import gib
from depthlab.targets.stream.safetensors import INDEX_FILE, read_header, safetensors_files

COPY_CHUNK = 16 << 20  # bytes copied at a time


def layer_key(fam: Family) -> re.Pattern:
    """Checkpoint keys of the family's blocks: (prefix, index, rest)."""
    return re.compile(rf"^({re.escape(fam.layers)}\.)(\d+)(\..*)$")


def _renamed(name: str, renumber: dict[int, int], pattern: re.Pattern) -> str | None:
    """The key in the pruned checkpoint, or None for a tensor of a removed layer."""
    m = pattern.match(name)
    if m is None:
        return name
    old = int(m.group(2))
    return f"{m.group(1)}{renumber[old]}{m.group(3)}" if old in renumber else None


def _nbytes(entry: dict[str, Any]) -> int:
    return entry["data_offsets"][1] - entry["data_offsets"][0]


def _folded(file: Path, name: str, scale: float, offset: float) -> bytes:
    """A pre-norm weight (or bias) with its layer's LNS scale folded in, in its own dtype, as raw bytes."""
    from safetensors import safe_open

    from depthlab.hf.lns import fold_norm_

    with safe_open(str(file), "pt") as f:
        t = f.get_tensor(name).clone()
    if name.endswith(".bias"):
        fold_norm_(torch.zeros(0), t, scale)
    else:
        fold_norm_(t, None, scale, offset)
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _write_shard(src: Path, out: Path, keep: dict[str, str], folded: dict[str, bytes],
                 shapes: dict[str, list[int]] | None = None) -> int:
    """Copy the tensors ``keep`` (source name -> new name) of ``src`` into ``out``, those in ``folded`` (new name ->
    bytes) replaced, of the shape ``shapes`` gives where it changes; returns the data bytes."""
    header = read_header(src)
    shapes = shapes or {}
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    base = 8 + n
    names = sorted(keep, key=lambda k: header[k]["data_offsets"][0])
    entries, offset = {}, 0
    for name in names:
        new = keep[name]
        size = len(folded[new]) if new in folded else header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
        entries[new] = {"dtype": header[name]["dtype"], "shape": shapes.get(new, header[name]["shape"]),
                        "data_offsets": [offset, offset + size]}
        offset += size
    meta = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    meta += b" " * (-len(meta) % 8)  # aligned, as safetensors writes it
    with publish(out) as tmp, open(src, "rb") as fin, open(tmp, "wb") as fout:
        fout.write(struct.pack("<Q", len(meta)))
        fout.write(meta)
        for name in names:
            if keep[name] in folded:
                fout.write(folded[keep[name]])
                continue
            begin, end = header[name]["data_offsets"]
            fin.seek(base + begin)
            left = end - begin
            while left:
                chunk = fin.read(min(left, COPY_CHUNK))
                if not chunk:
                    raise DepthlabError(f"{str(src)!r} ends early (tensor {name}); the checkpoint is damaged")
                fout.write(chunk)
                left -= len(chunk)
    return offset


def _sliced(file: Path, name: str, dim: int, index: list[int]) -> tuple[bytes, list[int]]:
    """A tensor holding one slice per layer, cut to the kept layers' slices: (raw bytes in its dtype, its shape)."""
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        t = f.get_tensor(name).index_select(dim, torch.tensor(index)).contiguous()
    return t.view(torch.uint8).numpy().tobytes(), list(t.shape)


def module_keys(config: Any, keys: list[str]) -> dict[str, str]:
    """Checkpoint key -> the module key transformers loads it into (the same but where the family's checkpoint
    format renames, e.g. DeepSeek-V4's norms, or an image-text wrapper's legacy layout): which stored tensor is a
    pre-norm, and which belongs to a tower's block, is decided on the module's name."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    auto = AutoModelForImageTextToText if wrapper_of(config) is not None else AutoModelForCausalLM
    with torch.device("meta"):
        mapping = get_model_conversion_mapping(auto.from_config(config))
    if not mapping:
        return {k: k for k in keys}
    renamings = [t for t in mapping if not isinstance(t, WeightConverter)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    return {k: rename_source_key(k, renamings, converters)[0] for k in keys}


def pruned_config(src: Path, removed: list[int], provenance: dict[str, Any] | None, tower: str = "language"
                  ) -> tuple[Any, list[int], bool]:
    """(the pruned config, the kept 0-based layers, whether LNS is folded) of the checkpoint in ``src`` without the
    blocks ``removed`` of ``tower`` (an image-text wrapper's); refuses a family that cannot be pruned, before
    anything is written."""
    from transformers import AutoConfig

    from depthlab.hf.lns import CONFIG_KEY, layernorm_scaling_marker

    config = AutoConfig.from_pretrained(str(src), trust_remote_code=False)
    fam = tower_family(config, tower, "prune")
    n = tower_layers(config, tower)
    gone = set(removed)
    if sorted(b for b in gone if not 1 <= b <= n) or len(gone) >= n:
        raise DepthlabError(f"cannot remove blocks {sorted(gone)} from a model of {n} (1..{n}, keep at least one)")
    check_tower(config, tower, "prune", removed)  # blocks the config cannot lose
    keep = [i for i in range(n) if i + 1 not in gone]
    lns = tower == "language" and layernorm_scaling_marker(config) is not None  # LNS scales the language tower
    if lns:
        delattr(config, CONFIG_KEY)
    cut_tower(config, tower, keep, n)
    if fam.inferred:  # the export's record says so
        provenance = {**(provenance or {}), "layout": INFERRED}
    if provenance is not None:
        config.depthlab = {**(getattr(config, "depthlab", None) or {}), **provenance}
    return config, keep, lns


def stored_layer_key(config: Any, fam: Family, keys: list[str]) -> re.Pattern:
    """:func:`layer_key` for the checkpoint's own keys: the family's block path, or where the checkpoint stores the
    blocks when its keys are not the module paths (an image-text wrapper's legacy layout, found through
    transformers' conversion mapping: ``language_model.model.layers`` for ``model.language_model.layers``)."""
    modules = layer_key(fam)
    as_module = module_keys(config, keys)
    for key in keys:
        m = modules.match(as_module[key])
        if m is None or as_module[key] == key:
            continue
        at = key.find(f".{m.group(2)}{m.group(3)}")
        if at > 0:
            return re.compile(rf"^({re.escape(key[:at])}\.)(\d+)(\..*)$")
    return modules


#: How a tensor changes beyond the blocks removed, by checkpoint key: (its new key, or None when it goes; the rows
#: along dim 0 it keeps, or None when whole). ``prune --unit expert``'s experts (:func:`depthlab.hf.experts.key_plan`).
Rekey = dict[str, tuple["str | None", "list[int] | None"]]


def write_pruned_shards(src: Path, removed: list[int], out: Path, provenance: dict[str, Any] | None = None,
                        tokenizer: Any = None, zeroed: frozenset[str] = frozenset(), rekey: Rekey | None = None,
                        edit_config: Any = None, replace: dict[str, torch.Tensor] | None = None,
                        tower: str = "language") -> dict[str, Any]:
    """Write the checkpoint of ``src`` without blocks ``removed`` (1-based) of ``tower`` (a wrapper's: all of it
    written, processor files copied) into ``out``: ``zeroed`` keys (``--unit``'s output projections) as zeros,
    ``replace``'s tensors (``--heal linear``'s folded down projections) in their place, ``rekey``'s renamed, dropped
    or cut to rows, the config changed by ``edit_config``; returns what was written. Refuses when the disk is short."""
    from depthlab.hf.tokenizers import hf_tokenizer
    from depthlab.models.schemes import lns_scale

    config, keep, lns = pruned_config(src, removed, provenance, tower)
    if edit_config is not None:
        edit_config(config)
    fam = tower_family(config, tower, "prune")
    files = safetensors_files(src)
    pattern = stored_layer_key(config, fam, [k for f in files for k in read_header(f)])
    renumber = {old: new for new, old in enumerate(keep)}
    rekey = rekey or {}
    plans = []
    for file in files:
        names = {k: r for k in read_header(file) if (r := _renamed(k, renumber, pattern)) is not None}
        for k in rekey.keys() & names.keys():  # experts: applied to keys whose layer stays (no block goes with them)
            if rekey[k][0] is None:
                del names[k]
            else:
                names[k] = rekey[k][0]
        plans.append((file, names))
    stored = {int(m.group(2)) for file in files for k in read_header(file) if (m := pattern.match(k))}
    n = len(keep) + len(set(removed))
    if not set(range(n)) <= stored:
        raise DepthlabError(f"cannot cut {src} shard by shard: its checkpoint keeps its blocks under other keys than "
                            f"{fam.layers}.N (found {len(stored & set(range(n)))} of {n}; transformers renames them "
                            "on load); prune it in memory (--no-stream)")
    need = sum(h["data_offsets"][1] - h["data_offsets"][0] for file, names in plans
               for k, h in read_header(file).items() if k in names)
    out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free
    if need > free:
        raise DepthlabError(f"not enough disk for the pruned checkpoint in {str(out)!r}: it needs {gib(need)}, "
                            f"{gib(free)} are free")
    plans = [(f, names) for f, names in plans if names]
    single = len(plans) == 1
    weight_map, total = {}, 0
    as_module = module_keys(config, [k for _, names in plans for k in names]) if lns else {}
    for k, (file, names) in enumerate(plans, start=1):
        shard = "model.safetensors" if single else f"model-{k:05d}-of-{len(plans):05d}.safetensors"
        folded, shapes = {}, {}
        for old_name, new_name in names.items():
            cut = layer_slice_index(fam, old_name, tower_config(config, tower), keep)
            if cut is None and old_name in rekey and rekey[old_name][1] is not None:
                cut = (0, rekey[old_name][1])
            if cut is not None:
                folded[new_name], shapes[new_name] = _sliced(file, old_name, *cut)
        if lns:
            for old_name, new_name in names.items():
                m = layer_key(fam).match(as_module[old_name])
                if m and any(m.group(3) in (f".{norm}.weight", f".{norm}.bias") for norm in fam.pre_norms):
                    folded[new_name] = _folded(file, old_name, lns_scale(int(m.group(2)) + 1), fam.norm_offset)
        for old_name in zeroed.intersection(names):  # calloc'd: zero pages, not resident memory
            folded[names[old_name]] = bytes(_nbytes(read_header(file)[old_name]))
        for old_name in (replace or {}).keys() & names.keys():
            folded[names[old_name]] = replace[old_name].contiguous().view(torch.uint8).numpy().tobytes()
        total += _write_shard(file, out / shard, names, folded, shapes)
        weight_map.update(dict.fromkeys(names.values(), shard))
    if not single:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    for extra in ("generation_config.json",):
        if (src / extra).is_file():
            shutil.copyfile(src / extra, out / extra)
    if wrapper_of(config) is not None:
        copy_side_files(src, out)  # the processor, tokenizer and chat template, as they were
    else:
        hf_tok = hf_tokenizer(tokenizer) if tokenizer is not None else None
        if hf_tok is not None:
            hf_tok.save_pretrained(str(out))
    config.save_pretrained(str(out))  # last: a directory with config.json is complete
    return {"files": sorted({*weight_map.values()}), "bytes": total, "n_layers": len(keep), "lns_folded": lns}


#: Files of a model directory that are the weights or the config (written anew), not copied beside a pruned export.
WEIGHT_FILES = ("config.json", INDEX_FILE)


def copy_side_files(src: Path, out: Path) -> list[str]:
    """Every file of the model directory ``src`` that is not its weights or config (an image-text wrapper's
    processor, image processor, tokenizer, chat template, generation config) copied into ``out`` unless ``out``
    has it already; returns their names."""
    copied = []
    for f in sorted(Path(src).iterdir()):
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in WEIGHT_FILES \
                and not (out / f.name).exists():
            shutil.copyfile(f, out / f.name)
            copied.append(f.name)
    return copied
