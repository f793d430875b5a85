"""``finetune(source, train_cfg, out)``: supervised fine-tuning of a depthlab run or an HF model,
through the pre-training loop itself.

    from depthlab.train.finetune import finetune
    from depthlab.train import TrainConfig
    summary = finetune("runs/lns", TrainConfig(data="builtin-sft", steps=100), "runs/lns-sft")

The source is a depthlab run directory (its latest complete checkpoint, or one checkpoint
directory) or a Hugging Face model directory. The model keeps its scheme: an ``lns`` run stays LNS
(1/sqrt(l) is part of the architecture), and an LNS-marked HF checkpoint loads as ``lns``
(:func:`depthlab.hf.from_hf`). The tokenizer is the source's own.

The trainer is reused whole (:func:`depthlab.train.train` with a
:class:`~depthlab.train.start.StartFrom`): the fresh run loads the source's weights before step 1,
and its data is SFT data: ``rank_batch`` serves ``(input_ids, labels)`` rows with the prompt masked
to -100 (so ``train_step`` and the held-out evaluation count response tokens only). Resume, atomic
checkpoints, metrics.jsonl, summary.json and the depth probes are the trainer's. config.json records
``finetune``: the source (path, kind, checkpoint, scheme), the data spec, the prompt template (name
and text), the split and the token counts.

SFT defaults (each overridable; see :data:`SFT_DEFAULTS`): LLM-Adapters fine-tunes with lr 3e-4 for
LoRA adapters, 3 epochs, 100 warm-up steps, batch 16, cut-off 256 tokens. Full fine-tuning updates
every weight, so the default lr is lower, 1e-4 (3e-5 from 100M non-embedding parameters up); the
number of steps defaults to 3 epochs of the training rows, the warm-up to 100 steps (at most 10% of
them), the sequence length to 256 (at most the model's). ``TrainConfig.pack`` chooses the rows:
packed examples (attention crosses example boundaries, as in pre-training; the Python default) or
one example per row, padded (``pack=False``; the command line's default, ``--pack`` packs). The
held-out set is a seeded 5% of the records (at most
:data:`MAX_VAL_RECORDS`, at least one), never trained on.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.store.lock import check_resumable
from depthlab.data import Tokenizer
from depthlab.data.batches import SeededOrder
from depthlab.data.sft import SFTDataset, get_template, load_records, pack_examples, pad_examples
from depthlab.models.config import ModelConfig
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData
from depthlab.train.rundir import check_fresh_out
from depthlab.train.start import Source, load_source, read_json_object

log = logging.getLogger(__name__)

BUILTIN_SFT = "builtin-sft"
SFT_DEFAULTS = dict(lr=1e-4, large_lr=3e-5, epochs=3, warmup_steps=100, seq_len=256, batch_size=16)
LARGE_MODEL = 100_000_000  # non-embedding parameters from which the lower lr applies
VAL_FRACTION, MAX_VAL_RECORDS, SPLIT_SEED = 0.05, 200, 0


# ---------------------------------------------------------------------------------- the source
def _resumed_source(out: Path) -> Source:
    """A fine-tuning run's own model config, tokenizer and source record (resuming restores the
    weights from its checkpoint, so the source itself is not read again)."""
    from depthlab.data import load_tokenizer

    saved = read_json_object(out / "config.json")
    check_resumable(out)
    if not saved or "finetune" not in saved:
        raise DepthlabError(f"cannot resume {str(out)!r}: not a fine-tuning run (no 'finetune' in config.json)")
    return Source(ModelConfig.from_dict(saved["model"]), {}, load_tokenizer(out / "tokenizer"),
                  saved["finetune"]["source"])


# ---------------------------------------------------------------------------------- the data
def sft_records(spec: str) -> list[dict[str, Any]]:
    """``builtin-sft`` or a ``.json`` / ``.jsonl`` file of Alpaca / chat records."""
    if spec == BUILTIN_SFT:
        from depthlab.data.builtin_tasks import builtin_sft_records

        return builtin_sft_records()
    return load_records(spec)


def split_records(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out): a seeded ``VAL_FRACTION`` of the records, 1 .. MAX_VAL_RECORDS of them."""
    if len(records) < 2:
        raise DepthlabError(f"the SFT data holds {len(records)} record(s); fine-tuning needs at least 2 "
                            "(one is held out)")
    n_val = min(MAX_VAL_RECORDS, max(1, round(VAL_FRACTION * len(records))))
    held = set(random.Random(SPLIT_SEED).sample(range(len(records)), n_val))
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


class SFTRows:
    """Fixed-shape SFT rows ``(x, y)`` (N, seq_len), served like pre-training's sequences: global
    row ``g`` of the seeded order, a new permutation every epoch."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> None:
        self.x, self.y, self.seed = x, y, seed
        self.order = SeededOrder(len(x), seed)  # the pre-training sources' order

    def __len__(self) -> int:
        return len(self.x)

    def rank_batch(self, step: int, batch_size: int, rank: int = 0, world_size: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        per = batch_size // world_size
        idx = torch.as_tensor(self.order.ids(step * batch_size + rank * per, per))
        return self.x[idx], self.y[idx]


def rows(ds: SFTDataset, seq_len: int, pad_id: int, pack: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows of ``seq_len``, or one example per row padded to ``seq_len``."""
    if pack:
        return pack_examples(ds, seq_len)
    return pad_examples([ds[i] for i in range(len(ds))], pad_id, seq_len)


