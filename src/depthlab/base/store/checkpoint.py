"""The checkpoint format of a run directory: atomic writes, integrity checks, reading the newest intact one.

Layout of a run directory::

    config.json            {"model", "train", "tokenizer", "versions", "command", "world_size"}
    tokenizer/             the saved tokenizer
    metrics.jsonl          train / eval / layer_variance lines
    summary.json           final eval_loss, eval_ppl, layer_variance, tokens, wall_s, tokens_per_s
    checkpoint/step-00000100/
        model.safetensors  weights (metadata: scheme, model config)
        optimizer.pt       optimizer state (full, keyed by parameter name)
        rng.pt             torch / numpy / python RNG states
        config.json        copy of the run config (a checkpoint is self-describing)
        trainer_state.json step, tokens, sequences consumed, file sizes; written LAST

A checkpoint is written into ``checkpoint/.step-N.tmp-<pid>``, every file fsynced, then renamed into place, so
a crash mid-write leaves only a ``.tmp-`` directory, which is never loaded (and removed by the next
training session). ``trainer_state.json`` lists each file's size and sha256; a directory whose files
do not match (a copy cut short, damaged bytes) is skipped with a warning, and the newest intact
checkpoint is used instead. The loop writes only checkpoints whose every tensor is finite.
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.fileio import publish, sha256_file

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoint"
STATE = "trainer_state.json"
_STEP_RE = re.compile(r"step-(\d+)$")


def rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain containers (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
            "python": list(random.getstate()[1]), "python_version": random.getstate()[0],
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate((state["python_version"], tuple(state["python"]), None))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def split_aliases(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU tensors to store, each memory stored once, and ``{alias: stored name}`` for the names that share
    one (tied embeddings: ``lm_head.weight`` is ``embed.weight``; safetensors refuses to store both)."""
    seen: dict[tuple, str] = {}
    tensors, aliases = {}, {}
    for name, value in state.items():
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), tuple(value.stride()),
               value.dtype, value.device)
        if key in seen and value.numel():
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = value.detach().to("cpu").contiguous()
    return tensors, aliases


