"""The training loop: ``train(model_cfg, train_cfg, out_dir)`` -> summary dict.

One optimizer step = one global batch of ``batch_size`` sequences (global sequences
``(step-1)*B .. step*B-1`` of the seeded order), split across ranks, then into micro-batches. The
loss is the mean over every non-pad target token of the global batch, whatever the split, so a
run on N ranks with accumulation computes the same update as one process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from depthlab.config import ModelConfig
from depthlab.data import (
    DEFAULT_TOKENIZER, build_tokenizer, check_tokenizer_spec, eval_token_batches, is_shard_dir, iter_documents,
    load_sequences, load_tokenizer, shard_meta,
)
from depthlab.errors import DepthlabError
from depthlab.model import build_model
from depthlab.train import distributed as D
from depthlab.train.checkpoint import find_checkpoint, list_checkpoints, read_checkpoint, save_checkpoint, set_rng_state
from depthlab.train.config import TrainConfig
from depthlab.train.optim import build_optimizer, lr_at, set_lr

log = logging.getLogger(__name__)

#: TrainConfig fields that must match to resume a run (they fix the data order and the update rule).
RESUME_KEYS = ("data", "val_data", "text_field", "tokenizer", "seq_len", "pack", "streaming", "batch_size", "steps", "lr",
               "warmup", "min_lr_ratio", "optimizer", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip", "seed")


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; ``step`` names the optimizer step, ``checkpoint`` the last good one."""

    def __init__(self, message: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("depthlab", "torch", "transformers", "tokenizers", "safetensors", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _device(cfg: TrainConfig, env_local_rank: int = 0) -> torch.device:
    if cfg.device:
        dev = torch.device(cfg.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise DepthlabError(f"device {cfg.device!r} requested but CUDA is not available")
        return dev
    return torch.device("cuda", env_local_rank) if torch.cuda.is_available() else torch.device("cpu")


def _autocast(cfg: TrainConfig, device: torch.device):
    use_bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and device.type == "cuda")
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext


def _resolve_tokenizer(cfg: TrainConfig, out: Path, resume: bool, env: D.DistEnv):
    if resume:
        tok = load_tokenizer(out / "tokenizer")
        if cfg.tokenizer is not None and cfg.tokenizer != tok.spec:
            raise DepthlabError(f"cannot resume {str(out)!r}: it was trained with tokenizer {tok.spec!r}, not {cfg.tokenizer!r}")
        return tok
    if is_shard_dir(cfg.data):
        meta = shard_meta(cfg.data)
        if cfg.tokenizer is not None and cfg.tokenizer != meta["tokenizer"]:
            raise DepthlabError(f"token shards {cfg.data!r} were made with tokenizer {meta['tokenizer']!r}, not {cfg.tokenizer!r}")
        return load_tokenizer(Path(cfg.data).expanduser() / "tokenizer")
    spec = cfg.tokenizer or DEFAULT_TOKENIZER
    check_tokenizer_spec(spec)
    iter_documents(cfg.data, "train", cfg.text_field)  # bad data specs fail here, before any training
    tok = None
    for turn in (0, 1):  # rank 0 first (it trains / caches), then the others read the cache
        if (turn == 0) == env.is_main:
            texts = iter_documents(cfg.data, "train", cfg.text_field) if spec.startswith("bpe:") else None
            tok = build_tokenizer(spec, texts, cache_dir=cfg.cache_dir)
        D.barrier(env)
    return tok


def _check_resume(saved: dict[str, Any], model_cfg: ModelConfig, cfg: TrainConfig, out: Path) -> None:
    if saved["model"] != model_cfg.to_dict():
        diff = sorted(k for k in model_cfg.to_dict() if saved["model"].get(k) != model_cfg.to_dict()[k])
        raise DepthlabError(f"cannot resume {str(out)!r}: the model differs from the saved run in {', '.join(diff)} "
                            f"(saved scheme {saved['model'].get('scheme')!r})")
    diff = [k for k in RESUME_KEYS if saved["train"].get(k) != getattr(cfg, k)]
    if diff:
        detail = ", ".join(f"{k}={getattr(cfg, k)!r} (saved {saved['train'].get(k)!r})" for k in diff)
        raise DepthlabError(f"cannot resume {str(out)!r}: training settings differ: {detail}")


class _Metrics:
    """metrics.jsonl (rank 0 only), optionally mirrored to tensorboard."""

    def __init__(self, path: Path, enabled: bool, keep_until: int | None, tensorboard: bool) -> None:
        self.enabled, self.path, self.tb = enabled, path, None
        if not enabled:
            return
        if keep_until is not None and path.is_file():  # resuming: drop lines past the checkpoint
            lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= keep_until]
            path.write_text("".join(ln + "\n" for ln in lines))
        self.f = path.open("a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise DepthlabError("--tensorboard needs the tensorboard package (pip install 'depthlab[logging]')") from None
            self.tb = SummaryWriter(str(path.parent / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()
        if self.tb is not None:
            for k, v in record.items():
                if k == "layer_variance":
                    for i, x in enumerate(v, 1):
                        self.tb.add_scalar(f"layer_variance/{i:03d}", x, record["step"])
                elif k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        if self.enabled:
            self.f.close()
            if self.tb is not None:
                self.tb.close()


def train(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path, *, resume: bool = False,
          progress: Callable[[dict[str, Any]], None] | None = None, quiet: bool = False,
          command: str | None = None) -> dict[str, Any]:
    """Pre-train ``model_cfg`` as ``train_cfg`` says, writing the run directory ``out_dir``.

    ``resume=True`` continues ``out_dir`` from its latest complete checkpoint (the model, tokenizer
    and data/schedule settings must match). ``progress`` is called on every step with the train
    record (step, loss, lr, tokens, tokens_per_s); ``quiet`` hides the progress bar. Returns the
    summary (also written to ``summary.json``). Raises DepthlabError on bad input (before anything
    is written) and TrainingDiverged on a NaN/inf loss.
    """
    env = D.setup(train_cfg.dist, _device(train_cfg))
    try:
        return _train(model_cfg, train_cfg, Path(out_dir), resume, progress, quiet, command, env)
    finally:
        D.teardown(env)


def _train(model_cfg, train_cfg, out, resume, progress, quiet, command, env: D.DistEnv) -> dict[str, Any]:
    t_start = time.perf_counter()
    device = _device(train_cfg, env.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    saved = None
    if resume:
        if not (out / "config.json").is_file():
            raise DepthlabError(f"cannot resume {str(out)!r}: no config.json there (not a run directory)")
        saved = json.loads((out / "config.json").read_text())
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DepthlabError(f"run directory {str(out)!r} already exists; pass --resume to continue it or choose a new --out")

    cfg = train_cfg.resolve(model_cfg, env.world_size)
    tok = _resolve_tokenizer(cfg, out, resume, env)
    cfg = cfg.replace(tokenizer=tok.spec)
    model_cfg = model_cfg.replace(vocab_size=tok.vocab_size)
    if saved is not None:
        _check_resume(saved, model_cfg, cfg, out)

    # ---- data (rank 0 first: it fills the token cache)
    B, T, world = cfg.batch_size, cfg.seq_len, env.world_size
    seqs = None
    for turn in (0, 1):
        if (turn == 0) == env.is_main:
            seqs = load_sequences(cfg.data, tok, T, split="train", pack=cfg.pack, seed=cfg.seed,
                                  text_field=cfg.text_field, cache_dir=cfg.cache_dir, streaming=cfg.streaming,
                                  rank=env.rank, world_size=world)
        D.barrier(env)
    val_spec, val_split = (cfg.val_data, "all") if cfg.val_data else (cfg.data, "val")
    if cfg.val_data and is_shard_dir(cfg.val_data):
        val_split = "val"  # token shards keep their own held-out split
    eval_batches = [b for b in eval_token_batches(val_spec, tok, cfg.eval_tokens, T + 1, cfg.eval_batch_size,
                                                  split=val_split, text_field=cfg.text_field)]
    if not eval_batches:
        raise DepthlabError(f"no held-out text of {T + 1} tokens in {val_spec!r} ({val_split} split); give --val-data")
    probe = torch.cat(eval_batches)[: cfg.probe_batch_size, :-1]  # fixed variance-probe batch (held-out text)

    # ---- run directory
    config = {"model": model_cfg.to_dict(), "train": cfg.to_dict(),
              "tokenizer": {"spec": tok.spec, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
                            "pad_id": tok.pad_id, "fingerprint": tok.fingerprint()},
              "versions": versions(), "command": command or " ".join(sys.argv), "world_size": world}
    if env.is_main and not resume:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tok.save(out / "tokenizer")
    if resume:
        config = {**saved, "command_resume": config["command"], "versions": config["versions"]}
    D.barrier(env)

    # ---- model, optimizer
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    model = build_model(model_cfg, device=device)
    if cfg.compile:
        model.compile()
    module = D.wrap(model, env, device)
    optimizer = build_optimizer(model.parameters(), cfg, device)
    start, tokens, wall_before = 0, 0, 0.0
    if resume:
        ckpt = find_checkpoint(out)
        data = read_checkpoint(ckpt)
        D.load_full_state_dicts(module, model, optimizer, data["model"], data["optimizer"])
        set_rng_state(data["rng"])
        start, tokens, wall_before = data["state"]["step"], data["state"]["tokens"], data["state"].get("wall_s", 0.0)
        if env.is_main:
            log.info("resuming %s from step %d", out, start)
    last_ckpt = list_checkpoints(out)[-1] if resume else None
    metrics = _Metrics(out / "metrics.jsonl", env.is_main, start if resume else None, cfg.tensorboard)
    autocast = _autocast(cfg, device)

    def forward(x, y=None, hidden=False):
        with autocast():
            return module(x.to(device, non_blocking=True), None if y is None else y.to(device, non_blocking=True), hidden)

    @torch.no_grad()
    def evaluate() -> tuple[float, float]:
        module.eval()
        total = torch.zeros(2, dtype=torch.float64)
        mine = eval_batches[env.rank::world]
        for i in range(-(-len(eval_batches) // world)):  # same number of forwards on every rank (FSDP)
            b = mine[i] if i < len(mine) else eval_batches[0]
            loss = forward(b[:, :-1], b[:, 1:])[0]
            if i < len(mine):
                total += torch.tensor([loss.double().item() * b[:, 1:].numel(), b[:, 1:].numel()], dtype=torch.float64)
        D.all_reduce_sum(total, env)
        module.train()
        mean = (total[0] / total[1]).item()
        return mean, math.exp(min(mean, 700.0))

    @torch.no_grad()
    def layer_variance() -> list[float]:
        module.eval()
        hidden = forward(probe, None, True)[1:]  # embedding output, then block 1..L outputs
        module.train()
        return [h.float().var().item() for h in hidden[1:]]

    def checkpoint(step: int) -> Path | None:
        msd, osd = D.full_state_dicts(module, model, optimizer)
        path = None
        if env.is_main:
            state = {"tokens": tokens, "sequences": step * B, "wall_s": wall_before + time.perf_counter() - t_loop,
                     "world_size": world}
            path = save_checkpoint(out, step, msd, osd, state, config, cfg.keep_last)
        D.barrier(env)
        return path or (out / "checkpoint" / f"step-{step:08d}")

    # ---- loop
    accum, micro = cfg.accum_steps(world), cfg.micro_batch_size
    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.steps, initial=start, disable=quiet or not env.is_main or not sys.stderr.isatty(),
               file=sys.stderr, dynamic_ncols=True, unit="step")
    log_level = logging.DEBUG if quiet else logging.INFO
    log.log(log_level, "training %s (%s, %.2fM params) for %d steps: batch %d x %d tokens, lr %g, %s train sequences",
            model_cfg.name, model_cfg.scheme, model.num_params() / 1e6, cfg.steps, B, T, cfg.lr, len(seqs) or 'streamed')
    t_loop = time.perf_counter()
    module.train()
    if start == 0 and cfg.variance_every:
        metrics.write({"step": 0, "layer_variance": layer_variance()})
    eval_rec: dict[str, Any] = {}
    var_rec: list[float] | None = None
    win_tokens, win_time, step_rec = 0, 0.0, {}
    session_tokens, session_time = 0, 0.0  # optimizer steps only (no eval / probe / checkpoint time)
    try:
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            lr = lr_at(step - 1, cfg)
            set_lr(optimizer, lr)
            x, y = seqs.rank_batch(step - 1, B, env.rank, world)  # this rank's slice of the global batch
            n_global = int(D.all_reduce_sum(torch.tensor((y != -100).sum().item(), dtype=torch.int64), env))
            loss_sum = torch.zeros((), dtype=torch.float64)
            for m in range(accum):
                xm, ym = x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro]
                n_micro = int((ym != -100).sum())
                with D.grad_sync(module, env, sync=m == accum - 1):
                    loss = forward(xm, ym)[0]
                    if n_micro == 0:
                        loss = loss.nan_to_num(0.0) * 0.0
                    # sum of token losses / global token count; x world because DDP/FSDP average over ranks
                    (loss * (n_micro * world / max(n_global, 1))).backward()
                loss_sum += loss.detach().double().cpu() * n_micro
            D.all_reduce_sum(loss_sum, env)
            step_loss = (loss_sum / max(n_global, 1)).item()
            if not math.isfinite(step_loss):
                optimizer.zero_grad(set_to_none=True)
                where = f"last good checkpoint: {last_ckpt}" if last_ckpt else "no checkpoint was written yet"
                raise TrainingDiverged(f"loss is {step_loss} at step {step}; stopped ({where})", step, last_ckpt)
            grad_norm = None
            if cfg.grad_clip is not None:
                total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                grad_norm = float(total_norm.full_tensor() if hasattr(total_norm, "full_tensor") else total_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens += n_global
            dt = time.perf_counter() - t0
            win_tokens, win_time = win_tokens + n_global, win_time + dt
            session_tokens, session_time = session_tokens + n_global, session_time + dt
            step_rec = {"step": step, "loss": step_loss, "lr": lr, "tokens": tokens,
                        "tokens_per_s": win_tokens / max(win_time, 1e-9)}
            if grad_norm is not None:
                step_rec["grad_norm"] = grad_norm
            if step % cfg.log_every == 0 or step == cfg.steps:
                metrics.write(step_rec)
                win_tokens, win_time = 0, 0.0
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.3f}", tok_s=f"{step_rec['tokens_per_s']:.0f}", refresh=False)
            if cfg.variance_every and (step % cfg.variance_every == 0 or step == cfg.steps):
                var_rec = layer_variance()
                metrics.write({"step": step, "layer_variance": var_rec})
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
                el, ep = evaluate()
                eval_rec = {"step": step, "eval_loss": el, "eval_ppl": ep, "eval_tokens": sum(b[:, 1:].numel() for b in eval_batches)}
                metrics.write(eval_rec)
                log.log(log_level, "step %d: eval loss %.4f, ppl %.2f", step, el, ep)
            if (cfg.ckpt_every and step % cfg.ckpt_every == 0) or step == cfg.steps:
                last_ckpt = checkpoint(step)
            if progress is not None:  # last: a callback that raises leaves a consistent run behind
                progress({**step_rec, **({"eval_loss": eval_rec["eval_loss"]} if eval_rec.get("step") == step else {})})
    finally:
        bar.close()
        metrics.close()

    if not eval_rec:  # nothing left to train (resumed a finished run)
        el, ep = evaluate()
        eval_rec = {"eval_loss": el, "eval_ppl": ep}
    wall = wall_before + time.perf_counter() - t_loop
    summary = {
        "steps": cfg.steps, "scheme": model_cfg.scheme, "train_loss": step_rec.get("loss"),
        "eval_loss": eval_rec["eval_loss"], "eval_ppl": eval_rec["eval_ppl"],
        "layer_variance": var_rec if var_rec is not None else layer_variance(),
        "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / max(wall, 1e-9),
        "step_tokens_per_s": session_tokens / session_time if session_time else None,
        "setup_s": time.perf_counter() - t_start - (wall - wall_before),
    }
    if env.is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    D.barrier(env)
    return summary
