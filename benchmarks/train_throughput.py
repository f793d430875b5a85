"""Training throughput of depthlab's trainer step (eager, compiled, bf16) against plain Hugging Face Llama loops.

usage:
    python benchmarks/train_throughput.py --preset tiny --seq-len 256 --batch-size 4
    python benchmarks/train_throughput.py --preset llama-20m --seq-len 256 --batch-size 4 \\
        --variants pre,pre+compile,pre+bf16,pre+bf16+compile,hf
    python benchmarks/train_throughput.py --preset llama-130m --seq-len 1024 --batch-size 16 --device cuda \\
        --variants pre+bf16,lns+bf16,pre+bf16+compile,lns+bf16+compile,hf+bf16,official   # benchmarks/gpu/

Variants (``--variants``, comma-separated), each ``MODEL[+bf16][+compile][+cudagraphs][+sync]``:
- ``pre``, ``lns`` (any depthlab scheme): one optimizer step of depthlab's trainer
  (``depthlab.train.step.train_step``: its Forward, loss accumulation, lr schedule and optimizer, i.e. fused
  AdamW on CPU and CUDA); ``+bf16`` = ``--dtype bf16`` (autocast, fp32 master weights); ``+compile`` =
  ``--compile`` (forward + loss + their backward compiled with inductor; the optimizer eager), as the trainer
  compiles it (LNS's constant scales lifted to data first); ``+sync`` reads the loss after every step, as the
  trainer did before its steps stopped waiting for the device (a host sync per step: the A/B of that change);
  ``+cudagraphs`` compiles with ``mode="reduce-overhead"`` (the compiled forward and backward replayed as CUDA
  graphs: no kernel launches from the host; implies ``+compile``; the trainer does not offer it yet);
  ``+autotune`` compiles with ``mode="max-autotune-no-cudagraphs"`` (inductor times Triton templates against
  cuBLAS for every matmul shape; a long first compile); ``+chunkce`` (or ``+chunkceN``: N rows a chunk) takes the
  loss from the LM head in chunks, the logits never whole (``depthlab.models.nn.loss``; ``LMLoss(chunked_ce=True)``);
  ``+foreach`` steps a foreach (multi-tensor, unfused) Adam(W) instead of the fused one, which also makes the
  trainer read each loss before stepping (a host sync: what an unfused optimizer costs the trainer);
  ``+mbN``: N sequences per forward for this variant (default ``--micro-batch-size``).
- ``hf``: a plain loop over ``transformers.LlamaForCausalLM`` of the same shape (SDPA attention): forward,
  cross-entropy, backward, ``torch.optim.AdamW`` with torch's default implementation for the device,
  zero_grad; ``+bf16`` autocasts its forward; ``+compile`` compiles its forward + loss.
- ``official``: the official-style loop (the paper's code): the HF model with its weights cast to bf16
  (pure bf16: no fp32 master copy), AdamW on them, no compile, ``loss.item()`` after every micro-step, and
  no packing. Here it runs on the same full batch as every variant, so its tokens/s is an upper bound:
  with padding (no packing), its useful tokens per step would be fewer.
Every step reads the same random token batch from CPU memory (data loading is not measured).

Measurement protocol
- ``--repeats 0`` runs the warm-up only: the first (compiling) step of each variant, e.g. to time a cold compile
  or to fill the inductor cache for a later run.
- ``--warmup`` steps per variant first, untimed (they trigger compilation; the first step's time is
  recorded as ``first_step_s``, so a compiled variant's compile cost is known: break-even steps =
  (first_step_s - step_s) / (eager step_s - step_s)).
- Then ``--repeats`` rounds; in each round every variant runs ``--steps`` timed steps, the order rotating
  round by round (interleaved), so slow drifts of a shared machine hit all variants alike. tokens/s of a
  variant = median over rounds; ratios are medians of per-round (same-moment) ratios.
- torch's default thread count unless ``--threads`` (on a shared machine, 1 thread avoids OpenMP
  spin-waits against other processes); on CUDA the clock is read after ``torch.cuda.synchronize()``, and peak
  memory is ``torch.cuda.max_memory_allocated`` over a variant's timed steps.

FLOPs. Per trained token, PaLM's count (Chowdhery et al. 2022, app. B): ``6 * N + 12 * L * H * head_dim * T``,
with ``N`` the parameters that take part in matmuls (all but an untied input-embedding table) and the
attention term counting the full (non-causal) score matrix. Achieved FLOP/s = tokens/s x that count.
It is reported against two references:
- ``of_matmul``: this machine's own measured dense matmul rate: ``--matmul-size`` square products, in fp32
  once per round (best of 3, interleaved with the variants: the median over rounds) and in bf16 before the
  rounds (best of 5); the faster of the two is the reference for every variant (bf16 on a GPU; on a CPU
  without bf16 instructions, fp32): the fraction of what the device's matmul library reaches at its best;
- ``mfu`` (CUDA): against the data-sheet peak of ``PEAK_TFLOPS`` (dense, no sparsity), the usual MFU.

``--profile VARIANT,...``: after the rounds, ``--profile-steps`` steps of each named variant under torch.profiler
(benchmarks/step_profile.py): the shares of matmul, attention, cross-entropy, embedding, optimizer, copies and
element-wise work in the GPU's time, the launch gaps (the share of the window the GPU idled) and the top kernels;
in the report's ``profile``. Compiled variants of other shapes or modes never reuse each other's graphs (one
process may hold many: dynamo's automatic dynamic shapes are off here and its recompile limit raised).

The result (device, versions, the exact command, the load average, every raw timing) is written as JSON to
``benchmarks/results/train_throughput_<device>_<preset>.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import depthlab

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_out import result_path  # noqa: E402  (sibling module)

#: Dense peak tensor-core TFLOP/s by (device-name fragment, dtype); first match wins.
#: Sources: NVIDIA H100 / H200 / A100 / L4 data sheets ("with sparsity" figures halved).
PEAK_TFLOPS: list[tuple[str, str, float]] = [
    ("H100 PCIe", "bfloat16", 756.0),
    ("H100 NVL", "bfloat16", 835.0),
    ("H100", "bfloat16", 989.4),  # SXM5
    ("H200", "bfloat16", 989.4),
    ("GH200", "bfloat16", 989.4),
    ("A100", "bfloat16", 312.0),
    ("L4", "bfloat16", 121.0),
    ("H100 PCIe", "float32", 378.0),  # TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)
    ("H100", "float32", 494.7),
    ("H200", "float32", 494.7),
    ("A100", "float32", 156.0),
]

DEFAULT_VARIANTS = "pre,lns,pre+compile,pre+bf16,pre+bf16+compile,hf"
HF_KINDS = ("hf", "official")


# ---------------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class Variant:
    name: str  # as given, e.g. "lns+bf16+compile"
    model: str  # a depthlab scheme, "hf" or "official"
    bf16: bool
    compile: bool
    sync: bool = False  # read the loss after every step (a host-device sync)
    cudagraphs: bool = False  # torch.compile(mode="reduce-overhead")
    autotune: bool = False  # torch.compile(mode="max-autotune-no-cudagraphs")
    chunkce: bool = False  # the loss from the LM head in chunks (LMLoss(chunked_ce=True))
    ce_rows: int | None = None  # rows per chunk (None: linear_cross_entropy's default)
    foreach: bool = False  # a foreach Adam(W) instead of the fused one
    micro: int | None = None  # sequences per forward (None: --micro-batch-size)
    d_ff: int | None = None  # the MLP's width padded to this (its extra units start at zero and stay there)

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.bf16 or self.model == "official" else "float32"

    @property
    def mode(self) -> str | None:
        """torch.compile's mode."""
        return "reduce-overhead" if self.cudagraphs else "max-autotune-no-cudagraphs" if self.autotune else None


