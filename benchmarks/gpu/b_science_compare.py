"""Runbook (b): the science run: ``compare --schemes pre,lns`` with depth tracking on the long corpus, in a regime.

On the device machine (budget 430 s, a hard deadline: at most ~7.5 minutes with the transfers; see
benchmarks/gpu/README.md for the call and its carry):
    python3 benchmarks/gpu/b_science_compare.py
Dry run (CI, seconds on a CPU: a 2-block model, 3 steps on the built-in corpus):
    python3 benchmarks/gpu/b_science_compare.py --device cpu --out /tmp/b

The regime is three flags (issue 47: depth use depends on it; the paper's group reports more use of the deep layers
at weight decay 0.1 than 0 and at sequences of 2048 than 256, arXiv 2603.15389): ``--weight-decay`` (default 0.1),
``--seq-len`` (default 1024) and ``--optimizer`` (adamw, the default: decoupled decay; adam; muon). The batch keeps
the paper's 131,072 tokens a step whatever the sequence length (``--batch-size`` default 131,072 / seq len: 128
sequences at 1024, the paper's 512 at 256), in micro-batches of 16,384 tokens; b.json's plan records the regime.

What it runs: ``llama-130m`` (the paper's 130M shape; the vocabulary of the corpus's tokenizer, bpe:16384), pre and
lns side by side on the one GPU (``compare --jobs 2``: their compiles, evaluations and diagnoses overlap, and each
fills the other's idle moments), bf16 autocast, compiled, the paper's batch in tokens (above), depth tracking on
(angular distance, contribution, norm gain and variance at 20 probes; the removal sweep at every 4th), then each
run's diagnosis at the paper's 262,144 tokens (on the GPU, fp32 weights) and the report.
The number of steps is fixed before training: ``--train-s`` (default: ``--budget-s`` less 130 s, i.e. 300) x
``--tokens-per-s`` per run side by side (default 180,000: the H200's 455,000 tokens/s of one compiled llama-130m
run at seq 256 and 448,000 at seq 1024 (2026-11-26), halved, less a fifth for the probes, evaluations and the two
processes taking turns; pass half of what call (a) measured for ``lns+bf16+compile``, less a fifth) / 131,072 tokens
a step. Expected: ~410 steps, ~54M tokens per scheme, 1.5 epochs of the whole corpus (35.4M training tokens), 2.1 of
the first part alone. If training outruns the budget anyway, the compare is stopped at the deadline and the
depth-tracking series written so far still come back.

The corpus: ``.gpu/b/corpus`` holds the tokenizer, the held-out split and training part 0 (48 MiB, 25.2M tokens);
part 1 (19.5 MiB, 10.2M tokens) came with call (a) and waits in /tmp/depthlab-gpu/stash when the machine stayed
warm. Both are put together in /tmp/depthlab-gpu/corpus (checksums checked); without part 1 the corpus is part 0
alone, and b.json says so. Writes b.json (the plan: preset, steps, tokens per scheme, the corpus's training tokens
and the epochs; each run's tokens/s, MFU and compile seconds; the compare's summary; every step's command, exit
code and seconds), b.log, and b-results.tar.gz (the compare directory without checkpoints: summary.md, report.html,
figures, each run's config.json, metrics.jsonl, summary.json and diagnosis).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, SITE, STASH, parse, read_json, start  # noqa: E402

CORPUS = Path("/tmp/depthlab-gpu/corpus")  # the carried parts and the stashed one, put together here
H200_BF16_PEAK = 989.4e12  # dense bf16 FLOP/s of an H100 SXM / H200 (benchmarks/train_throughput.py PEAK_TFLOPS)
#: What the call spends besides training (estimated from the H200's measurements): start-up and data 15 s, the two
#: compiles side by side 40 s, evaluations and probes 15 s, the two diagnoses at 262,144 tokens 30 s, the report 15 s,
#: packing 5 s, and a margin.
OVERHEAD_S = 130.0
DRY_MODEL = ["--set", "n_layers=2", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64"]
STEP_TOKENS = 512 * 256  # the paper's batch in tokens, kept at every sequence length
MICRO_TOKENS = 64 * 256  # tokens per micro-batch (64 sequences of 256 fit an H100 at llama-130m)


def assemble_corpus(carried: Path, stash: Path, dest: Path) -> dict:
    """The carried shard directory plus any training part waiting in ``stash`` (sha256 as shards.json records), as
    links in ``dest`` with a shards.json listing exactly the parts present. Returns what it found."""
    meta = json.loads((carried / "shards.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        old.unlink()
    (dest / "tokenizer").symlink_to(carried / "tokenizer")
    present, missing = {"train": [], "val": []}, []
    for split in ("train", "val"):
        for part in meta["parts"][split]:
            found = next((p for p in (carried / part["file"], stash / part["file"]) if p.is_file()), None)
            if found is None or (found.parent == stash and sha256(found) != part["sha256"]):
                missing.append(part["file"])
                continue
            (dest / part["file"]).symlink_to(found.resolve())
            present[split].append(part)
    if not present["train"] or not present["val"]:
        raise SystemExit(f"the carried corpus lacks a split (missing {missing})")
    full_tokens = meta["train_tokens"]
    meta["parts"], meta["train_tokens"] = present, sum(p["tokens"] for p in present["train"])
    (dest / "shards.json").write_text(json.dumps(meta, indent=1) + "\n")
    return {"train_parts": [p["file"] for p in present["train"]], "missing": missing,
            "train_tokens": meta["train_tokens"], "whole_corpus_train_tokens": full_tokens}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def plan(args) -> dict:
    """Steps and tokens per scheme from the training time and the throughput estimate (see the docstring)."""
    regime = {"weight_decay": args.weight_decay, "seq_len": args.seq_len, "optimizer": args.optimizer}
    if args.dry:
        return {"preset": "tiny", "seq_len": 32, "batch_size": 2, "micro_batch_size": 2, "steps": 3,
                "tokens_per_scheme": 3 * 2 * 32, "estimate": "dry run", "regime": {**regime, "seq_len": 32}}
    import depthlab
    from depthlab.models.decoder import num_params

    cfg = depthlab.from_preset(args.preset, vocab_size=vocab_of(args.data) or depthlab.from_preset(args.preset).vocab_size)
    n_matmul = num_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)
    flops = 6.0 * n_matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.dim_head * args.seq_len
    step_tokens = args.batch_size * args.seq_len
    steps = max(10, int(args.train_s * args.tokens_per_s / step_tokens))
    return {"preset": args.preset, "vocab_size": cfg.vocab_size, "seq_len": args.seq_len, "batch_size": args.batch_size,
            "micro_batch_size": args.micro_batch_size, "steps": steps, "tokens_per_scheme": steps * step_tokens,
            "regime": regime,
            "flops_per_token": flops, "estimate": f"{args.tokens_per_s:,.0f} tokens/s per run side by side "
            f"({2 * args.tokens_per_s * flops / H200_BF16_PEAK:.0%} MFU for the two) x {args.train_s:.0f} s"}


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
           "--weight-decay", str(args.weight_decay), "--optimizer", args.optimizer, "--ckpt-every", "0", "--out", str(out)]
    if args.dry:
        return cmd + DRY_MODEL + ["--tokenizer", "bytes", "--device", "cpu", "--dtype", "fp32", "--eval-tokens",
                                  "256", "--diag-tokens", "256", "--diag-seq-len", "32", "--no-jacobian"]
    return cmd + ["--device", "cuda", "--dtype", "bf16", "--compile", "--jobs", "2", "--eval-tokens", "1048576",
                  "--diag-tokens", "262144", "--no-jacobian"]


def runs_measured(cmp_dir: Path, flops_per_token: float | None) -> dict:
    """Each run's training numbers from its summary.json: tokens, wall, tokens/s of the steps, MFU, compile."""
    out = {}
    for run in sorted((cmp_dir / "runs").glob("*")):
        s = read_json(run / "summary.json")
        if s is None:  # stopped before its end: the last train line of its metrics
            lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()] \
                if (run / "metrics.jsonl").is_file() else []
            train = [ln for ln in lines if "loss" in ln and "tokens" in ln]
            out[run.name] = {"finished": False, "last_step": train[-1]["step"] if train else None,
                             "tokens": train[-1]["tokens"] if train else 0}
            continue
        rate = s.get("step_tokens_per_s")
        out[run.name] = {"finished": True, "tokens": s["tokens"], "wall_s": s["wall_s"], "step_tokens_per_s": rate,
                         "compile_s": s.get("compile_s"), "eval_loss": s.get("eval_loss"),
                         "mfu_side_by_side": rate * flops_per_token / H200_BF16_PEAK if rate and flops_per_token else None}
    return out


