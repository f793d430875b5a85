"""Runbook (a): set-up, ``pytest -m gpu``, and the MFU levers at ``llama-130m`` and ``llama-1b``, each measured.

On the device machine (budget 300 s, a hard deadline; see benchmarks/gpu/README.md for the call and its carry):
    python3 benchmarks/gpu/a_setup_tests_throughput.py
    python3 benchmarks/gpu/a_setup_tests_throughput.py --stash-only     # loan 2: only keep the corpus part for (b)
Dry run (CI, about a minute on a CPU; toy sizes, eager, pytest only collects):
    python3 benchmarks/gpu/a_setup_tests_throughput.py --device cpu --out /tmp/a

Steps (times: measured on an H200 where stated, else estimates from those measurements):
1. install the carried wheels (``.gpu/wheels``) into /tmp/depthlab-gpu/site (1 s); keep the carried corpus part
   (``.gpu/a/corpus``) in /tmp/depthlab-gpu/stash for call (b) on the same machine (1 s);
2. side by side (about 150 s): ``pytest -m gpu`` in the foreground (108 s on the H200: compile vs eager, bf16,
   fused AdamW, no host sync in a step, diagnose bf16, SDPA flash/cuDNN, a GPU checkpoint resumed on the CPU) and,
   in the background, the cold compiles, one warm-up step each into the shared inductor cache, four processes
   (``CHAINS``; a.json ``compile_s``: each first step; 130M pre compiled cold in 26 s, 1B in 54 s): the default
   path and the levers of one shape each, ``+autotune`` alone (its compile is the long one: left out of step 3
   when it has not finished by then); each process keeps one model at a time (their peaks together: ~125 GB, an
   H200 holds them; on an 80 GB H100 a warm-up that runs out of memory is left out, and a.json says why);
3. ``benchmarks/train_throughput.py`` at ``llama-130m``, seq 1024, batch 128 (the paper's 131,072 tokens a step,
   as call (b) trains), interleaved rounds of every variant step 2 warmed up (``VARIANTS_130M``: the default
   ``pre+bf16+compile`` in micro-batches of 16, chunked cross-entropy, CUDA graphs, max-autotune, foreach AdamW,
   micro-batches of 32 and 64), each paired with the default; then torch.profiler over the default and the
   chunked loss (the shares of matmul, attention, cross-entropy, optimizer, launch gaps; top kernels) (~75 s);
4. the same at ``llama-1b`` (batch 64, micro-batches of 8): the default against its MLP padded from d_ff 5461 (no
   multiple of 8) to 5504, the default profiled (~55 s).
Writes a.json (device, versions, every step's command, exit code and seconds; ``levers``: per size, each lever's
tokens/s over the default's, the fastest variant, MFU, the profile's shares), a.log, pytest.log,
throughput_130m.json, throughput_1b.json. Goals (issue 48): MFU >= 45 % at llama-130m seq 1024, >= 50 % at llama-1b.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import STASH, parse, read_json, start  # noqa: E402

DEFAULT = "pre+bf16+compile"  # the trainer's path on CUDA (compiled, bf16 autocast, fused AdamW, no host sync)
#: step 3's variants: (variant, the warm-up it needs: a variant compiled by a chain, or the one whose graph it reuses)
VARIANTS_130M = [(DEFAULT, DEFAULT), ("pre+bf16+compile+chunkce", None), ("pre+bf16+cudagraphs", None),
                 ("pre+bf16+autotune", None), ("pre+bf16+compile+foreach", DEFAULT), ("pre+bf16+compile+mb32", None),
                 ("pre+bf16+compile+mb64", None), ("pre+bf16+compile+chunkce+mb64", None)]
#: llama-1b's d_ff 5461 is no multiple of 8 (tensor cores want aligned shapes): +dff5504 pads it to 43 x 128 with
#: zero units that stay zero (train_throughput.pad_mlp), its MFU counted on the unpadded FLOPs
VARIANTS_1B = [(DEFAULT, DEFAULT), ("pre+bf16+compile+dff5504", None)]
PROFILE = {"llama-130m": [DEFAULT, "pre+bf16+compile+chunkce"], "llama-1b": [DEFAULT]}
#: the cold compiles of step 2, one process each: (label, preset, variants)
CHAINS = [("130m default+ce+graphs", "llama-130m", [DEFAULT, "pre+bf16+compile+chunkce", "pre+bf16+cudagraphs"]),
          ("130m micro", "llama-130m", ["pre+bf16+compile+mb32", "pre+bf16+compile+mb64", "pre+bf16+compile+chunkce+mb64"]),
          ("130m autotune", "llama-130m", ["pre+bf16+autotune"]),
          ("1b", "llama-1b", [DEFAULT, "pre+bf16+compile+dff5504"])]
CHAIN_CAP_S = 155.0
#: (seq, batch, micro-batch): 130M at the paper's 131,072 tokens a step; 1B at half that (its step takes ~1.2 s)
SHAPES = {"llama-130m": (1024, 128, 16), "llama-1b": (1024, 64, 8)}
DRY_MODEL = ["--preset", "tiny", "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
             "--seq-len", "32", "--batch-size", "4", "--threads", "1", "--matmul-size", "64", "--device", "cpu"]
GOALS = {"llama-130m": 0.45, "llama-1b": 0.50}


def dry(variant: str) -> str:
    """A variant as the dry run measures it: eager (no bf16, compile, graphs or autotune on a 2-block toy), its
    micro-batch scaled down 16x (the toy's batch is 4), a padded MLP padded from the toy's 64 to 72."""
    keep = []
    for part in variant.split("+"):
        if part in ("bf16", "compile", "cudagraphs", "autotune"):
            continue
        if part.startswith("dff"):
            part = "dff72"
        keep.append(f"mb{max(1, int(part[2:]) // 16)}" if part.startswith("mb") and part[2:].isdigit() else part)
    return "+".join(keep)


def names(args, variants: list[str]) -> list[str]:
    return list(dict.fromkeys(dry(v) for v in variants)) if args.dry else list(variants)


def throughput_cmd(args, preset: str, variants: list[str], out: Path, budget_s: float, warm_only: bool = False,
                   profile: list[str] = ()) -> list[str]:
    """benchmarks/train_throughput.py for ``preset`` (dry run: a 2-block toy, eager variants only)."""
    base = [sys.executable, "benchmarks/train_throughput.py", "--out", str(out), "--budget-s", f"{budget_s:.0f}",
            "--variants", ",".join(names(args, variants)), "--baseline", names(args, [DEFAULT])[0]]
    if profile:
        base += ["--profile", ",".join(names(args, profile)), "--profile-steps", "1"]
    rounds = ["--steps", "1", "--warmup", "1", "--repeats", "0" if warm_only else "1"]
    if args.dry:
        return base + DRY_MODEL + ["--micro-batch-size", str(max(1, SHAPES[preset][2] // 16))] + rounds
    if not warm_only:
        rounds = ["--steps", "2", "--warmup", "2", "--repeats", "3"]
    seq, batch, micro = SHAPES[preset]
    return base + ["--preset", preset, "--seq-len", str(seq), "--batch-size", str(batch), "--micro-batch-size",
                   str(micro), "--device", "cuda"] + rounds


def warmed(args, run, chains: list[tuple[str, str, list[str], Path]]) -> dict[str, float | None]:
    """Each chain variant's cold first step (seconds; None: it did not finish), from the chains' JSONs."""
    out = {}
    for _, preset, variants, path in chains:
        results = (read_json(path) or {}).get("results", {})
        for v in variants:
            out[f"{preset} {v}"] = (results.get(dry(v) if args.dry else v) or {}).get("first_step_s")
    return out


def measured_variants(args, preset: str, compile_s: dict) -> list[str]:
    """Step 3/4's variants: those whose compile finished in step 2 (or whose graph another one compiled)."""
    table = VARIANTS_130M if preset == "llama-130m" else VARIANTS_1B
    chained = {v for _, p, vs in CHAINS if p == preset for v in vs}
    return [v for v, needs in table if (compile_s.get(f"{preset} {needs or v}") is not None)
            or (needs is None and v not in chained)]


def levers(args, report: dict | None, preset: str) -> dict | None:
    """Per size: the default's tokens/s and MFU, each lever's tokens/s over the default's (same rounds), the fastest
    variant, and the profile's shares, launch gaps and top kernels."""
    if report is None:
        return None
    default = names(args, [DEFAULT])[0]
    res, ratios = report["results"], report["paired_ratios"]
    measured = {k: r for k, r in res.items() if "tokens_per_s_median" in r}
    fastest = max(measured, key=lambda k: measured[k]["tokens_per_s_median"], default=None)
    keep = ("tokens_per_s_median", "mfu", "of_matmul", "achieved_tflops", "peak_memory_gib", "first_step_s",
            "micro_batch_size", "skipped")
    profile = {k: {f: p.get(f) for f in ("shares", "launch_gap_share", "events_per_step", "time_s_per_step",
                                         "window_s_per_step", "top", "skipped", "error") if f in p}
               for k, p in (report.get("profile") or {}).items()}
    mfu = (measured.get(fastest) or {}).get("mfu")
    return {"device": report["device"], "preset": report["preset"], "seq_len": report["seq_len"],
            "batch_size": report["batch_size"], "rounds": report.get("rounds_done"),
            "matmul_tflops": report["matmul_tflops"], "default": default,
            "over_default": {k[: -len(f"_over_{default}")]: v for k, v in ratios.items() if k.endswith(f"_over_{default}")},
            "fastest": fastest, "fastest_mfu": mfu, "goal_mfu": GOALS[preset],
            "goal_met": None if mfu is None else mfu >= GOALS[preset],
            "variants": {k: {f: r[f] for f in keep if f in r} for k, r in res.items()}, "profile": profile}


def pytest_cmd(args) -> list[str]:
    if args.dry:  # collect only: the GPU tests must be there (and skip without CUDA)
        return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--collect-only", "-p", "no:cacheprovider",
                "tests/train/test_fast_path.py"]
    return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", "tests"]