FLAGS = ("bf16", "compile", "cudagraphs", "autotune", "sync", "foreach", "chunkce[N]", "mbN", "dffN")


def parse_variant(spec: str) -> Variant:
    model, *flags = spec.strip().split("+")
    simple = {f for f in flags if f in ("bf16", "compile", "cudagraphs", "autotune", "sync", "foreach", "chunkce")}
    micro = [int(f[2:]) for f in flags if re.fullmatch(r"mb[1-9][0-9]*", f)]
    rows = [int(f[7:]) for f in flags if re.fullmatch(r"chunkce[1-9][0-9]*", f)]
    d_ff = [int(f[3:]) for f in flags if re.fullmatch(r"dff[1-9][0-9]*", f)]
    unknown = [f for f in flags if f not in simple and not re.fullmatch(r"(mb|chunkce|dff)[1-9][0-9]*", f)]
    if unknown or not model:
        raise ValueError(f"variant {spec!r}: MODEL[+FLAG]..., FLAG one of {', '.join(FLAGS)}; unknown part(s) {unknown}")
    if model == "official" and set(flags) - {f"mb{m}" for m in micro}:
        raise ValueError("the official-style loop is pure bf16 and uncompiled by definition: no +flags but +mbN")
    if model == "hf" and simple & {"sync", "foreach", "chunkce"} or model == "hf" and rows:
        raise ValueError("+sync, +foreach and +chunkce are for depthlab's trainer step (the HF loop is a plain one)")
    if "cudagraphs" in simple and "autotune" in simple:
        raise ValueError(f"variant {spec!r}: +cudagraphs or +autotune (two compile modes), not both")
    if model not in HF_KINDS:
        from depthlab.models.schemes import get_scheme

        get_scheme(model)  # an unknown scheme fails here, naming the valid ones
    graphs = "cudagraphs" in simple
    return Variant(spec.strip(), model, "bf16" in simple, bool(simple & {"compile", "cudagraphs", "autotune"}),
                   "sync" in simple, graphs, "autotune" in simple, "chunkce" in simple or bool(rows),
                   rows[0] if rows else None, "foreach" in simple, micro[0] if micro else None, d_ff[0] if d_ff else None)


