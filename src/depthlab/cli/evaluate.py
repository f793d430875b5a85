"""``depthlab evaluate``: downstream multiple-choice accuracy of a model (the paper's Table 2 side)."""

from __future__ import annotations

import argparse

from depthlab.analysis.evaluate.options import SCORINGS, EvaluateOptions
from depthlab.base.devices import DEVICE_HELP
from depthlab.cli._args import device_precision, precision_flags, refuse_early
from depthlab.cli._options import Section, add_config_flag
from depthlab.cli.diagnose import AUTO_WEIGHTS

USAGE = """\
examples:
  depthlab evaluate runs/lns --tasks builtin-mc --out evals/lns
  depthlab evaluate smollm2 --tasks arc_easy.jsonl,piqa.jsonl,boolq.jsonl --limit 200 --out evals/smollm2
  depthlab evaluate runs/lns-sft --tasks builtin-mc --scoring generate --out evals/lns-sft
  depthlab evaluate runs/lns --config eval.yaml --out evals/lns     # any option below from a YAML/JSON file
  depthlab evaluate my-vlm/ --tasks builtin-shapes,'mmmu/*/validation-*.parquet' --out evals/vlm

TARGET as in `depthlab diagnose`: a run dir / checkpoint, preset:NAME, an HF dir, a .gguf, smollm2.
--tasks: comma-separated; a local .jsonl in the native format of ARC, OpenBookQA, PIQA, HellaSwag,
BoolQ, WinoGrande, SIQA (detected from the fields) or {"context", "choices", "answer"}; builtin-mc
(held-out books of the built-in corpus, offline); hf:NAME[:CONFIG[:SPLIT]] (needs the network).
Image-text multiple choice (an image-text-to-text TARGET directory, e.g. LLaVA, Qwen2.5-VL, SmolVLM):
builtin-shapes (offline); MMMU's parquet files as downloaded ('mmmu/*/validation-*.parquet', quoted) or a
.jsonl of {"question", "options", "answer", "image" | "images" | "image_1".."image_7"}.

--scoring loglik (default): lm-evaluation-harness's zero-shot multiple choice (same prompts), acc and
acc_norm with standard errors. --scoring generate: LLM-Adapters' generate-and-match (greedy) on the
Commonsense170K-style instruction, through the SFT prompt --template.
Writes eval.json (every number, target, command, versions) and eval.md (the table) into --out.
"""

#: Every EvaluateOptions field is a flag (``depthlab.cli._options``); its help is the field's comment.
EVALUATE = Section("evaluate", EvaluateOptions, choices={"scoring": SCORINGS})


def register(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="multiple-choice accuracy (lm-eval-style or generate-and-match)",
                              description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, preset:NAME, HF dir, .gguf, hub id, smollm2")
    p.add_argument("--out", metavar="DIR", help="output directory (required; must not exist or be empty)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    precision_flags(p, AUTO_WEIGHTS)
    p.add_argument("--scheme", default=None, help="scheme of a preset:NAME target (default pre); other targets keep "
                   "the scheme they were trained with")
    EVALUATE.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    refuse_early(args.target, "diagnose")  # what config.json alone refuses (its blocks), before torch is imported
    from depthlab.analysis.evaluate import evaluate, load_tasks, markdown_table
    from depthlab.analysis.evaluate.image_model import image_text_config, load_image_text, refuse_image_tasks
    from depthlab.base.errors import DepthlabError
    from depthlab.base.fileio import fresh_out
    from depthlab.base.provenance import command_line
    from depthlab.data.sft import get_template
    from depthlab.targets import load_target

    if not args.out:
        raise DepthlabError("give --out DIR for eval.json and eval.md")
    out = fresh_out(args.out)
    opts = EvaluateOptions(**EVALUATE.given(args))
    opts.validate()
    get_template(opts.template)
    tasks = load_tasks(opts.tasks, opts.limit)  # every task is read and checked before the model loads
    device, weights, compute = device_precision(args)
    if image_text_config(args.target) is not None:  # an image-text-to-text wrapper: the model and its processor
        from depthlab.data.image_tasks import ImageTask
        from depthlab.hf.processors import check_image_token

        if any(isinstance(t, ImageTask) for t in tasks):  # before the load: the processor's image token is the model's
            check_image_token(args.target)
        target, processor = load_image_text(args.target, device=device, dtype=weights)
    else:
        refuse_image_tasks(tasks, args.target)
        target = load_target(args.target, device=device, dtype=weights, compute_dtype=compute, scheme=args.scheme)
        processor = None
    results = evaluate(target, tasks, out=out, **opts.scoring_kwargs(), progress=opts.progress,
                       command=command_line(args.argv), processor=processor)
    print(markdown_table(results), end="")
    print(f"results: {out / 'eval.json'}   (table: {out / 'eval.md'})")
    return 0
