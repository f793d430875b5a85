"""Runbook (b): the science run: ``compare --schemes pre,lns`` with depth tracking on the long corpus.

On the device machine (about 9.5 minutes on an H100; see benchmarks/gpu/README.md for the call and its carry):
    python3 benchmarks/gpu/b_science_compare.py --data .gpu/b/corpus
Dry run (CI, seconds on a CPU: a 2-block model, 3 steps on the built-in corpus):
    python3 benchmarks/gpu/b_science_compare.py --device cpu --out /tmp/b

What it runs: both schemes side by side on the one GPU (``compare --jobs 2``), each for about ``--minutes`` of
wall time (default 7: with compilation, the final evaluation, the diagnosis and the report, the call ends
within 10 minutes), bf16 autocast, compiled, depth tracking on (angular distance, contribution, norm gain,
variance at 20 probes; the removal sweep every 4th probe). The token budget is fixed before training from a
throughput estimate: tokens/s per run = ``--mfu`` x the GPU's bf16 peak / FLOPs per token (PaLM's count, as
benchmarks/train_throughput.py) / 2 runs; steps = budget tokens / (batch x seq_len). Pass the MFU that (a)
measured for ``lns+bf16+compile`` (a little lower: evaluation and probes cost time) to size it to the device.
If training outruns the budget anyway, the compare is stopped at the deadline and what the runs wrote so far
(their depth-tracking series) still comes back.

Default shape: ``llama-250m`` (24 blocks of width 768: the paper's depth at the widest size whose 7 minutes
still give ~45M tokens per scheme, ~2 epochs of a 20M-token corpus; ``llama-130m`` would repeat the corpus
~5 times, ``llama-350m`` gets ~30M tokens). Writes b.json (the plan: preset, steps, tokens per scheme, the
corpus's training tokens and the epochs; the compare's summary.json; every step's command, exit code and
seconds), b.log, and b-results.tar.gz (the compare directory without checkpoints: summary.md, report.html,
figures, each run's config.json, metrics.jsonl, summary.json and diagnosis).
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SITE, parse, read_json, start  # noqa: E402

#: The long corpus as prepare.py copies it for this call (open-english's token shards, as many training parts as
#: one 64 MiB transfer carries); the built-in corpus when it is not there (the CPU dry run).
PREPARED_CORPUS = REPO / ".gpu" / "b" / "corpus"
DEFAULT_DATA = str(PREPARED_CORPUS) if (PREPARED_CORPUS / "shards.json").is_file() else "builtin"
H100_BF16_PEAK = 989.4e12  # dense bf16 FLOP/s of an H100 SXM (benchmarks/train_throughput.py PEAK_TFLOPS)
DRY_MODEL = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64"]


def plan(args) -> dict:
    """Steps and tokens per scheme from the time budget and the throughput estimate (see the docstring)."""
    if args.dry:
        return {"preset": "tiny", "seq_len": 32, "batch_size": 2, "micro_batch_size": 2, "steps": 3,
                "tokens_per_scheme": 3 * 2 * 32, "estimate": "dry run"}
    import depthlab
    from depthlab.models.decoder import num_params

    cfg = depthlab.from_preset(args.preset, vocab_size=vocab_of(args.data) or depthlab.from_preset(args.preset).vocab_size)
    n_matmul = num_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)
    flops = 6.0 * n_matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.dim_head * args.seq_len
    per_run = args.mfu * args.peak_tflops * 1e12 / flops / 2
    steps = max(10, int(args.minutes * 60 * per_run / (args.batch_size * args.seq_len)))
    return {"preset": args.preset, "seq_len": args.seq_len, "batch_size": args.batch_size,
            "micro_batch_size": args.micro_batch_size, "steps": steps,
            "tokens_per_scheme": steps * args.batch_size * args.seq_len, "flops_per_token": flops,
            "estimate": f"{per_run:,.0f} tokens/s per run = {args.mfu} MFU x {args.peak_tflops} TFLOP/s / "
                        f"{flops / 1e9:.2f} GFLOP per token / 2 runs side by side"}


def vocab_of(data: str) -> int | None:
    """The vocabulary of a token-shard directory's tokenizer (None for other data specs)."""
    from depthlab.data import is_shard_dir, load_tokenizer

    if not is_shard_dir(data):
        return None
    return load_tokenizer(Path(data).expanduser() / "tokenizer").vocab_size