class FixedBatch:
    """The trainer's data interface over one fixed (x, y) batch in CPU memory."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def rank_batch(self, step: int, batch_size: int, rank: int, world_size: int):
        return self.x, self.y


def hf_llama(cfg: depthlab.ModelConfig) -> torch.nn.Module:
    """transformers.LlamaForCausalLM with the same shape as ``cfg`` (SDPA attention)."""
    from transformers import LlamaForCausalLM

    from depthlab.hf import hf_config_for

    hf_cfg = hf_config_for(cfg)
    hf_cfg.use_cache = False
    hf_cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(hf_cfg)


def trainer_step(v: Variant, cfg: depthlab.ModelConfig, data: FixedBatch, device: torch.device, seed: int,
                 micro: int | None = None):
    """(model, step closure) running depthlab's own optimizer step on ``data`` (``micro`` sequences per forward:
    the batch accumulated over micro-batches, as ``--micro-batch-size`` does)."""
    from depthlab.train import distributed as D
    from depthlab.train.config import TrainConfig
    from depthlab.train.optim import build_optimizer
    from depthlab.train.step import Forward, autocast_for, compile_for_training, train_step

    torch.manual_seed(seed)
    model = depthlab.build_model(cfg.replace(scheme=v.model), device=device).train()
    batch = data.x.shape[0]
    tcfg = TrainConfig(optimizer="adamw", lr=1e-4, warmup=0, steps=10**9, batch_size=batch, micro_batch_size=micro or batch,
                       seq_len=data.x.shape[1], device=str(device), dtype="bf16" if v.bf16 else "fp32", compile=v.compile)
    module, env = D.LMLoss(model, chunked_ce=v.chunkce, ce_rows=v.ce_rows), D.DistEnv()
    forward = Forward(module, device, autocast_for(tcfg, device), compile_for_training(module, v.mode) if v.compile else None)
    optimizer = build_optimizer(model, tcfg, device)
    if v.foreach:  # the same groups and hyper-parameters, the multi-tensor (unfused) kernels
        takes = set(inspect.signature(type(optimizer)).parameters) - {"params", "fused", "foreach"}
        groups = [{k: x for k, x in g.items() if k not in ("fused", "foreach")} for g in optimizer.param_groups]
        kwargs = {k: x for k, x in optimizer.defaults.items() if k in takes}
        optimizer = type(optimizer)(groups, **kwargs, fused=None, foreach=True)
    counter = iter(range(1, 10**9))

    def step() -> None:
        res = train_step(next(counter), forward, model, optimizer, data, tcfg, env)
        if v.sync:
            res.loss  # noqa: B018 - reading it waits for the device, as every step of the loop used to

    return model, step


def hf_step(v: Variant, cfg: depthlab.ModelConfig, data: FixedBatch, device: torch.device, seed: int,
            micro: int | None = None):
    """(model, step closure) of a plain HF loop (``hf``) or the official-style loop (``official``); ``micro``
    sequences per forward (gradients accumulated; the official loop reads each micro-step's loss)."""
    torch.manual_seed(seed)
    model = hf_llama(cfg).to(device).train()
    if v.model == "official":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def loss_fn(inp: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=inp).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())

    fwd = torch.compile(loss_fn, mode=v.mode) if v.compile else loss_fn

    def step() -> None:
        x, y = data.x.to(device, non_blocking=True), data.y.to(device, non_blocking=True)
        size = micro or x.shape[0]
        for i in range(0, x.shape[0], size):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=v.bf16):
                loss = fwd(x[i:i + size], y[i:i + size]) * (size / x.shape[0])
            loss.backward()
            if v.model == "official":
                loss.item()  # the official loop logs every micro-step's loss: a device sync each time
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def matmul_params(model: torch.nn.Module, cfg: depthlab.ModelConfig) -> int:
    """Parameters that take part in matmuls: all but an untied input-embedding table."""
    total = sum(p.numel() for p in model.parameters())
    return total if cfg.tie_embeddings else total - cfg.vocab_size * cfg.d_model


