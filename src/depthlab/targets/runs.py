"""Depthlab run directories as models: ``load_run`` (model, tokenizer, config) and a run as a ``Target``.

    model, tokenizer, config = load_run("runs/lns")      # a run dir, its checkpoint/ or one checkpoint
    target = run_target(Path("runs/vit"), "runs/vit")     # an LM run, or a ViT run with its held-out images

A run's model is rebuilt from the family and scheme its config.json names (``depthlab.models.families``), from the
newest intact checkpoint (``depthlab.base.store.checkpoint``); weights of another scheme are refused. A ViT run is
diagnosed on the held-out images it evaluated on: its data spec (``--data`` overrides it) split as the
trainer splits it (``depthlab.data.images``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.store.checkpoint import load_intact
from depthlab.base.store.integrity import first_nonfinite
from depthlab.models.families import family_named
from depthlab.targets.target import Target

log = logging.getLogger(__name__)

#: The --data default of ``diagnose`` (an LM corpus); a ViT run then reads its own images instead.
LM_DEFAULT_DATA = "builtin"


def load_run(path: str | Path, device: str | torch.device | None = None):
    """``(model, tokenizer, config_dict)`` from a run directory, its ``checkpoint/`` or one
    checkpoint. The model is rebuilt with the scheme its config names; weights whose recorded scheme
    differs from it are refused, never loaded into another architecture."""
    return load_run_checkpoint(path, device)[:3]


def load_run_checkpoint(path: str | Path, device: str | torch.device | None = None):
    """:func:`load_run` plus the checkpoint directory used: ``(model, tokenizer, config_dict, checkpoint)``; in a
    run directory the newest intact checkpoint (a damaged newer one is named in a warning and passed over)."""
    from depthlab.data.tokenizers import load_tokenizer

    ckpt, data = load_intact(path, with_optimizer=False)
    config = data["config"]
    family = family_named(config.get("family"))  # LM or ViT (runs from before families: LM)
    model_cfg = family.config_type.from_dict(config["model"])
    scheme = data["meta"].get("scheme")
    if scheme != model_cfg.scheme:
        raise DepthlabError(f"checkpoint {str(ckpt)!r} holds weights of scheme {scheme!r}, "
                            f"but its config says {model_cfg.scheme!r}; refusing to load")
    bad = first_nonfinite(("weights", data["model"]))
    if bad is not None:
        raise DepthlabError(f"checkpoint {str(ckpt)!r} holds NaN/inf weights ({bad}); refusing to use it")
    model = family.with_weights(model_cfg, data["model"], f"checkpoint {str(ckpt)!r}", device)
    tokenizer = None
    for tdir in (ckpt.parent.parent / "tokenizer", ckpt / "tokenizer"):
        if tdir.is_dir():
            tokenizer = load_tokenizer(tdir)
            break
    if tokenizer is None and config.get("tokenizer") is not None:
        log.warning("no tokenizer/ found beside %s", ckpt)
    return model, tokenizer, config, ckpt


def run_target(path: Path, name: str) -> Target:
    """The run at ``path`` (what the user named ``name``) as a :class:`Target` of kind ``depthlab`` or
    ``depthlab-vit``."""
    model, tokenizer, config = load_run(path)
    cfg = model.cfg
    info = {"source": f"depthlab run {path}", "scheme": cfg.scheme, "scheme_options": cfg.scheme_options,
            "n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_ff": cfg.d_ff,
            "n_params": model.num_params(), "config": cfg.to_dict(), "train": config.get("train")}
    if config.get("family") != "vit":
        info.update(architecture="depthlab.DecoderLM", n_kv_heads=cfg.kv_heads, vocab_size=cfg.vocab_size)
        return Target(model, name, "depthlab", tokenizer, info, cfg.max_seq_len)  # the context it was trained for
    info.update(architecture="depthlab.ViT", family="vit", image_size=cfg.image_size, patch_size=cfg.patch_size,
                num_classes=cfg.num_classes,
                not_measured="multiple-choice scoring (LM only); perplexity (a classifier has accuracy instead)")
    run_data = config["train"]["data"]

    def batches(opts: Any):
        from depthlab.data.images import HeldOutImages, load_run_images

        if opts.batch_size < 1 or opts.tokens < 1:
            raise DepthlabError("--tokens and --batch-size must be positive")
        data = load_run_images(run_data if opts.data == LM_DEFAULT_DATA else opts.data, cfg.image_size,
                               cfg.channels, cfg.num_classes)
        n = min(len(data.test_y), -(-opts.tokens // cfg.seq_len))
        return HeldOutImages(data, n, cfg.seq_len, opts.batch_size, next(model.parameters()).device)

    return Target(model, name, "depthlab-vit", None, info, cfg.seq_len, batches_for=batches)
