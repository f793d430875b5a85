"""Training throughput of depthlab (pre, lns) against a plain Hugging Face LlamaForCausalLM loop.

usage:
    python benchmarks/train_throughput.py --preset llama-20m --seq-len 256 --batch-size 8
    python benchmarks/train_throughput.py --preset llama-130m --seq-len 1024 --batch-size 16 \\
        --device cuda --dtype bfloat16 --compile            # the MFU goal (>= 45 % on an H100)

What one "step" is, for every model: forward, cross-entropy on next-token targets, backward,
AdamW step, zero_grad -- the same random token batch each time (data loading is not measured).

Measurement protocol
- ``--warmup`` steps per model are run first and excluded (they also trigger ``torch.compile``).
- Then ``--repeats`` rounds; in each round every model runs ``--steps`` timed steps. The order of
  the models rotates from round to round (interleaving), so slow drifts of the machine (thermal,
  other processes) hit all models alike. tokens/s of a model = median over its rounds.
- torch's default thread count is kept (``torch.get_num_threads()`` is recorded).
- On CUDA the clock is read after ``torch.cuda.synchronize()``.

MFU (CUDA only) = achieved FLOP/s / peak FLOP/s, with the PaLM (Chowdhery et al. 2022, app. B)
count per token: ``6 * N + 12 * n_layers * n_heads * head_dim * seq_len``, where ``N`` counts the
parameters that take part in matmuls (all but the input-embedding table, unless it is tied to the
LM head). The attention term counts the full (non-causal) score matrix, as PaLM does. Peak FLOP/s:
see ``PEAK_TFLOPS`` (dense, no sparsity, from NVIDIA's data sheets).

The result (device, versions, the exact command, every raw timing) is written as JSON to
``benchmarks/results/train_throughput_<device>_<preset>.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import depthlab

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

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------- models
def hf_llama(cfg: depthlab.ModelConfig) -> torch.nn.Module:
    """transformers.LlamaForCausalLM with the same shape as ``cfg`` (SDPA attention)."""
    from transformers import LlamaForCausalLM

    from depthlab.hf import hf_config_for

    hf_cfg = hf_config_for(cfg)
    hf_cfg.use_cache = False
    hf_cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(hf_cfg)


def matmul_params(model: torch.nn.Module, cfg: depthlab.ModelConfig) -> int:
    """Parameters that take part in matmuls: all but an untied input-embedding table."""
    total = sum(p.numel() for p in model.parameters())
    return total if cfg.tie_embeddings else total - cfg.vocab_size * cfg.d_model


def flops_per_token(n_matmul: int, cfg: depthlab.ModelConfig, seq_len: int) -> float:
    """PaLM's training FLOPs per token: 6N + 12 * L * H * head_dim * T."""
    return 6.0 * n_matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.dim_head * seq_len