def useful_matmul_params(cfg: depthlab.ModelConfig) -> int:
    """Matmul parameters of the model ``cfg`` describes (counted on the meta device): the useful work of a variant
    whose MLP is padded (``+dffN``) is the unpadded model's."""
    from depthlab.models.decoder import num_params

    return num_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)


def flops_per_token(n_matmul: int, cfg: depthlab.ModelConfig, seq_len: int) -> float:
    """PaLM's training FLOPs per token: 6N + 12 * L * H * head_dim * T."""
    return 6.0 * n_matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.dim_head * seq_len


# ---------------------------------------------------------------------------------- environment
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """This machine's dense (n x n) @ (n x n) rate in TFLOP/s: the best of ``repeats`` timed products."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device, dtype) for _ in range(2))
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e12


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_tflops(name: str, dtype: str) -> float | None:
    for fragment, dt, tflops in PEAK_TFLOPS:
        if fragment in name and dt == dtype:
            return tflops
    return None


def environment(device: torch.device) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = None
    cpu_flags = ""
    if device.type == "cpu" and Path("/proc/cpuinfo").exists():
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
        cpu_flags = " ".join(f for f in flags.split() if f.startswith(("avx512", "amx", "avx2")))
    return {"device": device_name(device), "device_type": device.type, "torch": torch.__version__,
            "transformers": transformers, "depthlab": depthlab.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_flags": cpu_flags}


# ---------------------------------------------------------------------------------- measuring
def build_all(variants: list[Variant], cfg, data: FixedBatch, device: torch.device, seed: int,
              micro: int | None = None) -> dict:
    """name -> (model, step closure)."""
    out = {}
    for v in variants:
        make = hf_step if v.model in HF_KINDS else trainer_step
        if v.d_ff is not None and v.d_ff < cfg.d_ff:
            raise ValueError(f"variant {v.name}: +dff{v.d_ff} pads the MLP, so it must be at least d_ff {cfg.d_ff}")
        vcfg = cfg.replace(d_ff=v.d_ff) if v.d_ff else cfg
        out[v.name] = make(v, vcfg, data, device, seed, v.micro or micro)
        if v.d_ff:
            pad_mlp(out[v.name][0], cfg.d_ff)
    return out


def pad_mlp(model: torch.nn.Module, d_ff: int) -> None:
    """Zero the MLP units past ``d_ff`` of a model built wider (``+dffN``): the gate and up rows and the down columns of
    the extra units. A zero unit computes silu(0) * 0 = 0 and gets zero gradients, so Adam never moves it: the model
    trains exactly as the unpadded one, its matmuls on tensor-core-aligned shapes."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 2)[-2] if name.count(".") else name
            if p.dim() == 2 and leaf in ("gate_proj", "up_proj", "fc1"):
                p[d_ff:].zero_()
            elif p.dim() == 2 and leaf in ("down_proj", "fc2"):
                p[:, d_ff:].zero_()