def stash_corpus_part(args, run) -> None:
    """Keep what this call carries for a later call on the same machine: the corpus part(s) (.gpu/a/corpus/*) for
    call (b), and SmolLM2's first half (.gpu/a/smollm2.part1, ``prepare.py --smollm2``) for the optional call (c)."""
    corpus = args.carry / "a" / "corpus"
    parts = (sorted(corpus.glob("*")) if corpus.is_dir() else []) + sorted((args.carry / "a").glob("smollm2.part1"))
    if parts:
        STASH.mkdir(parents=True, exist_ok=True)
        for part in parts:
            shutil.copy2(part, STASH / part.name)
        run.note(f"kept {', '.join(p.name for p in parts)} in {STASH} for runbook (b) on this machine")
    run.results["kept_for_later_calls"] = [p.name for p in parts]


def compile_and_test(args, run) -> dict:
    """Step 2: the chains in the background, pytest in the foreground; each chain variant's cold first step."""
    chains = [(label, preset, variants, run.work / f"compile-{i}.json") for i, (label, preset, variants) in enumerate(CHAINS)]
    jobs = [run.spawn(f"cold compiles {label} (background)", throughput_cmd(args, preset, variants, path,
                                                                            CHAIN_CAP_S - 5, warm_only=True), CHAIN_CAP_S)
            for label, preset, variants, path in chains]
    if not args.skip_tests:
        run.results["pytest_rc"] = run.sh("pytest -m gpu", pytest_cmd(args), 135, log=args.out / "pytest.log")
    for job in jobs:
        run.join(job)
    return warmed(args, run, chains)