def save_checkpoint(run_dir: str | Path, step: int, model_sd: dict[str, torch.Tensor], optim_sd: dict,
                    trainer_state: dict[str, Any], config: dict[str, Any], keep_last: int = 2) -> Path:
    """Write ``checkpoint/step-N`` atomically (:func:`depthlab.base.fileio.publish`) and prune to the last
    ``keep_last``. Returns its path. A failed write (disk full) raises DepthlabError and leaves the earlier
    checkpoints untouched."""
    final = Path(run_dir) / CKPT_DIR / f"step-{step:08d}"
    try:
        with publish(final, directory=True) as tmp:  # re-saving a step replaces it whole
            _write_files(tmp, step, model_sd, optim_sd, trainer_state, config)
    except DepthlabError as err:
        raise DepthlabError(f"cannot write checkpoint step {step}: {err}") from None
    for stale in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _write_files(tmp: Path, step: int, model_sd: dict[str, torch.Tensor], optim_sd: dict,
                 trainer_state: dict[str, Any], config: dict[str, Any]) -> None:
    """Write every file of a checkpoint into ``tmp``, sizes and sha256 in trainer_state.json, written last."""
    from safetensors.torch import save_file

    model_cfg = config["model"]
    tensors, aliases = split_aliases(model_sd)
    save_file(tensors, str(tmp / "model.safetensors"),
              metadata={"format": "pt", "scheme": model_cfg["scheme"], "model_config": json.dumps(model_cfg),
                        "aliases": json.dumps(aliases)})
    torch.save(optim_sd, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    files = {p.name: p.stat().st_size for p in tmp.iterdir()}
    sums = {p.name: sha256_file(p) for p in tmp.iterdir()}
    record = {**trainer_state, "step": step, "files": files, "sha256": sums, "complete": True}
    (tmp / STATE).write_text(json.dumps(record, indent=2) + "\n")


def remove_stale_tmp(run_dir: str | Path) -> None:
    """Remove the temporary directories crashed checkpoint writes left in ``checkpoint/`` (call with the run's
    lock held): ``.step-N.tmp-<pid>`` and ``.step-N.old-<pid>`` (:mod:`depthlab.base.fileio`'s names), and the
    ``.tmp-*`` / ``.old-*`` of runs written before that convention."""
    root = Path(run_dir) / CKPT_DIR
    for p in [*root.glob(".tmp-*"), *root.glob(".step-*.tmp-*")] if root.is_dir() else []:
        log.info("removing %s (left by an interrupted checkpoint write)", p)
        shutil.rmtree(p, ignore_errors=True)
    for p in [*root.glob(".old-*"), *root.glob(".step-*.old-*")] if root.is_dir() else []:
        shutil.rmtree(p, ignore_errors=True)


def is_complete(ckpt: Path) -> bool:
    """True when ``ckpt`` is a checkpoint whose every file is present with its recorded size."""
    return damage(ckpt, verify=False) is None


def damage(ckpt: Path, verify: bool = True) -> str | None:
    """Why ``ckpt`` cannot be trusted (a missing or resized file; with ``verify``, a checksum that
    differs), or None when it is intact."""
    try:
        state = json.loads((ckpt / STATE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{STATE} is missing or unreadable"
    files = state.get("files") if isinstance(state, dict) else None
    if not isinstance(files, dict) or not state.get("complete") or "model.safetensors" not in files:
        return f"{STATE} does not describe a complete checkpoint"
    for name, size in files.items():
        if not (ckpt / name).is_file() or (ckpt / name).stat().st_size != size:
            return f"{name} is missing or has the wrong size"
    sums = (state.get("sha256") or {}) if verify else {}
    for name, digest in sums.items():
        if name != STATE and sha256_file(ckpt / name) != digest:
            return f"{name} does not match its checksum"
    return None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete ``step-N`` checkpoints of a run, oldest first (``.tmp-*`` and broken ones skipped)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()]
    good = []
    for _, p in sorted(found):
        if is_complete(p):
            good.append(p)
        else:
            _warn_once(p, "skipping incomplete checkpoint %s", p)
    return good


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint a path names: a checkpoint dir itself, a run's ``checkpoint/`` (its latest),
    or a run directory (its latest complete checkpoint). Checksums are not verified here (see
    :func:`load_intact`)."""
    path = Path(path)
    if not path.exists():
        raise DepthlabError(f"{str(path)!r} does not exist")
    if (path / STATE).is_file():
        if not is_complete(path):
            raise DepthlabError(f"checkpoint {str(path)!r} is incomplete (interrupted write?)")
        return path
    ckpts = list_checkpoints(_run_of(path))
    if not ckpts:
        raise DepthlabError(f"{str(path)!r} holds no complete checkpoint")
    return ckpts[-1]


def _run_of(path: Path) -> Path:
    return path.parent if path.name == CKPT_DIR else path


def load_intact(path: str | Path, with_optimizer: bool = True, with_model: bool = True) -> tuple[Path, dict[str, Any]]:
    """``(checkpoint, read_checkpoint(checkpoint))`` of the newest intact checkpoint ``path`` names:
    a checkpoint directory must itself be intact; in a run directory a damaged checkpoint (checksum,
    unreadable file) is named in a warning and the next older one is used. Raises DepthlabError when
    none is intact. ``with_model=False``: the weights are checksummed but not read (``meta`` and the rest are)."""
    path = Path(path)
    if not path.exists():
        raise DepthlabError(f"{str(path)!r} does not exist")
    single = (path / STATE).exists()
    candidates = [path] if single else list(reversed(list_checkpoints(_run_of(path))))
    if not candidates:
        raise DepthlabError(f"{str(path)!r} holds no complete checkpoint")
    for ckpt in candidates:
        why = damage(ckpt)
        if why is None:
            try:
                return ckpt, read_checkpoint(ckpt, with_optimizer, with_model)
            except DepthlabError as err:
                why = str(err)
        if single:
            raise DepthlabError(f"checkpoint {str(ckpt)!r} is damaged: {why}")
        _warn_once(ckpt, "checkpoint %s is damaged (%s); trying the previous one", ckpt, why)
    raise DepthlabError(f"{str(path)!r} holds no intact checkpoint (all {len(candidates)} are damaged)")


#: The warnings about damaged or incomplete checkpoints given in this process: a command that opens a run twice (its
#: plan reads the metadata, its load the weights) names each checkpoint once, not twice.
_WARNED: set[tuple[str, ...]] = set()


def _warn_once(ckpt: Path, message: str, *args: Any) -> None:
    key = (str(ckpt.resolve()), message, *map(str, args[1:]))
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message, *args)


def _load_tensors(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise DepthlabError(f"{str(path)!r} holds objects other than tensors and plain containers; "
                            "refusing to unpickle it (not written by depthlab, or tampered with)") from None


def read_checkpoint(ckpt: Path, with_optimizer: bool = True, with_model: bool = True) -> dict[str, Any]:
    """Model tensors (``model``, with ``with_model``), their metadata (``meta``), optimizer state, RNG state,
    trainer state and config of a checkpoint (DepthlabError, one line, when a file is unreadable or not what
    depthlab writes)."""
    try:
        return _read_checkpoint(ckpt, with_optimizer, with_model)
    except DepthlabError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors, json, torch.load errors: one line
        raise DepthlabError(f"checkpoint {str(ckpt)!r} is unreadable: {type(err).__name__}: "
                            f"{first_line(err)[:200]}") from None


def read_weights(ckpt: Path, meta: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The model tensors of checkpoint ``ckpt``, a tied weight under each of its names (``meta``: the file's
    metadata, read when not given)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if meta is None:
        with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
            meta = f.metadata() or {}
    model = load_file(str(ckpt / "model.safetensors"))
    for alias, original in json.loads(meta.get("aliases") or "{}").items():
        model[alias] = model[original]  # a tied weight, stored once
    return model


def _read_checkpoint(ckpt: Path, with_optimizer: bool, with_model: bool = True) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        meta = f.metadata() or {}
    out = {
        **({"model": read_weights(ckpt, meta)} if with_model else {}),
        "meta": meta,
        "state": json.loads((ckpt / STATE).read_text()),
        "config": json.loads((ckpt / "config.json").read_text()),
    }
    if with_optimizer:
        out["optimizer"] = _load_tensors(ckpt / "optimizer.pt")
        out["rng"] = _load_tensors(ckpt / "rng.pt")
    return out
