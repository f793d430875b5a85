"""The training loop: ``train(model_cfg, train_cfg, out_dir)`` -> summary dict.

    run = open_run(...)            rundir.py     checks and tokenizer; nothing written yet
    data = load_train_data(...)    data.py       train sequences, held-out batches, probe batch
    write_run_dir(...)             rundir.py     config.json + tokenizer/
    session = _start_session(...)  here          model, optimizer, resume state, evaluator, metrics
    _run_steps(session, ...)       here          train_step (step.py) + evaluator (evaluator.py) + checkpoints
    _summary(...)                  here          summary.json

One optimizer step = one global batch of ``batch_size`` sequences, whatever the number of ranks and
micro-batches (see :mod:`depthlab.train.step`), so a run on N ranks computes the same update as one
process, and a resumed run continues exactly where its checkpoint stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from depthlab.analysis.monitor.trackers import TrackerSpec
from depthlab.base.devices import resolve_device
from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import write_json_atomic
from depthlab.base.progress import progress as progress_bar
from depthlab.base.progress import user_logging
from depthlab.base.store.checkpoint import load_intact, remove_stale_tmp, save_checkpoint, set_rng_state
from depthlab.base.store.integrity import first_nonfinite
from depthlab.base.store.lock import RunGuard, run_guard
from depthlab.models.config import ModelConfig
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig, schedule_line
from depthlab.train.data import TrainData
from depthlab.train.evaluator import EvalResult, Evaluator
from depthlab.train.family import TrainFamily, train_family
from depthlab.train.metrics_log import MetricsLog
from depthlab.train.optim import build_optimizer
from depthlab.train.rundir import RESUME_KEYS, RunSetup, write_run_dir
from depthlab.train.start import StartFrom
from depthlab.train.step import (
    Forward,
    StepResult,
    autocast_for,
    choose_compile,
    compile_for_training,
    execution_plan,
    read_results,
    train_step,
)

__all__ = ["RESUME_KEYS", "TrainingDiverged", "train"]

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; ``step`` names the optimizer step, ``checkpoint`` the last good one."""

    def __init__(self, message: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


def train(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path, *, resume: bool = False,
          progress: Progress | None = None, quiet: bool = False, command: str | None = None,
          start: StartFrom | None = None, allow_changed: tuple[str, ...] = ()) -> dict[str, Any]:
    """Pre-train ``model_cfg`` as ``train_cfg`` says, writing the run directory ``out_dir``.

    ``resume=True`` continues ``out_dir`` from its latest complete checkpoint (the model, tokenizer
    and data/schedule settings must match). ``progress`` is called on every step with the train
    record (step, loss, lr, tokens, tokens_per_s); ``quiet`` hides the progress bar. Returns the
    summary (also written to ``summary.json``). ``start`` (:class:`~depthlab.train.start.StartFrom`):
    begin from given weights, tokenizer and data instead (fine-tuning). Raises DepthlabError on bad
    input (before anything is written) and TrainingDiverged on a NaN/inf loss or non-finite weights.
    ``allow_changed``: schedule settings (lr, warmup, min_lr_ratio) a resume may change (recorded in
    config.json). The run directory is locked for the whole run (one writer; see
    ``depthlab.base.store.lock``), and a fresh run whose set-up fails leaves nothing behind.
    """
    env = D.setup(train_cfg.dist, _device(train_cfg))
    try:
        with user_logging(quiet), run_guard(Path(out_dir), env.is_main, existing=resume) as guard:
            return _train(model_cfg, train_cfg, Path(out_dir), resume, progress, quiet, command, env, allow_changed,
                          guard, start)
    finally:
        D.teardown(env)


def check_memory(n_params: int, cfg: TrainConfig, device: torch.device) -> None:
    """Refuse, before anything is written, a model whose weights, gradients and Adam state (16 bytes a parameter;
    12 with bf16 weights) exceed the device's free memory: it would only fail later, or swap for hours."""
    from depthlab.targets.engine import available_memory, gib

    need = n_params * (12 if cfg.weights == "bf16" else 16)
    free = available_memory(device)
    if free is not None and need > free:
        raise DepthlabError(f"training {n_params:,} parameters needs about {gib(need)} for weights, gradients and Adam "
                            f"state; {device.type} has {gib(free)} free: choose a smaller model or another device")


def _device(cfg: TrainConfig, env: D.DistEnv | None = None) -> torch.device:
    """``cfg.device`` (unset: this rank's CUDA device when there is one, else the CPU), always indexed on CUDA
    (:func:`depthlab.base.devices.resolve_device`); before the process group exists (``env`` None) only its type
    counts."""
    follow_rank = env is not None and (env.world_size > 1 or not cfg.device)
    return resolve_device(cfg.device or "auto", rank=env.local_rank if follow_rank else None)


def _train(model_cfg: ModelConfig, train_cfg: TrainConfig, out: Path, resume: bool, progress: Progress | None,
           quiet: bool, command: str | None, env: D.DistEnv, allow_changed: tuple[str, ...],
           guard: RunGuard, start: StartFrom | None = None) -> dict[str, Any]:
    """:func:`train` inside the joined process group: set up, run the steps, write summary.json."""
    t_start = time.perf_counter()
    device = _device(train_cfg, env)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    family = train_family(model_cfg)  # LM or ViT: how to build, feed and evaluate (family.py)
    if allow_changed and family.name != "lm":
        raise DepthlabError(f"--allow-changed is supported for language-model runs only, not {family.name!r}")
    extra: dict[str, Any] = {"allow_changed": allow_changed} if allow_changed else {}
    if start is not None:
        extra["tokenizer"] = start.tokenizer  # fine-tuning: the source's tokenizer (LMs)
    run = family.open_run(model_cfg, train_cfg, out, resume, env, **extra)  # bad input fails here or in the next
    n_params = family.kind.num_params(run.model_cfg)
    check_memory(n_params, run.cfg, device)  # weights, gradients and Adam state: before anything is written
    run = dataclasses.replace(run, cfg=run.cfg.replace(compile=choose_compile(run.cfg, device, n_params)))  # auto
    data = start.load_data(run.cfg, run.tokenizer, env) if start else family.load_data(run, env)  # line; no writes
    guard.create()  # a fresh run's directory, locked; removed again if set-up fails
    if env.is_main:
        remove_stale_tmp(out)
    config = write_run_dir(run, command, env, start.record if start else None)
    session = _start_session(family, run, data, config, device, env, None if start is None else start.state_dict)
    session.compile_auto, session.n_params = train_cfg.compile is None, n_params
    guard.keep()
    try:
        done = _run_steps(session, progress, quiet)
    finally:
        session.metrics.close()
    summary = _summary(session, done, t_start)
    if env.is_main:
        write_json_atomic(out / "summary.json", summary)
    D.barrier(env)
    return summary


# ------------------------------------------------------------------------------ session set-up
@dataclass
class _Session:
    """What the steps of one training session share."""

    run: RunSetup
    env: D.DistEnv
    model: nn.Module
    module: nn.Module  # LMLoss(model), under DDP / FSDP when distributed
    optimizer: torch.optim.Optimizer
    forward: Forward
    data: TrainData
    evaluator: Evaluator
    metrics: MetricsLog
    config: dict[str, Any]  # the run config, copied into every checkpoint
    start: int = 0  # last step done before this session (resume)
    tokens: int = 0  # target tokens trained on, all sessions
    wall_before: float = 0.0  # training wall time of earlier sessions
    last_ckpt: Path | None = None
    t_loop: float = 0.0  # perf_counter when this session's loop started
    compile_auto: bool = False  # compiled or not by choose_compile's rule (the user left --compile unset)
    n_params: int = 0  # the model's parameter count (choose_compile's input)

    def wall(self) -> float:
        """Training wall time so far, earlier sessions included."""
        return self.wall_before + time.perf_counter() - self.t_loop


def _start_session(family: TrainFamily, run: RunSetup, data: TrainData, config: dict[str, Any], device: torch.device,
                   env: D.DistEnv, init: dict[str, torch.Tensor] | None = None) -> _Session:
    """Seed, build and wrap the model (a fresh run with ``init`` loads those weights), build the
    optimizer, restore the latest checkpoint when resuming (weights, optimizer, RNG, counters), open
    metrics.jsonl."""
    cfg = run.cfg
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    model = family.kind.build(run.model_cfg, device=device)
    if cfg.weights == "bf16":  # cast before the start weights load: they may be bf16 already (finetune)
        from depthlab.train.bf16_weights import cast_weights, upcast_linears

        cast_weights(model)
        if device.type == "cpu":
            upcast_linears(model)
    if init is not None and not run.resume:
        model.load_state_dict(init)
    module = D.wrap(model, env, device, family.loss_module)
    optimizer = build_optimizer(model, cfg, device)
    resumed = _restore(run.out, module, model, optimizer, env) if run.resume else {}
    metrics = MetricsLog(run.out / "metrics.jsonl", env.is_main, resumed.get("start"), TrackerSpec.of(cfg), config)
    forward = Forward(module, device, autocast_for(cfg, device), compile_for_training(module) if cfg.compile else None)
    evaluator = family.evaluator(forward, data, env, model, cfg)
    return _Session(run, env, model, module, optimizer, forward, data, evaluator, metrics, config, **resumed)


def _restore(out: Path, module: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer,
             env: D.DistEnv) -> dict[str, Any]:
    """Load the run's latest complete checkpoint (weights, optimizer, RNG; every rank); returns
    the session counters it records: start, tokens, wall_before, last_ckpt."""
    ckpt, data = load_intact(out)  # the newest intact checkpoint (a damaged one is named and skipped)
    D.load_full_state_dicts(module, model, optimizer, data["model"], data["optimizer"])
    set_rng_state(data["rng"])
    state = data["state"]
    if env.is_main:
        log.info("resuming %s from step %d", out, state["step"])
    return {"start": state["step"], "tokens": state["tokens"], "wall_before": state.get("wall_s", 0.0),
            "last_ckpt": ckpt}


def _checkpoint(s: _Session, step: int) -> Path:
    """Save step ``step`` (collective: full state dicts gathered on every rank, rank 0 writes). Weights
    or optimizer state holding NaN/inf are never written: TrainingDiverged names the newest finite one."""
    msd, osd = D.full_state_dicts(s.module, s.model, s.optimizer)
    bad = first_nonfinite(("model", msd), ("optimizer", osd))
    if bad is not None:
        where = f"last good checkpoint: {s.last_ckpt}" if s.last_ckpt else "no checkpoint was written yet"
        raise TrainingDiverged(f"non-finite values in {bad} at step {step}; stopped without saving it ({where})",
                               step, s.last_ckpt)
    path = None
    if s.env.is_main:
        state = {"tokens": s.tokens, "sequences": step * s.run.cfg.batch_size, "wall_s": s.wall(),
                 "world_size": s.env.world_size}
        path = save_checkpoint(s.run.out, step, msd, osd, state, s.config, s.run.cfg.keep_last)
    D.barrier(s.env)
    return path or (s.run.out / "checkpoint" / f"step-{step:08d}")


# ------------------------------------------------------------------------------ the loop
@dataclass
class _Done:
    """What this session produced (for the summary) and its throughput counters."""

    train: dict[str, Any] = field(default_factory=dict)  # the last train record
    eval: EvalResult | None = None
    eval_step: int | None = None
    probe: dict[str, list[float]] | None = None
    layer_grads: Any = None  # the last probe step's per-block gradient norms, on the device
    win_tokens: int = 0  # since the last train line in metrics.jsonl
    win_time: float = 0.0
    session_tokens: int = 0  # optimizer steps only (no eval / probe / checkpoint time)
    session_time: float = 0.0
    compile_s: float | None = None  # the first (compiling) step's seconds, when compiled

    def add_step(self, res: StepResult, loss: float, grad_norm: float | None, tokens: int, dt: float) -> dict[str, Any]:
        """Count one step's tokens and time; its train record (throughput over the current window)."""
        self.win_tokens, self.win_time = self.win_tokens + res.tokens, self.win_time + dt
        self.session_tokens, self.session_time = self.session_tokens + res.tokens, self.session_time + dt
        self.train = {"step": res.step, "loss": loss, "lr": res.lr, "tokens": tokens,
                      "tokens_per_s": self.win_tokens / max(self.win_time, 1e-9)}
        if grad_norm is not None:
            self.train["grad_norm"] = grad_norm
        return self.train


@dataclass
class _Pending:
    """A step whose loss is still on the device: its result, the run's tokens after it, its host seconds."""

    res: StepResult
    tokens: int
    dt: float


def _due(cfg: TrainConfig, step: int) -> dict[str, bool]:
    """What step ``step`` owes after its update: a train line, a probe, an evaluation, a checkpoint (the last step
    all four)."""
    last = step == cfg.steps
    return {"log": step % cfg.log_every == 0 or last,
            "probe": bool(cfg.variance_every) and (step % cfg.variance_every == 0 or last),
            "eval": bool(cfg.eval_every and step % cfg.eval_every == 0) or last,
            "ckpt": bool(cfg.ckpt_every and step % cfg.ckpt_every == 0) or last}


def _run_steps(s: _Session, progress: Progress | None, quiet: bool) -> _Done:
    """Steps ``start + 1 .. cfg.steps``, each followed by its logging, probes, evaluation and checkpoint.

    The losses are read from the device only at steps that owe something (a train line, a probe, an evaluation, a
    checkpoint; :func:`_due`), all pending ones at once, so the host queues the steps in between without waiting
    (a non-finite loss has already stopped the updates on the device, see ``train_step``); ``progress`` and the bar
    get every step's record then, in order."""
    cfg, run = s.run.cfg, s.run
    name, level = f"training {run.out.name}", logging.DEBUG if quiet else logging.INFO
    log.log(level, "%s: %s (%s, %.2fM params), %d steps of batch %d x %d %s, lr %g, %s train sequences; %s", name,
            run.model_cfg.name, run.model_cfg.scheme, s.model.num_params() / 1e6, cfg.steps, cfg.batch_size,
            cfg.seq_len, "tokens" if run.family == "lm" else "patches", cfg.lr, len(s.data.train) or "streamed",
            execution_plan(cfg, s.forward.device, s.compile_auto, s.n_params))
    log.log(level, "%s: measuring %s", name, schedule_line(cfg, run.model_cfg.n_layers))
    s.t_loop = time.perf_counter()
    s.module.train()
    if s.start == 0 and cfg.variance_every:
        s.metrics.write({"step": 0, **s.evaluator.probe(removal=True)})
    done, pending = _Done(), []
    with progress_bar(cfg.steps, name, "step", not quiet and s.env.is_main, initial=s.start) as bar:
        for step in range(s.start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            due = _due(cfg, step)
            grads = due["probe"] and s.evaluator.track_depth  # per-block gradient norms for the probe
            res = train_step(step, s.forward, s.model, s.optimizer, s.data.train, cfg, s.env, layer_grads=grads)
            if res.layer_grad_norm_t is not None:
                done.layer_grads = res.layer_grad_norm_t
            s.tokens += res.tokens
            pending.append(_Pending(res, s.tokens, time.perf_counter() - t0))
            if done.compile_s is None and cfg.compile:
                done.compile_s = pending[-1].dt
                log.log(level, "compiled the training step: its first call took %.1f s (later steps reuse it)",
                        done.compile_s)
            if res.deferred and not any(due.values()):
                continue
            records = _settle(s, pending, done, bar)
            pending = []
            for rec in records[:-1]:
                if progress is not None:
                    progress(rec)
            _after_step(s, step, due, done, quiet)
            if done.eval is not None:
                bar.postfix(**{"held-out loss": f"{done.eval.loss:.3f}"})
            if progress is not None:  # last: a callback that raises leaves a consistent run behind
                progress({**records[-1], **({"eval_loss": done.eval.loss} if done.eval_step == step else {})})
        if done.session_time:  # the last line: this session's training rate
            bar.postfix(rate=f"{done.session_tokens / done.session_time:,.0f} {_rate_unit(run)}")
    return done


def _rate_unit(run: RunSetup) -> str:
    return "tok/s" if run.family == "lm" else "img/s"


def _settle(s: _Session, pending: list[_Pending], done: _Done, bar: Any) -> list[dict[str, Any]]:
    """Read the pending steps' losses (one host sync) and count them, in order; TrainingDiverged at the first
    non-finite one (its update, and every later one, never landed). Returns their train records."""
    t0 = time.perf_counter()
    values = read_results([p.res for p in pending])
    pending[-1].dt += time.perf_counter() - t0  # the wait for the device belongs to the steps it ran
    records = []
    for p, (loss, grad_norm) in zip(pending, values):
        if not math.isfinite(loss):
            where = f"last good checkpoint: {s.last_ckpt}" if s.last_ckpt else "no checkpoint was written yet"
            raise TrainingDiverged(f"loss is {loss} at step {p.res.step}; stopped ({where})", p.res.step, s.last_ckpt)
        rec = done.add_step(p.res, loss, grad_norm, p.tokens, p.dt)
        records.append(rec)
    bar.postfix(loss=f"{records[-1]['loss']:.3f}", rate=f"{records[-1]['tokens_per_s']:,.0f} {_rate_unit(s.run)}")
    bar.update(len(records))
    return records


def _after_step(s: _Session, step: int, due: dict[str, bool], done: _Done, quiet: bool) -> None:
    """What ``due`` says step ``step`` owes: its train line, a probe, an evaluation, a checkpoint."""
    cfg, last = s.run.cfg, step == s.run.cfg.steps
    if due["log"]:
        s.metrics.write(done.train)
        done.win_tokens, done.win_time = 0, 0.0
    if due["probe"]:
        nth = step // cfg.variance_every  # the removal sweep (L partial forwards) every removal_every-th probe
        done.probe = s.evaluator.probe(removal=last or (cfg.removal_every > 0 and nth % cfg.removal_every == 0))
        if done.layer_grads is not None and s.evaluator.track_depth:  # this step's gradient, before clipping
            done.probe["layer_grad_norm"], done.layer_grads = done.layer_grads.tolist(), None
        s.metrics.write({"step": step, **done.probe})
    if due["eval"]:
        done.eval, done.eval_step = s.evaluator.evaluate(), step
        s.metrics.write(done.eval.record(step))
        log.log(logging.DEBUG if quiet else logging.INFO, "%s step %d: %s", s.run.out.name, step, done.eval.describe())
    if due["ckpt"]:
        s.last_ckpt = _checkpoint(s, step)


def _summary(s: _Session, done: _Done, t_start: float) -> dict[str, Any]:
    """summary.json: final held-out loss, probes, tokens and timings (evaluated now if this
    session trained no step, e.g. when resuming a finished run)."""
    ev = done.eval if done.eval is not None else s.evaluator.evaluate()
    wall = s.wall()
    probe = done.probe if done.probe is not None else s.evaluator.probe()
    return {
        "steps": s.run.cfg.steps, "scheme": s.run.model_cfg.scheme, "train_loss": done.train.get("loss"),
        **ev.summary(), "layer_variance": probe["layer_variance"],
        "tokens": s.tokens, "wall_s": wall, "tokens_per_s": s.tokens / max(wall, 1e-9),
        "step_tokens_per_s": done.session_tokens / done.session_time if done.session_time else None,
        "setup_s": time.perf_counter() - t_start - (wall - s.wall_before), "compile_s": done.compile_s,
    }