def main(argv: list[str] | None = None) -> int:
    def add(p):
        p.add_argument("--skip-tests", action="store_true", help="skip pytest -m gpu (e.g. on a second attempt)")
        p.add_argument("--stash-only", action="store_true", help="only install the wheels and keep the corpus part "
                       "for call (b) (a loan that runs (b) alone)")

    args = parse("a", __doc__.split("\n\n")[0], argv, add, budget_s=300.0)
    run = start(args, "a")
    stash_corpus_part(args, run)
    if args.stash_only:
        run.finish()
        return 0
    compile_s = run.results["compile_s"] = compile_and_test(args, run)
    run.results["levers"] = {}
    for preset, name in (("llama-130m", "130m"), ("llama-1b", "1b")):
        out = args.out / f"throughput_{name}.json"
        budget = run.left() - 15.0 if name == "1b" else min(90.0, run.left() - 70.0)  # keep >= 55 s for 1B
        variants = measured_variants(args, preset, compile_s)
        run.note(f"{preset}: measuring {', '.join(variants)}")
        cmd = throughput_cmd(args, preset, variants, out, max(budget, 5.0), profile=PROFILE[preset])
        run.sh(f"throughput {preset}", cmd, budget + 15)
        run.results["levers"][name] = levers(args, read_json(out), preset)
    run.note("levers: " + shlex.join(f"{k}: fastest {(v or {}).get('fastest')}" for k, v in run.results["levers"].items()))
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