def left(args: argparse.Namespace) -> float:
    """Seconds left of ``--budget-s`` (inf without one)."""
    return args.deadline - time.perf_counter()


def warm_up(steps: dict, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Run ``args.warmup`` untimed steps of each variant (compiling the compiled ones) while the budget lasts;
    returns the first step's seconds of each variant warmed up (the others are left out of the rounds: the budget
    was spent, or the variant failed; ``args.errors`` says why, in one line)."""
    first = {}
    for name, (_, step) in steps.items():
        if left(args) <= 0:
            print(f"  warm-up {name}: skipped, the --budget-s is spent", flush=True)
            continue
        try:
            for i in range(args.warmup):
                sync(device)
                t0 = time.perf_counter()
                step()
                sync(device)
                if i == 0:
                    first[name] = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - one variant failing (e.g. out of memory) leaves the others measured
            args.errors[name] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
            first.pop(name, None)
            print(f"  warm-up {name}: failed, {args.errors[name]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        print(f"  warm-up {name}: first step {first.get(name, 0):.1f}s", flush=True)
    return first


def static_graphs() -> None:
    """One process measures compiled variants of several shapes and modes: each gets its own static graph (dynamo's
    automatic dynamic shapes would compile the second batch size as a dynamic-shape graph, with other kernels than
    a run of that size gets), and the recompile limit is raised so that no variant falls back to eager."""
    import torch._dynamo.config as dynamo

    dynamo.automatic_dynamic_shapes = False
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, 64)


def profile_variants(built: dict, args: argparse.Namespace, device: torch.device) -> dict:
    """``--profile``: each named (and warmed-up) variant's :func:`step_profile.profile_steps`, while the budget lasts."""
    from step_profile import profile_steps

    out = {}
    for name in args.profile:
        if name not in built:
            out[name] = {"skipped": args.errors.get(name, "not warmed up (the --budget-s ran out)")}
        elif left(args) <= 0:
            out[name] = {"skipped": "the --budget-s ran out"}
        else:
            out[name] = profile_steps(built[name][1], args.profile_steps, device)
            shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in out[name].get("shares", {}).items())
            print(f"  profile {name}: {shares}; launch gaps {100 * (out[name].get('launch_gap_share') or 0):.0f}%",
                  flush=True)
    return out


