"""``depthlab evaluate``: downstream multiple-choice accuracy of a model (the paper's Table 2 side)."""

from __future__ import annotations

import argparse
import shlex
import sys

from depthlab.base.devices import DEVICE_HELP
from depthlab.cli.diagnose import DTYPE_HELP

USAGE = """\
examples:
  depthlab evaluate runs/lns --tasks builtin-mc --out evals/lns
  depthlab evaluate smollm2 --tasks arc_easy.jsonl,piqa.jsonl,boolq.jsonl --limit 200 --out evals/smollm2
  depthlab evaluate runs/lns-sft --tasks builtin-mc --scoring generate --out evals/lns-sft

TARGET as in `depthlab diagnose`: a run dir / checkpoint, preset:NAME, an HF dir, a .gguf, smollm2.
--tasks: comma-separated; a local .jsonl in the native format of ARC, OpenBookQA, PIQA, HellaSwag,
BoolQ, WinoGrande, SIQA (detected from the fields) or {"context", "choices", "answer"}; builtin-mc
(held-out books of the built-in corpus, offline); hf:NAME[:CONFIG[:SPLIT]] (needs the network).

--scoring loglik (default): lm-evaluation-harness's zero-shot multiple choice (same prompts), acc and
acc_norm with standard errors. --scoring generate: LLM-Adapters' generate-and-match (greedy) on the
Commonsense170K-style instruction, through the SFT prompt --template.
Writes eval.json (every number, target, command, versions) and eval.md (the table) into --out.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="multiple-choice accuracy (lm-eval-style or generate-and-match)",
                              description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, preset:NAME, HF dir, .gguf, hub id, smollm2")
    p.add_argument("--tasks", required=True, help="comma-separated: FILE.jsonl, builtin-mc, hf:NAME[:CONFIG[:SPLIT]]")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist or be empty)")
    p.add_argument("--limit", type=int, default=None, help="score the first N items of each task")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--scoring", choices=("loglik", "generate"), default="loglik", help="default loglik (lm-eval)")
    p.add_argument("--template", default="alpaca", help="SFT prompt template for --scoring generate (alpaca, llm-adapters)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="generated tokens for --scoring generate (default 32)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"), help=DTYPE_HELP)
    p.add_argument("--scheme", default=None, help="scheme of a preset:NAME target (default pre); other targets keep "
                   "the scheme they were trained with")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from depthlab.analysis.evaluate import evaluate, load_tasks, markdown_table
    from depthlab.base.errors import DepthlabError
    from depthlab.cli.diagnose import _device_dtype
    from depthlab.data.sft import get_template
    from depthlab.targets import load_target

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DepthlabError(f"output directory {str(out)!r} is not empty; give a new --out directory")
    for name in ("batch_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise DepthlabError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    get_template(args.template)
    tasks = load_tasks(args.tasks, args.limit)  # every task is read and checked before the model loads
    device, dtype = _device_dtype(args)
    target = load_target(args.target, device=device, dtype=dtype, scheme=args.scheme)
    command = "depthlab evaluate " + " ".join(shlex.quote(a) for a in _argv())
    results = evaluate(target, tasks, out=out, limit=args.limit, batch_size=args.batch_size, scoring=args.scoring,
                       template=args.template, max_new_tokens=args.max_new_tokens,
                       progress=not args.no_progress, command=command)  # a bar on a terminal, ETA lines in a log
    print(markdown_table(results), end="")
    print(f"results: {out / 'eval.json'}   (table: {out / 'eval.md'})")
    return 0


def _argv() -> list[str]:
    argv = sys.argv[1:]
    return argv[argv.index("evaluate") + 1:] if "evaluate" in argv else argv