@dataclass
class SFTData:
    """Tokenized SFT data: what :func:`load` turns into the trainer's TrainData."""

    spec: str
    train: SFTDataset
    val: SFTDataset
    pad_id: int

    def load(self, cfg: TrainConfig, tok: Tokenizer, env: Any) -> TrainData:
        """The :class:`~depthlab.train.data.TrainData` of the resolved run config ``cfg``."""
        x, y = rows(self.train, cfg.seq_len, self.pad_id, cfg.pack)
        vx, vy = rows(self.val, cfg.seq_len, self.pad_id, False)
        b = cfg.eval_batch_size
        eval_batches = [(vx[i:i + b], vy[i:i + b]) for i in range(0, len(vx), b)]
        return TrainData(SFTRows(x, y, cfg.seed), eval_batches, vx[: cfg.probe_batch_size],
                         vy[: cfg.probe_batch_size])

    def record(self) -> dict[str, Any]:
        return {"data": self.spec, "template": self.train.template.to_dict(), "max_len": self.train.max_len,
                "train_examples": len(self.train), "val_examples": len(self.val), "dropped": self.train.dropped,
                "trained_tokens": self.train.config()["trained_tokens"], "split_seed": SPLIT_SEED,
                "val_fraction": VAL_FRACTION}


def prepare_data(spec: str, tok: Tokenizer, seq_len: int, template: str) -> SFTData:
    """Read, split and tokenize the SFT data (examples longer than ``seq_len`` are cut)."""
    tmpl = get_template(template)
    train, val = split_records(sft_records(spec))
    kw = dict(template=tmpl, max_len=seq_len)
    return SFTData(spec, SFTDataset(train, tok.encode, tok.eos_id, **kw), SFTDataset(val, tok.encode, tok.eos_id, **kw),
                   tok.pad_id)


# ---------------------------------------------------------------------------------- the run
def sft_config(train_cfg: TrainConfig, model_cfg: ModelConfig, tok: Tokenizer, n_rows: int | None = None
               ) -> TrainConfig:
    """``train_cfg`` with the SFT defaults in every field left ``None`` (``steps`` needs ``n_rows``,
    the number of training rows)."""
    from depthlab.models.decoder import num_params

    c = train_cfg.to_dict()
    if c["lr"] is None:
        big = num_params(model_cfg, include_embeddings=False) >= LARGE_MODEL
        c["lr"] = SFT_DEFAULTS["large_lr" if big else "lr"]
    if c["seq_len"] is None:
        c["seq_len"] = min(SFT_DEFAULTS["seq_len"], model_cfg.max_seq_len)
    if c["batch_size"] is None:
        c["batch_size"] = SFT_DEFAULTS["batch_size"]
    if c["steps"] is None and n_rows is not None:
        c["steps"] = max(1, math.ceil(SFT_DEFAULTS["epochs"] * n_rows / c["batch_size"]))
    if c["warmup"] is None and c["steps"] is not None:
        c["warmup"] = min(SFT_DEFAULTS["warmup_steps"], c["steps"] // 10)
    c["tokenizer"] = tok.spec
    return TrainConfig.from_dict(c)


def finetune(source: str | Path, train_cfg: TrainConfig, out: str | Path, *, resume: bool = False,
             template: str = "alpaca", quiet: bool = False, command: str | None = None, progress: Any = None
             ) -> dict[str, Any]:
    """Fine-tune ``source`` on ``train_cfg.data`` (``builtin-sft`` or an SFT file) into the run
    directory ``out``; returns the trainer's summary. ``resume=True`` continues ``out`` from its
    latest checkpoint (``source`` is then not read). Raises DepthlabError on bad input before
    anything is written."""
    from depthlab.train import train
    from depthlab.train.start import StartFrom

    out = Path(out)
    train_cfg.check_given()  # a NaN lr, a negative seed, ...: before the source is loaded or the data read
    if train_cfg.weights == "auto" and train_cfg.dtype == "bf16" and train_cfg.optimizer != "muon":
        train_cfg = train_cfg.replace(weights="bf16")  # fine-tuning in bf16: bf16 weights, no fp32 copy (Muon: fp32)
    if not resume:
        check_fresh_out(out)  # a run (continue it with --resume) or other files (choose another --out): said so
    dtype = torch.bfloat16 if train_cfg.weights == "bf16" else torch.float32  # bf16 weights: no fp32 copy
    src = _resumed_source(out) if resume else load_source(source, "fine-tuning source", dtype)
    cfg = sft_config(train_cfg, src.model_cfg, src.tokenizer)
    data = prepare_data(cfg.data, src.tokenizer, cfg.seq_len, template)
    n_rows = len(rows(data.train, cfg.seq_len, data.pad_id, cfg.pack)[0])
    cfg = sft_config(cfg, src.model_cfg, src.tokenizer, n_rows)
    record = {"finetune": {"source": src.info, **data.record(), "train_rows": n_rows}}
    start = StartFrom(src.tokenizer, src.state_dict, data.load, record)
    return train(src.model_cfg, cfg, out, resume=resume, quiet=quiet, command=command, progress=progress, start=start)
