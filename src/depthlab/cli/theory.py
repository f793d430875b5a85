"""``depthlab theory``: the paper's variance recursions and an empirical check on random deep models."""

from __future__ import annotations

import argparse

from depthlab.analysis.theory.options import EmpiricalSetup, RecursionParams, TheoryOptions
from depthlab.cli._options import Section, add_config_flag

USAGE = """\
usage examples:
  depthlab theory --depth 1000 --out theory/
  depthlab theory --depth 1000 --out theory/ --empirical-depth 512 --width 128 --seeds 0,1,2,3
  depthlab theory --depth 5000 --out theory/ --no-empirical     # recursions only, instant
  depthlab theory --config theory.yaml --out theory/            # any option below from a YAML/JSON file

Writes theory.json (curves, fitted growth rates, provenance) and theory.png into --out.
Recursions (docs/paper.md §6.8): Pre-LN σ²_{l+1} = σ²_l (1 + c/σ_l), LNS σ²_{l+1} = σ²_l (1 + c/(√l σ_l)),
and the gradient-bound products of Theorems 3.3 / 4.2 with constants A, B.
Empirical: randomly initialised pre and lns models (tiny preset, narrowed), residual variance at
every depth and the RMS gain of ∂y_l/∂x_1 (vector-Jacobian products) at a geometric grid of depths.
"""

#: The flags, each derived from a field of the options (``depthlab.cli._options``): the help is the field's comment.
THEORY = Section("theory", TheoryOptions, title="theory")
RECURSION = Section("recursion", RecursionParams, title="recursion constants")
EMPIRICAL = Section("empirical", EmpiricalSetup, title="empirical check", rename={
    "depth": "empirical_depth", "d_model": "width", "n_heads": "heads", "n_jacobian_depths": "jacobian_depths"})


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "theory", help="variance recursions of the paper + empirical check on random deep models",
        description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="theory", help="output directory (default ./theory)")
    THEORY.add_to(p)
    RECURSION.add_to(p)
    EMPIRICAL.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from depthlab.analysis.theory import run_theory, summary_lines
    from depthlab.base.provenance import command_line

    opts = TheoryOptions(**THEORY.given(args), recursion=RecursionParams(**RECURSION.given(args)),
                         setup=EmpiricalSetup(**EMPIRICAL.given(args)))
    result = run_theory(opts.depth, args.out, opts.recursion, opts.setup if opts.empirical else None,
                        empirical=opts.empirical, command=command_line(args.argv))
    for line in summary_lines(result):
        print(line)
    print(f"wrote {result['paths']['json']}")
    print(f"wrote {result['paths']['figure']}")
    return 0
