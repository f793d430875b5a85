"""Atomic, resumable checkpoints and the run-directory loader.

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

A checkpoint is written into ``checkpoint/.tmp-*``, every file fsynced, then renamed into place, so
a crash mid-write leaves only a ``.tmp-*`` directory, which is never loaded. ``trainer_state.json``
lists each file's size; a directory whose files do not match (e.g. a copy cut short) is skipped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from depthlab.errors import DepthlabError

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoint"
STATE = "trainer_state.json"
_STEP_RE = re.compile(r"step-(\d+)$")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def save_checkpoint(run_dir: str | Path, step: int, model_sd: dict[str, torch.Tensor], optim_sd: dict,
                    trainer_state: dict[str, Any], config: dict[str, Any], keep_last: int = 2) -> Path:
    """Write ``checkpoint/step-N`` atomically and prune to the last ``keep_last``. Returns its path."""
    from safetensors.torch import save_file

    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:08d}-", dir=root))
    model_cfg = config["model"]
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model_sd.items()}
    save_file(tensors, str(tmp / "model.safetensors"),
              metadata={"format": "pt", "scheme": model_cfg["scheme"], "model_config": json.dumps(model_cfg)})
    torch.save(optim_sd, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    files = {p.name: p.stat().st_size for p in tmp.iterdir()}
    (tmp / STATE).write_text(json.dumps({**trainer_state, "step": step, "files": files, "complete": True}, indent=2) + "\n")
    for p in tmp.iterdir():
        _fsync(p)
    _fsync(tmp)
    if final.exists():  # re-saving a step: move the old one aside first
        old = root / f".old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync(root)
    for stale in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def is_complete(ckpt: Path) -> bool:
    """True when ``ckpt`` is a checkpoint whose every file is present with its recorded size."""
    try:
        state = json.loads((ckpt / STATE).read_text())
    except (OSError, ValueError):
        return False
    files = state.get("files") or {}
    if not state.get("complete") or "model.safetensors" not in files:
        return False
    return all((ckpt / n).is_file() and (ckpt / n).stat().st_size == size for n, size in files.items())


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
            log.warning("skipping incomplete checkpoint %s", p)
    return good


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint a path names: a checkpoint dir itself, a run's ``checkpoint/`` (its latest),
    or a run directory (its latest complete checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise DepthlabError(f"{str(path)!r} does not exist")
    if (path / STATE).is_file():
        if not is_complete(path):
            raise DepthlabError(f"checkpoint {str(path)!r} is incomplete (interrupted write?)")
        return path
    run_dir = path.parent if path.name == CKPT_DIR else path
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise DepthlabError(f"{str(path)!r} holds no complete checkpoint")
    return ckpts[-1]


def read_checkpoint(ckpt: Path, with_optimizer: bool = True) -> dict[str, Any]:
    """Model tensors, optimizer state, RNG state, trainer state and config of a checkpoint."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        meta = f.metadata() or {}
    out = {
        "model": load_file(str(ckpt / "model.safetensors")),
        "meta": meta,
        "state": json.loads((ckpt / STATE).read_text()),
        "config": json.loads((ckpt / "config.json").read_text()),
    }
    if with_optimizer:
        out["optimizer"] = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        out["rng"] = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=True)
    return out


def load_run(path: str | Path, device: str | torch.device | None = None):
    """``(model, tokenizer, config_dict)`` from a run directory, its ``checkpoint/`` or one
    checkpoint. The model is rebuilt with the scheme its config names; weights whose recorded scheme
    differs from it are refused, never loaded into another architecture."""
    from depthlab.data.tokenizers import load_tokenizer
    from depthlab.train.family import family_named

    ckpt = find_checkpoint(path)
    data = read_checkpoint(ckpt, with_optimizer=False)
    config = data["config"]
    family = family_named(config.get("family"))  # LM or ViT (runs from before families: LM)
    model_cfg = family.config_type.from_dict(config["model"])
    scheme = data["meta"].get("scheme")
    if scheme != model_cfg.scheme:
        raise DepthlabError(f"checkpoint {str(ckpt)!r} holds weights of scheme {scheme!r}, "
                            f"but its config says {model_cfg.scheme!r}; refusing to load")
    model = family.with_weights(model_cfg, data["model"], f"checkpoint {str(ckpt)!r}", device)
    tokenizer = None
    for tdir in (ckpt.parent.parent / "tokenizer", ckpt / "tokenizer"):
        if tdir.is_dir():
            tokenizer = load_tokenizer(tdir)
            break
    if tokenizer is None and config.get("tokenizer") is not None:
        log.warning("no tokenizer/ found beside %s", ckpt)
    return model, tokenizer, config
