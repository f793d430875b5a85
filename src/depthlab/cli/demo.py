"""``depthlab demo``: Pre-LN vs LNS on the built-in corpus with the tiny preset, on a CPU."""

from __future__ import annotations

import argparse
import os

from depthlab.base.provenance import command_line
from depthlab.cli.compare import add_compare_arguments, build_config, run_and_print

#: Sized to finish within 2 minutes on 2 CPU cores (AMD EPYC or Intel), cold cache, tokenizer training, two
#: runs and their diagnoses included (profiled and measured: README, "The demo"): 64 steps of 8 x 128 tokens
#: (the training steps are two thirds of the time), a depth probe every 8 steps, short held-out evaluations.
DEMO_STEPS = 64
DEMO_BATCH = 8
DEMO_EVAL_TOKENS = 4096
DEMO_DIAG_TOKENS = 2048
DEMO_PROBE_EVERY = 8
DEMO_JOBS = min(2, os.cpu_count() or 1)  # the two runs side by side, one core each

USAGE = f"""\
examples:
  depthlab demo                         # pre vs lns, tiny preset, built-in corpus, {DEMO_STEPS} steps each
  depthlab demo --out my-demo --steps 600

It is `depthlab compare --schemes pre,lns --preset tiny --data builtin --steps {DEMO_STEPS}
--batch-size {DEMO_BATCH} --eval-tokens {DEMO_EVAL_TOKENS} --diag-tokens {DEMO_DIAG_TOKENS}
--variance-every {DEMO_PROBE_EVERY} --jobs {DEMO_JOBS}`: the table
prints at the end, whatever it shows, and report.html holds the figures. Running it again reuses the
finished runs.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="pre vs lns on the built-in corpus (tiny preset, CPU, under 2 minutes)",
                              description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compare_arguments(p)
    p.set_defaults(func=main, out="depthlab-demo", **{
        "compare.schemes": ["pre", "lns"], "compare.preset": "tiny", "compare.jobs": DEMO_JOBS,
        "train.steps": DEMO_STEPS, "train.batch_size": DEMO_BATCH, "train.eval_tokens": DEMO_EVAL_TOKENS,
        "train.variance_every": DEMO_PROBE_EVERY, "diagnose.tokens": DEMO_DIAG_TOKENS})


def main(args) -> int:
    return run_and_print(build_config(args), args.out, command_line(args.argv))