def timed_rounds(steps: dict, args: argparse.Namespace, device: torch.device,
                 matmul: Callable[[], float]) -> tuple[dict, dict, list[float]]:
    """Interleaved rounds: seconds per round of ``args.steps`` steps, and peak memory (CUDA), per variant; and
    ``matmul()`` (the fp32 matmul rate) once per round, so that the reference is measured at the same moments.
    A round starts only when the budget has room for one more as long as the last and for the profiles (12 s each)
    after the rounds (always at least one round)."""
    names = list(steps)
    raw: dict[str, list[float]] = {n: [] for n in names}
    peak: dict[str, int | None] = {n: None for n in names}
    rates: list[float] = []
    last_round = 0.0
    for r in range(args.repeats if names else 0):
        if r and left(args) < last_round + 12.0 * len(args.profile):  # the profiles after the rounds keep their time
            print(f"  stopped after {r} round(s): the --budget-s has no room for another", flush=True)
            break
        t_round = time.perf_counter()
        rates.append(matmul())
        for n in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[n][1]()
            sync(device)
            raw[n].append(time.perf_counter() - t0)
            if device.type == "cuda":
                peak[n] = max(peak[n] or 0, torch.cuda.max_memory_allocated(device))
        last_round = time.perf_counter() - t_round
        print(f"  round {r + 1}/{args.repeats}: " + "  ".join(f"{n} {raw[n][-1]:.2f}s" for n in names)
              + f"  (fp32 matmul {rates[-1]:.3f} TFLOP/s)", flush=True)
    return raw, peak, rates


def summarize(variants: list[Variant], built: dict, raw: dict, peak: dict, first: dict, args, cfg, rates: dict,
              peaks: dict) -> dict:
    """Per variant: tokens/s (median, min, max), FLOP/s and its fractions, memory, compile cost (a variant the
    budget left out: only why, and its first step when it had one)."""
    tokens_per_round = args.steps * args.batch_size * args.seq_len
    results = {}
    for v in variants:
        if not raw.get(v.name):
            why = "the --budget-s ran out" if args.repeats else "no timed rounds (--repeats 0: the warm-up only)"
            why = args.errors.get(v.name, why)
            results[v.name] = {"model": v.model, "skipped": why, "first_step_s": first.get(v.name)}
            continue
        tps = [tokens_per_round / t for t in raw[v.name]]
        med = statistics.median(tps)
        n_mm = matmul_params(built[v.name][0], cfg) if not v.d_ff else useful_matmul_params(cfg)
        tflops = med * flops_per_token(n_mm, cfg, args.seq_len) / 1e12
        step_s = args.batch_size * args.seq_len / med
        results[v.name] = {
            "model": v.model, "bf16": v.bf16, "compile": v.compile, "cudagraphs": v.cudagraphs, "sync": v.sync,
            "autotune": v.autotune, "chunked_ce": v.chunkce, "ce_rows": v.ce_rows, "foreach": v.foreach,
            "micro_batch_size": v.micro or args.micro_batch_size or args.batch_size, "dtype": v.dtype,
            "tokens_per_s_median": med, "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
            "tokens_per_s_all": tps, "seconds_per_round": raw[v.name], "step_s": step_s,
            "first_step_s": first.get(v.name), "compile_s_estimate": (first[v.name] - step_s) if v.compile and v.name in first
            else None, "params": sum(p.numel() for p in built[v.name][0].parameters()), "matmul_params": n_mm,
            "flops_per_token": flops_per_token(n_mm, cfg, args.seq_len), "achieved_tflops": tflops,
            "of_matmul": tflops / max(rates.values()), "mfu": tflops / peaks[v.dtype] if peaks.get(v.dtype) else None,
            "peak_memory_gib": peak[v.name] / 2**30 if peak[v.name] is not None else None,
        }
    return results