def compare_cmd(args, p: dict, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "depthlab", "compare", "--schemes", "pre,lns", "--preset", p["preset"],
           "--data", args.data, "--steps", str(p["steps"]), "--seq-len", str(p["seq_len"]), "--batch-size",
           str(p["batch_size"]), "--micro-batch-size", str(p["micro_batch_size"]), "--track-depth", "--track-removal",
           "--ckpt-every", "0", "--out", str(out)]
    if args.dry:
        return cmd + DRY_MODEL + ["--tokenizer", "bytes", "--device", "cpu", "--dtype", "fp32", "--eval-tokens",
                                  "256", "--diag-tokens", "256", "--diag-seq-len", "32", "--no-jacobian"]
    return cmd + ["--device", "cuda", "--dtype", "bf16", "--compile", "--jobs", "2", "--eval-tokens", "1048576",
                  "--diag-tokens", "262144", "--no-jacobian"]


def epochs(data: str, cmp_dir: Path, tokens_per_scheme: int) -> dict:
    """The corpus's training tokens as the runs saw them (the trainer's own sequences) and the epochs trained."""
    import json

    from depthlab.data import load_sequences, load_tokenizer

    run = next((p for p in sorted((cmp_dir / "runs").glob("*")) if (p / "config.json").is_file()), None)
    if run is None:
        return {"train_tokens": None, "epochs": None}
    t = json.loads((run / "config.json").read_text())["train"]
    seqs = load_sequences(t["data"], load_tokenizer(run / "tokenizer"), t["seq_len"], split="train", pack=t["pack"],
                          seed=t["seed"], text_field=t["text_field"], cache_dir=t["cache_dir"])
    train_tokens = len(seqs) * t["seq_len"]
    return {"train_tokens": train_tokens, "epochs": tokens_per_scheme / train_tokens}


def pack(cmp_dir: Path, dest: Path) -> None:
    """The compare directory without checkpoints (and tokenizer copies) as one tar.gz."""
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(cmp_dir.rglob("*")):
            rel = path.relative_to(cmp_dir)
            if path.is_file() and not {"checkpoint", "tokenizer"} & set(rel.parts):
                tar.add(path, arcname=str(Path("compare") / rel))


def main(argv: list[str] | None = None) -> int:
    def add(p):
        p.add_argument("--data", default=DEFAULT_DATA, help="training corpus (default: .gpu/b/corpus, the open-english "
                       "shards prepare.py copied; else builtin)")
        p.add_argument("--preset", default="llama-250m", help="model shape (default llama-250m)")
        p.add_argument("--minutes", type=float, default=7.0, help="training wall time per scheme (side by side)")
        p.add_argument("--mfu", type=float, default=0.30, help="expected MFU of each run's training (default 0.30)")
        p.add_argument("--peak-tflops", type=float, default=H100_BF16_PEAK / 1e12, help="GPU bf16 peak (H100 SXM)")
        p.add_argument("--seq-len", type=int, default=256)
        p.add_argument("--batch-size", type=int, default=512, help="global batch in sequences (paper: 512)")
        p.add_argument("--micro-batch-size", type=int, default=64)

    args = parse("b", __doc__.split("\n\n")[0], argv, add)
    sys.path[:0] = [str(REPO / "src"), str(SITE)]
    run = start(args, "b")
    run.results["plan"] = p = plan(args)
    run.results["data"] = args.data
    cmp_dir = run.work / "compare"
    run.sh("compare pre,lns", compare_cmd(args, p, cmp_dir), args.budget_s)
    run.results["compare_summary"] = read_json(cmp_dir / "summary.json")
    try:
        run.results["corpus"] = epochs(args.data, cmp_dir, p["tokens_per_scheme"])
    except Exception as err:  # noqa: BLE001 - the results above still go back
        run.results["corpus"] = {"error": f"{type(err).__name__}: {err}"}
    if cmp_dir.is_dir():
        pack(cmp_dir, args.out / "b-results.tar.gz")
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