def pack(cmp_dir: Path, dest: Path) -> None:
    """The compare directory without checkpoints (and tokenizer copies) as one tar.gz."""
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(cmp_dir.rglob("*")):
            rel = path.relative_to(cmp_dir)
            if path.is_file() and not {"checkpoint", "tokenizer"} & set(rel.parts):
                tar.add(path, arcname=str(Path("compare") / rel))


def add_flags(p) -> None:
    """The script's own flags (besides common.parse's)."""
    p.add_argument("--data", default=None, help="training corpus (default: the carried open-english shards, "
                   "assembled in /tmp/depthlab-gpu/corpus; else builtin)")
    p.add_argument("--preset", default="llama-130m", help="model shape (default llama-130m)")
    p.add_argument("--train-s", type=float, default=None, help=f"training seconds of the side-by-side runs (default: "
                   f"--budget-s less {OVERHEAD_S:.0f} s for start-up, compiles, evaluations, diagnoses and the report)")
    p.add_argument("--tokens-per-s", type=float, default=180_000.0, help="expected tokens/s of each run side by side")
    p.add_argument("--weight-decay", type=float, default=0.1, help="the regime's weight decay (default 0.1)")
    p.add_argument("--seq-len", type=int, default=1024, help="the regime's sequence length (default 1024)")
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "adam", "muon"),
                   help="the regime's optimizer (default adamw: decoupled weight decay)")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"global batch in sequences (default {STEP_TOKENS:,} tokens / --seq-len: the paper's 512 x 256)")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help=f"sequences per micro-batch (default {MICRO_TOKENS:,} tokens / --seq-len)")


