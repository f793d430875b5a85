"""TrainConfig: every knob of a pre-training run, typed, commented, JSON round-trip.

Fields left ``None`` are filled per preset (``depthlab.models.presets.TRAIN_DEFAULTS``) by :meth:`TrainConfig.resolve`
following docs/paper.md §4.2 (lr 1e-3 up to 250M, 5e-4 above; warm-up 10% of steps, 1% at 1B+; sequence
length 256; global batch 512 sequences); the ``tiny`` preset gets CPU-sized defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from depthlab.base.errors import ConfigError, check_int, check_work, choices
from depthlab.base.precision import PRECISIONS
from depthlab.models.config import JsonConfig, ModelConfig
from depthlab.models.presets import PAPER_DEFAULTS, TRAIN_DEFAULTS

OPTIMIZERS = ("adam", "adamw", "muon")
DTYPES = WEIGHT_DTYPES = PRECISIONS  # --dtype (compute precision) and --weights (weight dtype): one choice set
DIST_MODES = ("none", "ddp", "fsdp")
MAX_LR = 1e6  # larger learning rates overflow Adam's float32 arithmetic: refused as a typo
MAX_SEED = 2**32 - 1  # seeds seed torch, numpy and Python: the range all of them take

@dataclass
class TrainConfig(JsonConfig):
    """A pre-training run. ``None`` = per-preset default (see ``resolve``)."""

    # ---- data
    data: str = "builtin"  # builtin | file | dir | glob | hf:NAME[:CONFIG] | token-shard dir
    val_data: str | None = None  # explicit held-out source; None = the deterministic held-out split of `data`
    text_field: str = "text"  # text field of .jsonl / .parquet / hf datasets
    tokenizer: str | None = None  # bytes | bpe:N | hf:NAME_OR_PATH; None = bpe:4096 (shards: their own)
    seq_len: int | None = None  # tokens per training sequence (paper: 256)
    pack: bool = True  # pack documents with an EOS separator; False = pad each document (official code)
    streaming: bool | None = None  # tokenize on the fly, in stream order; None = only for hf: data
    # ---- batch and schedule
    batch_size: int | None = None  # global batch, in sequences (paper: 512)
    micro_batch_size: int | None = None  # sequences per rank per forward; None = batch_size // world_size
    steps: int | None = None  # optimizer steps
    lr: float | None = None  # peak learning rate
    warmup: float | None = None  # warm-up: a fraction of `steps` if < 1, else a number of steps
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio (paper 0.1)
    optimizer: str = "adam"  # adam | adamw | muon (blocks' linear weights; AdamW the rest; same lr: docs/muon.md)
    weight_decay: float = 0.0  # decoupled (adamw; muon: both parts) or L2 (adam) weight decay (paper: 0; Muon's usual: 0.1)
    beta1: float = 0.9  # Adam beta1
    beta2: float = 0.999  # Adam beta2
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip: float | None = None  # max global grad norm; None = no clipping (paper)
    seed: int = 0  # fixes init and data order
    # ---- execution
    device: str | None = None  # auto (None) | cpu | cuda (the current GPU) | cuda:N | mps; auto: cuda when available
    dtype: str = "auto"  # compute precision: auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 (autocast, over fp32 or bf16 weights)
    weights: str = "auto"  # weight dtype: auto (fp32) | fp32 | bf16 (with Adam's moments; no fp32 copy, stochastic rounding)
    compile: bool | None = None  # torch.compile forward + loss; None = auto: CUDA from 2e16 training FLOPs, CPU from 4M tokens
    dist: str = "none"  # none | ddp | fsdp (under torchrun)
    # ---- evaluation, metrics, checkpoints
    eval_every: int | None = None  # steps between held-out evaluations; None = up to 5 within 5% of the run; 0 = only at the end
    eval_tokens: int | None = None  # held-out tokens per evaluation (paper: ~10M); None = the preset's, at most 5% of the run
    eval_batch_size: int | None = None  # sequences per eval forward; None = micro_batch_size
    variance_every: int | None = None  # steps between depth probes; None = up to 20 within 5% of the run; 0 = none
    probe_batch_size: int = 8  # sequences in the fixed probe batch (held-out text)
    track_depth: bool = True  # at each probe: angular distance, contribution, norm gain per block (else variance only)
    track_removal: bool | None = None  # ... and the Δloss of removing each block (L partial forwards); None = when it fits
    removal_every: int = 4  # the removal sweep at every n-th probe (and the last): it costs ~2 train steps on tiny
    log_every: int = 10  # steps between train lines in metrics.jsonl
    ckpt_every: int | None = None  # steps between checkpoints; None = steps // 4; 0 = only at the end
    keep_last: int = 2  # checkpoints kept
    cache_dir: str | None = None  # tokenizer / token cache; None = $DEPTHLAB_CACHE or ~/.cache/depthlab
    # ---- experiment trackers (each also gets the depth series, a block x step heatmap and the config)
    tensorboard: bool = False  # also log to <out>/tensorboard (pip install tensorboard)
    wandb: str | None = None  # also log to this Weights & Biases project, files in <out>/wandb (offline: WANDB_MODE=offline)
    trackio: str | None = None  # also log to this trackio project: a local tracker with the W&B API (pip install trackio)
    run_group: str | None = None  # W&B / trackio group of the run (compare: its --out folder name)

    def replace(self, **changes: Any) -> "TrainConfig":
        return self.from_dict({**self.to_dict(), **changes})

    # ------------------------------------------------------------------ defaults + validation
    def resolve(self, model_cfg: ModelConfig, world_size: int = 1) -> "TrainConfig":
        """A copy with every ``None`` default filled for this model and world size, validated."""
        c = self.to_dict()
        unset = [key for key in ("lr", "steps", "warmup", "seq_len", "batch_size", "eval_tokens") if c[key] is None]
        if unset:  # the size-based defaults need a parameter count: only when something is left to fill
            by_preset = TRAIN_DEFAULTS.get(model_cfg.name)
            d = {**PAPER_DEFAULTS, **(by_preset if by_preset is not None else _by_size(model_cfg))}
            for key in unset:
                c[key] = d[key]
        if c["seq_len"] > model_cfg.max_seq_len and self.seq_len is None:
            c["seq_len"] = model_cfg.max_seq_len
        if c["micro_batch_size"] is None:
            c["micro_batch_size"] = max(1, c["batch_size"] // world_size)
        if c["eval_batch_size"] is None:
            c["eval_batch_size"] = c["micro_batch_size"]
        measurement_schedule(c, model_cfg.n_layers, eval_tokens_auto=self.eval_tokens is None)
        if c["ckpt_every"] is None:
            c["ckpt_every"] = max(1, c["steps"] // 4)
        if c["weights"] == "auto":
            c["weights"] = "fp32"  # fp32 master weights (finetune asks for bf16 with dtype bf16 before this)
        out = TrainConfig(**c)
        out.validate(model_cfg, world_size)
        return out

    @property
    def warmup_steps(self) -> int:
        w = self.warmup or 0.0
        return int(round(w * (self.steps or 0))) if w < 1 else int(w)

    def validate(self, model_cfg: ModelConfig, world_size: int = 1) -> None:
        self.check_given()
        for name in ("seq_len", "batch_size", "micro_batch_size", "steps", "eval_tokens", "eval_batch_size",
                     "eval_every", "variance_every", "ckpt_every", "lr"):
            if getattr(self, name) is None:
                raise ConfigError(f"{name} is not set (resolve the config first)")
        if self.seq_len > model_cfg.max_seq_len:
            raise ConfigError(
                f"seq_len={self.seq_len} exceeds the model's max_seq_len={model_cfg.max_seq_len}; "
                f"lower --seq-len or raise max_seq_len"
            )
        per_step = self.micro_batch_size * world_size
        if self.batch_size % per_step:
            raise ConfigError(
                f"batch_size={self.batch_size} is not divisible by micro_batch_size={self.micro_batch_size}"
                + (f" x world_size={world_size}" if world_size > 1 else "")
            )
        check_work(f"steps {self.steps} x batch_size {self.batch_size} x seq_len {self.seq_len}",
                   self.steps * self.batch_size * self.seq_len, "--steps")
        check_work(f"eval_tokens {self.eval_tokens}", self.eval_tokens, "--eval-tokens")
        if self.warmup is not None and self.warmup_steps > self.steps:
            raise ConfigError(f"warmup={self.warmup!r} must be a fraction in [0, 1) or at most steps={self.steps}")

    def check_given(self) -> None:
        """The checks that need no model and no defaults, on every field that is set: run before a model is
        loaded or data is read (``finetune`` and ``compare`` call it first)."""
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {self.optimizer!r}; {choices(OPTIMIZERS)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; {choices(DTYPES)}")
        if self.dist not in DIST_MODES:
            raise ConfigError(f"unknown dist mode {self.dist!r}; {choices(DIST_MODES)}")
        if self.weights not in WEIGHT_DTYPES:
            raise ConfigError(f"unknown weights dtype {self.weights!r}; {choices(WEIGHT_DTYPES)}")
        if self.optimizer == "muon" and self.weights == "bf16":
            raise ConfigError("optimizer 'muon' does not run with weights 'bf16' (its update needs fp32 weights; bf16 "
                              "weights keep no fp32 copy); give weights 'fp32' or optimizer 'adamw'")
        if self.weights == "bf16":
            for name, value, ok in (("dtype", self.dtype, ("auto", "bf16")), ("dist", self.dist, ("none",)),
                                    ("compile", self.compile, (None, False))):
                if value not in ok:
                    raise ConfigError(f"weights bf16 does not run with {name} {value!r}; give {name} "
                                      f"{' or '.join(repr(v) for v in ok if v is not None)} or weights 'fp32'")
        for name in ("seq_len", "batch_size", "micro_batch_size", "steps", "eval_tokens", "eval_batch_size",
                     "probe_batch_size", "log_every", "keep_last"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        for name in ("eval_every", "variance_every", "ckpt_every", "removal_every"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"{name} must be a non-negative integer, got {v!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and 0 < self.lr <= MAX_LR):  # NaN too
            raise ConfigError(f"lr must be positive and at most {MAX_LR:g}, got {self.lr!r}")
        if not (isinstance(self.min_lr_ratio, (int, float)) and 0.0 <= self.min_lr_ratio <= 1.0):
            raise ConfigError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio!r}")
        if self.warmup is not None and not (isinstance(self.warmup, (int, float)) and 0 <= self.warmup < math.inf):
            raise ConfigError(f"warmup={self.warmup!r} must be a fraction in [0, 1) or a number of steps")
        check_int("seed", self.seed, 0, MAX_SEED)
        if self.grad_clip is not None and not (isinstance(self.grad_clip, (int, float)) and 0 < self.grad_clip < math.inf):
            raise ConfigError(f"grad_clip must be positive or None, got {self.grad_clip!r}")
        for name in ("wandb", "trackio", "run_group", "data", "tokenizer"):
            v = getattr(self, name, None)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ConfigError(f"--{name.replace('_', '-')} {v!r} names nothing; give a name or leave it out")
        from depthlab.analysis.monitor.trackers import TrackerSpec  # torch-free

        TrackerSpec.of(self).require()  # a missing tracker package fails here, before anything is written
        for name, low, high in (("weight_decay", 0.0, math.inf), ("beta1", 0.0, 1.0), ("beta2", 0.0, 1.0)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and low <= v < high):
                raise ConfigError(f"{name} must lie in [{low:g}, {high:g}), got {v!r}")
        if not (isinstance(self.adam_eps, (int, float)) and 0 < self.adam_eps < math.inf):
            raise ConfigError(f"adam_eps must be a positive finite number, got {self.adam_eps!r}")

    def accum_steps(self, world_size: int = 1) -> int:
        """Micro-steps per optimizer step on each rank (after ``resolve``)."""
        return self.batch_size // (self.micro_batch_size * world_size)


# ---------------------------------------------------------------------- what measuring a run costs
#: The default schedules keep the periodic held-out evaluations, and the depth probes, each within this share of
#: the run's training compute (so both together within 10 %), estimated by token count: a training token costs
#: a forward and a backward (3 forward-token units), an evaluated or probed token one forward unit, a removal
#: sweep L/2 forwards of the probe batch. The evaluation at the end and the probes at the start and the end are
#: the run's result and always run; :func:`schedule_line` states what the schedule costs.
MEASURE_SHARE = 0.05
MAX_EVALS = 5  # periodic evaluations at most (the held-out curve's points)
MAX_PROBES = 20  # periodic depth probes at most
MIN_EVAL_TOKENS = 2048  # a smaller default held-out set would make the loss too noisy to read


def measurement_costs(c: dict[str, Any], n_layers: int) -> tuple[float, float, float]:
    """(one evaluation, one probe, one removal sweep on top of a probe), each in training steps of ``c``
    (a TrainConfig as a dict with batch_size, seq_len, eval_tokens, probe_batch_size filled)."""
    step = 3.0 * c["batch_size"] * c["seq_len"]
    probe = c["probe_batch_size"] * c["seq_len"] / step
    return (c["eval_tokens"] or 0) / step, probe, probe * n_layers / 2


def measurement_schedule(c: dict[str, Any], n_layers: int, eval_tokens_auto: bool = False) -> None:
    """Fill, in ``c``, what the caller left None of eval_every, track_removal and variance_every so that each
    kind of measurement stays within :data:`MEASURE_SHARE` of the run's compute; ``eval_tokens_auto``: the
    preset's held-out size is a default, cut to that share too (not below :data:`MIN_EVAL_TOKENS`)."""
    steps = c["steps"]
    budget = MEASURE_SHARE * steps
    if eval_tokens_auto:
        c["eval_tokens"] = max(MIN_EVAL_TOKENS, min(c["eval_tokens"], int(budget * 3 * c["batch_size"] * c["seq_len"])))
    evaluation, probe, removal = measurement_costs(c, n_layers)
    if c["eval_every"] is None:
        n = min(MAX_EVALS, int(budget / evaluation)) if evaluation > 0 else MAX_EVALS
        c["eval_every"] = -(-steps // n) if n else 0  # ceil: at most n evaluations
    if c["track_removal"] is None:  # the sweeps at the start and the end fit the probes' share
        c["track_removal"] = bool(c["track_depth"]) and 2 * (probe + removal) <= budget
    if c["variance_every"] is None:
        sweeps = removal / c["removal_every"] if c["track_removal"] and c["track_depth"] and c["removal_every"] else 0.0
        n = min(MAX_PROBES, int(budget / (probe + sweeps)))
        c["variance_every"] = -(-steps // n) if n else steps


def measured_steps(every: int, steps: int) -> list[int]:
    """The steps a schedule of period ``every`` measures at: its multiples and the last step (0: the last only)."""
    return sorted({*range(every, steps + 1, every), steps}) if every else [steps]


def schedule_line(cfg: "TrainConfig", n_layers: int) -> str:
    """The plan line of what a run measures and what it costs, e.g. ``held-out evaluation every 150 steps and
    at the end (32,768 tokens, est. 3.6% of training); depth probes every 15 steps, at 0 and at the end
    (8 sequences, removal sweep every 4th and at both ends: est. 3.3%)``."""
    evaluation, probe, removal = measurement_costs(cfg.to_dict(), n_layers)
    steps = cfg.steps
    n_eval = len(measured_steps(cfg.eval_every, steps))
    where = f"every {cfg.eval_every} steps and at the end" if 0 < cfg.eval_every < steps else "at the end"
    eval_share = f"est. {100 * n_eval * evaluation / steps:.1f}% of training" if evaluation >= 1e-3 else "every held-out item"
    parts = [f"held-out evaluation {where} ({cfg.eval_tokens:,} tokens, {eval_share})" if cfg.eval_tokens > 1 else
             f"held-out evaluation {where}"]
    if cfg.variance_every:
        probes = [0, *measured_steps(cfg.variance_every, steps)]
        sweeping = bool(cfg.track_removal and cfg.track_depth)
        n_sweep = sum(t in (0, steps) or (cfg.removal_every > 0 and (t // cfg.variance_every) % cfg.removal_every == 0)
                      for t in probes) if sweeping else 0
        what = ((f"removal sweep every {cfg.removal_every}th probe and " if cfg.removal_every else "removal sweep ")
                + "at both ends" if sweeping else "no removal sweep" if cfg.track_depth else "variance only")
        cost = 100 * (len(probes) * probe + n_sweep * removal) / steps
        at = f"every {cfg.variance_every} steps, at 0 and at the end" if cfg.variance_every < steps else "at 0 and at the end"
        parts.append(f"depth probes {at} ({cfg.probe_batch_size} sequences, {what}: est. {cost:.1f}%)")
    else:
        parts.append("no depth probes during training")
    return "; ".join(parts)


def _by_size(model_cfg: ModelConfig) -> dict[str, Any]:
    """Defaults for a custom shape, by parameter count (docs/paper.md §4.2, §4.4: 5e-4 from 350M up)."""
    from depthlab.models.decoder import num_params  # the count of the built modules

    n = num_params(model_cfg, include_embeddings=False)
    if n < 5_000_000:
        return TRAIN_DEFAULTS["tiny"]
    return dict(lr=5e-4 if n > 300_000_000 else 1e-3, steps=20_000, warmup=0.1)
