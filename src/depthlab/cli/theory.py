"""``depthlab theory``: the paper's variance recursions and an empirical check on random deep models."""

from __future__ import annotations

import argparse

USAGE = """\
usage examples:
  depthlab theory --depth 1000 --out theory/
  depthlab theory --depth 1000 --out theory/ --empirical-depth 512 --width 128 --seeds 0,1,2,3
  depthlab theory --depth 5000 --out theory/ --no-empirical     # recursions only, instant

Writes theory.json (curves, fitted growth rates, provenance) and theory.png into --out.
Recursions (docs/paper.md §6.8): Pre-LN σ²_{l+1} = σ²_l (1 + c/σ_l), LNS σ²_{l+1} = σ²_l (1 + c/(√l σ_l)),
and the gradient-bound products of Theorems 3.3 / 4.2 with constants A, B.
Empirical: randomly initialised pre and lns models (tiny preset, narrowed), residual variance at
every depth and the RMS gain of ∂y_l/∂x_1 (vector-Jacobian products) at a geometric grid of depths.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "theory", help="variance recursions of the paper + empirical check on random deep models",
        description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--depth", type=int, default=1000, help="depth to iterate the recursions to (>= 2; default 1000)")
    p.add_argument("--out", default="theory", help="output directory (default ./theory)")
    g = p.add_argument_group("recursion constants")
    g.add_argument("--c", type=float, default=1.0, help="branch constant c of Θ(1 + c/σ) (default 1)")
    g.add_argument("--sigma1-sq", type=float, default=1.0, help="σ²_1, variance entering block 1 (default 1)")
    g.add_argument("--A", type=float, default=1.0, dest="A", help="first-order constant of the gradient bound")
    g.add_argument("--B", type=float, default=1.0, dest="B", help="second-order constant of the gradient bound")
    e = p.add_argument_group("empirical check")
    e.add_argument("--no-empirical", action="store_true", help="skip the model measurements")
    e.add_argument("--empirical-depth", type=int, default=256,
                   help="layers of the random models at most; as many as --depth when fewer (default 256)")
    e.add_argument("--width", type=int, default=64, help="d_model of the random models (default 64)")
    e.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    e.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default 64)")
    e.add_argument("--batch-size", type=int, default=2, help="sequences (default 2)")
    e.add_argument("--seeds", default="0,1,2", help="comma list of init seeds (default 0,1,2)")
    e.add_argument("--init-std", type=float, default=0.02, help="weight init std (default 0.02, the paper's)")
    p.set_defaults(func=run)


def _seeds(text: str) -> list[int]:
    from depthlab.base.errors import DepthlabError

    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise DepthlabError(f"--seeds must be a comma list of integers, got {text!r}") from None
    if not seeds:
        raise DepthlabError(f"--seeds must list at least one integer, got {text!r}")
    return seeds


def run(args: argparse.Namespace) -> int:
    from depthlab.analysis.theory import EmpiricalSetup, RecursionParams, run_theory, summary_lines
    from depthlab.base.provenance import command_line

    params = RecursionParams(c=args.c, sigma1_sq=args.sigma1_sq, A=args.A, B=args.B)
    setup = None if args.no_empirical else EmpiricalSetup(
        depth=args.empirical_depth, d_model=args.width, n_heads=args.heads, seq_len=args.seq_len,
        batch_size=args.batch_size, seeds=_seeds(args.seeds), init_std=args.init_std,
    )
    command = command_line(args.argv)
    result = run_theory(args.depth, args.out, params, setup, empirical=setup is not None, command=command)
    for line in summary_lines(result):
        print(line)
    print(f"wrote {result['paths']['json']}")
    print(f"wrote {result['paths']['figure']}")
    return 0
