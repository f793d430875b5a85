"""Depthlab run directories as models: ``load_run`` (model, tokenizer, config) and a run as a ``Target``.

    run = open_run("runs/lns", weights=False)            # the newest intact checkpoint: config, tokenizer, scheme checked
    model, tokenizer, config = load_run("runs/lns")      # a run dir, its checkpoint/ or one checkpoint
    target = run_target(Path("runs/vit"), "runs/vit")     # an LM run, or a ViT run with its held-out images

:func:`open_run` is the one run loader: the in-memory engine builds the model from its tensors, the layer-streamed
engine (:mod:`depthlab.targets.stream`) reads them one layer at a time, and both report the same ``info``.

A run's model is rebuilt from the family and scheme its config.json names (``depthlab.models.kinds``), from the
newest intact checkpoint (``depthlab.base.store.checkpoint``); weights of another scheme are refused. A ViT run is
diagnosed on the held-out images it evaluated on: its data spec (``--data`` overrides it) split as the
trainer splits it (``depthlab.data.images``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line
from depthlab.base.store.checkpoint import load_intact, read_weights
from depthlab.base.store.integrity import first_nonfinite
from depthlab.models.kinds import kind_named
from depthlab.targets.target import Target

log = logging.getLogger(__name__)

#: The --data default of ``diagnose`` (an LM corpus); a ViT run then reads its own images instead.
LM_DEFAULT_DATA = "builtin"


@dataclass
class RunCheckpoint:
    """A run's newest intact checkpoint, read as far as both engines need it: the one run loader (in memory,
    :func:`load_run`; one layer at a time, :mod:`depthlab.targets.stream`)."""

    path: Path  # the checkpoint directory
    config: dict[str, Any]  # the run's config.json, as the checkpoint holds it
    kind: Any  # depthlab.models.kinds.ModelKind: LM or ViT
    model_cfg: Any  # its family's config (ModelConfig, ViTConfig)
    tokenizer: Any  # the run's tokenizer, or None
    meta: dict[str, str] = field(default_factory=dict)  # model.safetensors' metadata (scheme, aliases)
    weights: dict[str, torch.Tensor] | None = None  # the model tensors, once read

    def read_weights(self) -> dict[str, torch.Tensor]:
        """The model tensors (read once; the checksums were verified when the checkpoint was opened); NaN/inf
        weights are refused."""
        if self.weights is None:
            try:
                weights = read_weights(self.path, self.meta)
            except Exception as err:  # noqa: BLE001 - safetensors errors: one line
                raise DepthlabError(f"checkpoint {str(self.path)!r} is unreadable: {first_line(err)[:200]}") from None
            bad = first_nonfinite(("weights", weights))
            if bad is not None:
                raise DepthlabError(f"checkpoint {str(self.path)!r} holds NaN/inf weights ({bad}); refusing to use it")
            self.weights = weights
        return self.weights

    def info(self, name: str | Path, n_params: int) -> dict[str, Any]:
        """What a report says of the model (both engines say the same)."""
        cfg = self.model_cfg
        info = {"source": f"depthlab run {Path(name).expanduser()}", "scheme": cfg.scheme,
                "scheme_options": cfg.scheme_options, "n_layers": cfg.n_layers, "d_model": cfg.d_model,
                "n_heads": cfg.n_heads, "d_ff": cfg.d_ff, "n_params": n_params, "config": cfg.to_dict(),
                "train": self.config.get("train")}
        if self.kind.name == "lm":
            info.update(architecture="depthlab.DecoderLM", n_kv_heads=cfg.kv_heads, vocab_size=cfg.vocab_size)
        return info


def open_run(path: str | Path, weights: bool = True) -> RunCheckpoint:
    """The newest intact checkpoint of a run directory, its ``checkpoint/`` or one checkpoint (a damaged newer one
    is named in a warning and passed over): its config, the model config of its family, its tokenizer and, with
    ``weights``, its tensors (:meth:`RunCheckpoint.read_weights`). Weights whose recorded scheme differs from the
    config's are refused, never loaded into another architecture."""
    from depthlab.data.tokenizers import load_tokenizer

    ckpt, data = load_intact(path, with_optimizer=False, with_model=False)
    config = data["config"]
    kind = kind_named(config.get("family"))  # LM or ViT (runs from before kinds: LM)
    model_cfg = kind.config_type.from_dict(config["model"])
    scheme = data["meta"].get("scheme")
    if scheme != model_cfg.scheme:
        raise DepthlabError(f"checkpoint {str(ckpt)!r} holds weights of scheme {scheme!r}, "
                            f"but its config says {model_cfg.scheme!r}; refusing to load")
    tokenizer = None
    for tdir in (ckpt.parent.parent / "tokenizer", ckpt / "tokenizer"):
        if tdir.is_dir():
            tokenizer = load_tokenizer(tdir)
            break
    if tokenizer is None and config.get("tokenizer") is not None:
        log.warning("no tokenizer/ found beside %s", ckpt)
    run = RunCheckpoint(ckpt, config, kind, model_cfg, tokenizer, meta=data["meta"])
    if weights:
        run.read_weights()
    return run


def load_run(path: str | Path, device: str | torch.device | None = None):
    """``(model, tokenizer, config_dict)`` from a run directory, its ``checkpoint/`` or one
    checkpoint (:func:`open_run`: the newest intact one, its scheme checked)."""
    return load_run_checkpoint(path, device)[:3]


def load_run_checkpoint(path: str | Path, device: str | torch.device | None = None, run: RunCheckpoint | None = None):
    """:func:`load_run` plus the checkpoint directory used: ``(model, tokenizer, config_dict, checkpoint)``.
    ``run``: the checkpoint already opened (its tensors are read now if they were not)."""
    run = run if run is not None else open_run(path)
    model = run.kind.with_weights(run.model_cfg, run.read_weights(), f"checkpoint {str(run.path)!r}", device)
    return model, run.tokenizer, run.config, run.path


def run_target(path: Path, name: str, run: RunCheckpoint | None = None) -> Target:
    """The run at ``path`` (what the user named ``name``) as a :class:`Target` of kind ``depthlab`` or
    ``depthlab-vit``; ``run``: the checkpoint already opened."""
    run = run if run is not None else open_run(path)
    model, tokenizer, config, _ = load_run_checkpoint(path, run=run)
    cfg = model.cfg
    info = run.info(path, model.num_params())
    if config.get("family") != "vit":
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