def parse_args(argv: list[str] | None):
    """The flags, with the batch (in sequences) and the micro-batch defaulted from the sequence length."""
    args = parse("b", __doc__.split("\n\n")[0], argv, add_flags, budget_s=430.0)
    args.batch_size = args.batch_size or max(1, STEP_TOKENS // args.seq_len)
    args.micro_batch_size = args.micro_batch_size or max(1, min(args.batch_size, MICRO_TOKENS // args.seq_len))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.train_s = args.train_s if args.train_s is not None else max(30.0, args.budget_s - OVERHEAD_S)
    sys.path[:0] = [str(REPO / "src"), str(SITE)]
    run = start(args, "b")
    carried = args.carry / "b" / "corpus"  # prepare.py: tokenizer, held-out split, training part 0
    if args.data is None and not args.dry and (carried / "shards.json").is_file():
        run.results["corpus_assembled"] = assemble_corpus(carried, STASH, CORPUS)
        run.note(f"corpus: {run.results['corpus_assembled']}")
        args.data = str(CORPUS)
    args.data = args.data or "builtin"
    run.results["plan"] = p = plan(args)
    run.results["data"] = args.data
    cmp_dir = run.work / "compare"
    run.note(f"regime: {p['regime']}")
    run.sh("compare pre,lns", compare_cmd(args, p, cmp_dir), args.budget_s)
    run.results["compare_summary"] = read_json(cmp_dir / "summary.json")
    run.results["runs"] = runs_measured(cmp_dir, p.get("flops_per_token"))
    try:
        run.results["corpus"] = epochs(args.data, cmp_dir, p["tokens_per_scheme"])
    except Exception as err:  # noqa: BLE001 - the results above still go back
        run.results["corpus"] = {"error": f"{type(err).__name__}: {err}"}
    if cmp_dir.is_dir():
        pack(cmp_dir, args.out / "b-results.tar.gz")
    run.finish()
    return 0 if all(s["rc"] == 0 for s in run.steps) else 1


def epochs(data: str, cmp_dir: Path, tokens_per_scheme: int) -> dict:
    """The corpus's training tokens as the runs saw them (the trainer's own sequences) and the epochs trained."""
    from depthlab.data import load_sequences, load_tokenizer

    run = next((p for p in sorted((cmp_dir / "runs").glob("*")) if (p / "config.json").is_file()), None)
    if run is None:
        return {"train_tokens": None, "epochs": None}
    t = json.loads((run / "config.json").read_text())["train"]
    seqs = load_sequences(t["data"], load_tokenizer(run / "tokenizer"), t["seq_len"], split="train", pack=t["pack"],
                          seed=t["seed"], text_field=t["text_field"], cache_dir=t["cache_dir"])
    train_tokens = len(seqs) * t["seq_len"]
    return {"train_tokens": train_tokens, "epochs": tokens_per_scheme / train_tokens}


if __name__ == "__main__":
    sys.exit(main())