# ---------------------------------------------------------------------------------- one step
def make_step(
    model: torch.nn.Module, kind: str, x: torch.Tensor, y: torch.Tensor, amp: torch.dtype | None, compile_: bool
) -> Callable[[], None]:
    """A closure running one full training step of ``model`` on the fixed batch (x, y)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def loss_fn(inp: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        if kind == "hf":
            logits = model(input_ids=inp).logits
        else:
            logits = model(inp).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())

    fwd = torch.compile(loss_fn) if compile_ else loss_fn
    device_type = x.device.type

    def step() -> None:
        with torch.autocast(device_type, dtype=amp, enabled=amp is not None):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------- environment
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


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="llama-20m", help="depthlab preset (default llama-20m)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model before the first round")
    p.add_argument("--repeats", type=int, default=10, help="rounds; each model's tokens/s is the median")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="autocast dtype (float32 = none)")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward + loss")
    p.add_argument("--models", default="pre,lns,hf", help="comma list among pre, lns, hf (or any depthlab scheme)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/...)")
    args = p.parse_args(argv)
    for name in ("seq_len", "batch_size", "steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def build(name: str, cfg: depthlab.ModelConfig, device: torch.device, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = hf_llama(cfg) if name == "hf" else depthlab.build_model(cfg.replace(scheme=name))
    return model.to(device).train()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp = None if args.dtype == "float32" else DTYPES[args.dtype]
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    cfg = depthlab.from_preset(args.preset, max_seq_len=max(args.seq_len, depthlab.PRESETS[args.preset].get("max_seq_len", 1)))

    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(cfg.vocab_size, (args.batch_size, args.seq_len + 1), generator=gen).to(device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    models = {n: build(n, cfg, device, args.seed) for n in names}
    steps = {n: make_step(m, "hf" if n == "hf" else "depthlab", x, y, amp, args.compile) for n, m in models.items()}
    n_matmul = {n: matmul_params(m, cfg) for n, m in models.items()}
    print(f"device {device_name(device)} | torch {torch.__version__} | threads {torch.get_num_threads()}", flush=True)
    for n in names:
        print(f"  {n}: {sum(p.numel() for p in models[n].parameters()):,} params ({n_matmul[n]:,} in matmuls)")

    # warm-up (and compilation), untimed
    for n in names:
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            steps[n]()
        sync(device)
        print(f"  warm-up {n}: {time.perf_counter() - t0:.1f}s", flush=True)

    load_before = _loadavg()
    raw: dict[str, list[float]] = {n: [] for n in names}  # seconds per round of --steps steps
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate the order each round
        for n in order:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                steps[n]()
            sync(device)
            raw[n].append(time.perf_counter() - t0)
        print(f"  round {r + 1}/{args.repeats}: " + "  ".join(f"{n} {raw[n][-1]:.2f}s" for n in names), flush=True)

    tokens_per_round = args.steps * args.batch_size * args.seq_len
    name = device_name(device)
    peak = peak_tflops(name, args.dtype) if device.type == "cuda" else None
    results = {}
    for n in names:
        tps = [tokens_per_round / t for t in raw[n]]
        med = statistics.median(tps)
        fpt = flops_per_token(n_matmul[n], cfg, args.seq_len)
        results[n] = {
            "tokens_per_s_median": med,
            "tokens_per_s_min": min(tps),
            "tokens_per_s_max": max(tps),
            "tokens_per_s_all": tps,
            "seconds_per_round": raw[n],
            "params": sum(p.numel() for p in models[n].parameters()),
            "matmul_params": n_matmul[n],
            "flops_per_token": fpt,
            "achieved_tflops": med * fpt / 1e12,
            "mfu": (med * fpt / 1e12 / peak) if peak else None,
        }
    # ratio of medians, and the median of the per-round (paired, same-moment) ratios
    pairs = [("lns", "pre")] + [(n, "hf") for n in names if n != "hf"]
    ratios, paired = {}, {}
    for a, b in pairs:
        if a in results and b in results:
            ratios[f"{a}_over_{b}"] = results[a]["tokens_per_s_median"] / results[b]["tokens_per_s_median"]
            paired[f"{a}_over_{b}"] = statistics.median(tb / ta for ta, tb in zip(raw[a], raw[b]))

    report = {
        "benchmark": "train_throughput",
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "device": name,
        "device_type": device.type,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "depthlab": depthlab.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_count": _cpu_count(),
        "preset": args.preset,
        "model_config": cfg.to_dict(),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps_per_round": args.steps,
        "warmup_steps": args.warmup,
        "repeats": args.repeats,
        "dtype": args.dtype,
        "compile": args.compile,
        "peak_tflops": peak,
        "flops_convention": "PaLM: 6*N_matmul + 12*L*H*head_dim*T per token (non-causal attention count)",
        "results": results,
        "ratios": ratios,
        "paired_ratios_median": paired,
        "loadavg_before_after": [load_before, _loadavg()],
        "goals": {"lns_over_pre": ">= 0.99", "depthlab_over_hf_cpu": ">= 1.1", "mfu_h100_llama-130m_seq1024": ">= 0.45"},
    }
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "results" / f"train_throughput_{device.type}_{args.preset}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"\n{'model':<6} {'tokens/s':>10} {'min':>10} {'max':>10} {'TFLOP/s':>8} {'MFU':>6}")
    for n in names:
        r = results[n]
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{n:<6} {r['tokens_per_s_median']:>10.0f} {r['tokens_per_s_min']:>10.0f} "
              f"{r['tokens_per_s_max']:>10.0f} {r['achieved_tflops']:>8.3f} {mfu:>6}")
    for k, v in ratios.items():
        print(f"{k}: {v:.3f} (ratio of medians), {paired[k]:.3f} (median of per-round ratios)")
    print(f"wrote {out}")
    return report


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001 - informational only
        return None


def _loadavg() -> list[float] | None:
    import os

    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _cpu_count() -> int | None:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    main()