def paired_ratios(raw: dict, variants: list[Variant], baseline: str | None = None) -> dict[str, float]:
    """Median over rounds of (time of b / time of a) = tokens/s of a over b, measured at the same moment:
    every variant over ``baseline`` (``--baseline``; default the first ``hf`` variant), each ``lns...`` over its
    ``pre...`` twin, and each variant over its ``+sync`` twin (variants the budget left out have no rounds, and no
    ratio)."""
    names = [v.name for v in variants if raw.get(v.name)]
    pairs = []
    base = baseline if baseline in names else next((n for n in names if n.split("+")[0] == "hf"), None)
    if base:
        pairs += [(n, base) for n in names if n != base]
    pairs += [(n, "pre" + n[3:]) for n in names if n.startswith("lns") and "pre" + n[3:] in names]
    pairs += [(n, n + "+sync") for n in names if n + "+sync" in names]
    return {f"{a}_over_{b}": statistics.median(tb / ta for ta, tb in zip(raw[a], raw[b])) for a, b in dict.fromkeys(pairs)}


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="llama-20m", help="depthlab preset (default llama-20m)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=None, help="sequences per forward (default: the whole "
                   "batch); the batch is accumulated over micro-batches, one optimizer step")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant before the first round (>= 1)")
    p.add_argument("--repeats", type=int, default=8, help="rounds; each variant's tokens/s is the median")
    p.add_argument("--device", default="cpu")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"MODEL[+bf16][+compile],... (default {DEFAULT_VARIANTS})")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the n x n matmul rate (default 1024 CPU, 8192 CUDA)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset field (e.g. n_layers=2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="result folder or .json file (default outside the checkout; "
                   "--out benchmarks/results updates the committed one)")
    p.add_argument("--baseline", default=None, help="the variant every other one is paired with (default: the "
                   "first hf variant)")
    p.add_argument("--profile", default="", help="variants to profile after the rounds (comma-separated; "
                   "benchmarks/step_profile.py): the report's 'profile'")
    p.add_argument("--profile-steps", type=int, default=2, help="steps per profiled variant (default 2)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-time budget: variants not warmed up and rounds "
                   "not started by then are left out, and what was measured is written (default: none)")
    args = p.parse_args(argv)
    args.deadline = time.perf_counter() + (args.budget_s if args.budget_s else float("inf"))
    args.errors = {}  # variant -> why its warm-up failed
    for name in ("seq_len", "batch_size", "steps", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.repeats < 0:
        p.error(f"--repeats must be >= 0 (0: only the warm-up, e.g. to time the compile), got {args.repeats}")
    if args.micro_batch_size is not None and (args.micro_batch_size < 1 or args.batch_size % args.micro_batch_size):
        p.error(f"--micro-batch-size must divide --batch-size {args.batch_size}, got {args.micro_batch_size}")
    try:
        args.parsed = [parse_variant(s) for s in args.variants.split(",") if s.strip()]
    except (ValueError, depthlab.DepthlabError) as err:
        p.error(str(err))
    for v in args.parsed:
        if v.micro is not None and args.batch_size % v.micro:
            p.error(f"variant {v.name}: +mb{v.micro} must divide --batch-size {args.batch_size}")
    args.profile = [n.strip() for n in args.profile.split(",") if n.strip()]
    unknown = [n for n in args.profile if n not in {v.name for v in args.parsed}]
    if unknown:
        p.error(f"--profile {','.join(unknown)}: not among --variants ({args.variants})")
    return args


def measure(args: argparse.Namespace) -> dict:
    """Build every variant, warm up, run the interleaved rounds; the report dict."""
    from depthlab.base.devices import resolve_device

    device = resolve_device(args.device)  # "cuda" -> cuda:<current>
    static_graphs()
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    base = depthlab.PRESETS[args.preset].get("max_seq_len", 1)
    overrides = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    cfg = depthlab.from_preset(args.preset, **{"max_seq_len": max(args.seq_len, base), **overrides})
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(cfg.vocab_size, (args.batch_size, args.seq_len + 1), generator=gen)
    data = FixedBatch(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    env = environment(device)
    n = args.matmul_size or (8192 if device.type == "cuda" else 1024)
    rates = {"float32": matmul_tflops(device, torch.float32, n, 5), "bfloat16": matmul_tflops(device, torch.bfloat16, n, 5)}
    peaks = {dt: peak_tflops(env["device"], dt) if device.type == "cuda" else None for dt in rates}
    print(f"device {env['device']} | torch {torch.__version__} | threads {env['threads']} | matmul "
          + ", ".join(f"{k} {v:.3f} TFLOP/s" for k, v in rates.items()), flush=True)
    load_before = list(os.getloadavg())
    if args.repeats == 0:  # the warm-up only (the runbook's cold compiles): one variant alive at a time
        built, first = {}, {}
        for v in args.parsed:
            one = build_all([v], cfg, data, device, args.seed, args.micro_batch_size)
            first.update(warm_up(one, args, device))
            del one
            if device.type == "cuda":
                torch.cuda.empty_cache()
    else:
        built = build_all(args.parsed, cfg, data, device, args.seed, args.micro_batch_size)
        first = warm_up(built, args, device)
    built_warm = {k: v for k, v in built.items() if k in first}
    raw, peak, fp32_rates = timed_rounds(built_warm, args, device, lambda: matmul_tflops(device, torch.float32, n, 3))
    profiles = profile_variants(built_warm, args, device)
    if fp32_rates:
        rates["float32"] = statistics.median(fp32_rates)  # the same moments as the steps (a shared machine drifts)
    return {
        "benchmark": "train_throughput", "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        **env, "preset": args.preset, "model_config": cfg.to_dict(), "seq_len": args.seq_len,
        "batch_size": args.batch_size, "micro_batch_size": args.micro_batch_size or args.batch_size,
        "steps_per_round": args.steps, "warmup_steps": args.warmup,
        "repeats": args.repeats, "budget_s": args.budget_s, "rounds_done": len(fp32_rates),
        "matmul_size": n, "matmul_tflops": rates, "fp32_matmul_tflops_per_round": fp32_rates,
        "peak_tflops": peaks,
        "flops_convention": "PaLM: 6*N_matmul + 12*L*H*head_dim*T per token (non-causal attention count)",
        "results": summarize(args.parsed, built, raw, peak, first, args, cfg, rates, peaks),
        "paired_ratios": paired_ratios(raw, args.parsed, args.baseline), "profile": profiles,
        "loadavg_before_after": [load_before, list(os.getloadavg())],
        "goals": {"best_depthlab_over_hf_cpu": ">= 1.5", "lns_over_pre": ">= 0.99",
                  "mfu_h100_llama-130m_seq1024_compiled_bf16": ">= 0.45", "over_official_gpu": ">= 2"},
    }


def print_table(report: dict) -> None:
    print(f"\n{'variant':<22} {'tokens/s':>10} {'step s':>8} {'TFLOP/s':>8} {'of matmul':>9} {'MFU':>6} "
          f"{'first s':>8} {'peak GiB':>8}")
    for name, r in report["results"].items():
        if "skipped" in r:
            print(f"{name:<22} skipped: {r['skipped']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        mem = f"{r['peak_memory_gib']:.2f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{name:<22} {r['tokens_per_s_median']:>10.0f} {r['step_s']:>8.3f} {r['achieved_tflops']:>8.3f} "
              f"{100 * r['of_matmul']:>8.1f}% {mfu:>6} {r['first_step_s']:>8.1f} {mem:>8}")
    for k, v in report["paired_ratios"].items():
        print(f"{k}: {v:.3f} (median of per-round ratios)")
    print(f"load average before/after: {report['loadavg_before_after']}")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report = measure(args)
    if argv is not None:
        report["command"] = "python benchmarks/train_throughput.py " + " ".join(shlex.quote(a) for a in argv)
    out = result_path(f"train_throughput_{report['device_type']}_{args.preset}.json", args.out)
    from depthlab.base.fileio import write_json_atomic

    write_json_atomic(out, report)
    print_table(report)
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
