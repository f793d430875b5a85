"""``depthlab prune``: remove blocks from a model, optionally heal it, and write a Hugging Face
checkpoint that plain ``transformers`` loads (plus a report)."""

from __future__ import annotations

import argparse

from depthlab.base.devices import DEVICE_HELP
from depthlab.cli._args import device_precision, precision_flags, refuse_early
from depthlab.cli._options import Section, add_config_flag
from depthlab.prune.options import EXPERT_METHODS, HEAL_MODES, LINEAR_FORMS, METHODS, HealOptions, PruneOptions

USAGE = """\
examples:
  depthlab prune smollm2 --remove 6 --method removal --out pruned/smollm2-24
  depthlab prune smollm2 --budget 0.5 --out pruned/smollm2-budget          # the most blocks within +0.5 nats
  depthlab prune path/to/hf-model --remove 8 --method angular-block --heal-steps 500 --data my.txt --out pruned/x
  depthlab prune runs/lns --remove 4 --out pruned/lns-12
  depthlab prune big/8b --remove 8 --stream --heal lora --heal-steps 20 --heal-batch-size 1 --out pruned/8b-24
  depthlab prune runs/lns --blocks 13,14,15 --out pruned/lns-own
  depthlab train --init-from pruned/lns-12/run --data builtin --steps 500 --out runs/lns-12   # continue training it

Methods: removal (greedy, SLEB-style: drop the block whose removal costs least on held-out text,
re-measure, repeat), angular-block (Gromov et al. 2024: the contiguous run of n blocks whose input
and output are closest in angle), influence (ShortGPT's Block Influence, 1 - cos of block input and
output). Block numbers are 1-based, in the numbering of the model given.

Writes into --out (new or empty): the HF checkpoint (config.json, model.safetensors, tokenizer files),
prune.json, angular_*.png, report.html; for a depthlab run also run/, a depthlab run directory.
The export is checked: reloaded with AutoModelForCausalLM, its logits are compared with the in-memory
pruned model (max |Δ| printed) and generate runs with the KV cache.
Cost: angular-block and influence need one pass over --tokens; greedy removal tries every remaining
block at each step (about L/2 forward passes per step; SmolLM2, 2,048 tokens, one thread of a busy
2-core CPU: ~5 min a step), so lower --tokens for it on a CPU.
"""


#: Every PruneOptions / HealOptions field is a flag (``depthlab.cli._options``); its help is the field's comment.
PRUNE = Section("prune", PruneOptions, exclude=("heal",), choices={"method": METHODS + EXPERT_METHODS})
#: What --weights auto means here: healing trains the weights, so they stay fp32 unless asked.
AUTO_WEIGHTS = "fp32 (full healing trains them); bf16 with --heal lora (the frozen base)"
HEAL = Section("heal", HealOptions, prefix="heal-", exclude=("data", "seq_len", "progress"), rename={"mode": "heal"},
               choices={"mode": HEAL_MODES, "linear": LINEAR_FORMS}, title="healing")


def register(subparsers) -> None:
    p = subparsers.add_parser("prune", help="remove blocks (chosen by a diagnosis), heal, export a smaller HF model",
                              description=__doc__ + "\n\n" + USAGE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, HF dir, .gguf, hub id, smollm2")
    p.add_argument("--out", help="output directory (must not exist or be empty)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    precision_flags(p, AUTO_WEIGHTS)
    PRUNE.add_to(p)
    HEAL.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Parse -> the library's checks and opening (depthlab.prune.dispatch.CHECKS) -> the plan line -> the library's
    run, which writes the checkpoint and report -> what was written and checked."""
    from pathlib import Path

    from depthlab.base.errors import DepthlabError

    given = PRUNE.given(args)
    progress = given.pop("progress", True)  # a bar on a terminal, ETA log lines otherwise (depthlab.base.progress)
    base = PruneOptions()
    heal = HealOptions(**{"data": given.get("data", base.data), "seq_len": given.get("seq_len", base.seq_len),
                          **HEAL.given(args), "progress": progress})
    opts = PruneOptions(**given, heal=heal, progress=progress)
    opts.validate()  # the values alone, before torch is imported: as fast as a bad flag
    if not args.out:
        raise DepthlabError("give --out DIR for the pruned checkpoint")
    refuse_early(args.target, "prune", opts)  # what config.json alone refuses, before torch is imported
    from depthlab.base.provenance import command_line
    from depthlab.prune import dispatch
    from depthlab.targets.frame import Request, checked

    lora = heal.mode == "lora" and heal.steps > 0  # the base stays frozen: bf16 weights hold it in half the memory
    device, weights, compute = device_precision(args, "bf16" if lora else "fp32")
    out = Path(args.out)
    request = Request(args.target, opts, out, device, weights, compute, progress=None if progress else False,
                      command=command_line(args.argv), asked=frozenset(given))
    with checked(request, dispatch.CHECKS) as target:
        print(f"prune on {device.type}: engine: {target.plan.line}", flush=True)  # once every check has passed
        report = dispatch.run(request, target)
    _said(report, target, out)
    return 0


def _said(report: dict, target, out) -> None:
    """The summary, the export check and where the checkpoint is."""
    exp = report["export"]
    print(report.get("summary") or "")
    cached = exp["generate_cache_matches_no_cache"]
    versus = ("the healed model in memory" if report.get("heal") else "the original with those blocks skipped"
              ) + ", streamed" if target.plan.streamed else "in-memory pruned"
    generate = "not checked (too big to load)" if cached is None else "ok" if cached else "DIFFERS from no cache"
    diff = exp["max_abs_logit_diff"]  # None: not finite (json_safe)
    print(f"export check: max |Δ logit| = {'not finite' if diff is None else format(diff, '.3e')} (reloaded vs {versus}), "
          f"generate with KV cache {generate}")
    auto = "AutoModelForImageTextToText" if "ImageTextToText" in str(exp.get("loaded_with", "")) else "AutoModelForCausalLM"
    print(f"wrote {out}: {auto}.from_pretrained({str(out)!r}) loads it; report: {out / 'report.html'}")
    if report.get("run_dir"):
        print(f"depthlab run directory: {report['run_dir']} (depthlab diagnose / depthlab train --init-from accept it)")
