"""``run_theory``: the recursions (+ the empirical check) written to theory.json and theory.png.

    result = run_theory(1000, "theory/", setup=EmpiricalSetup(depth=256))
    print("\\n".join(summary_lines(result)))
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from depthlab.analysis.theory.empirical import measure_empirical
from depthlab.analysis.theory.options import EmpiricalSetup, RecursionParams, check_int
from depthlab.analysis.theory.recursions import recursion_report
from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import write_json_atomic
from depthlab.base.progress import user_logging
from depthlab.base.provenance import versions

log = logging.getLogger(__name__)


def run_theory(
    depth: int,
    out: str | Path,
    params: RecursionParams | None = None,
    setup: EmpiricalSetup | None = None,
    empirical: bool = True,
    command: str | None = None,
) -> dict[str, Any]:
    """Recursions to ``depth`` (+ empirical check), written to ``out/theory.json`` and ``out/theory.png``.

    ``out`` must be absent, empty, or hold an earlier theory output only (theory.json, theory.png: replaced);
    a folder of other files is refused before any work. The empirical models are as deep as the recursions, at
    most ``setup.depth`` (256 by default): ``depth=10`` measures 10-block models, in well under a second."""
    with user_logging():
        return _run_theory(depth, Path(out), params, setup, empirical, command)


#: What a theory output folder holds (an earlier one is replaced; any other file makes the folder refused).
OUTPUTS = ("theory.json", "theory.png")


def check_theory_out(out: Path) -> None:
    """Refuse, before any work, an ``out`` that is a file or holds other files than an earlier theory output."""
    if out.exists() and not out.is_dir():
        raise DepthlabError(f"--out {str(out)!r} is an existing file, not a directory")
    others = sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS) if out.is_dir() else []
    if others:
        shown = ", ".join(others[:4]) + (f", … ({len(others)} entries)" if len(others) > 4 else "")
        raise DepthlabError(f"--out {str(out)!r} holds other files than a theory output ({shown}); "
                            "give a new or empty directory")


def _run_theory(depth: int, out: Path, params: RecursionParams | None, setup: EmpiricalSetup | None,
                empirical: bool, command: str | None) -> dict[str, Any]:
    from depthlab.analysis.plots.theory import plot_theory  # late: matplotlib only when drawing

    depth = check_int("depth", depth, 2)
    check_theory_out(out)
    if setup is not None:
        setup.validate()  # fail before the (quick) recursions, not after
        if setup.depth > depth:  # as deep as the recursions: --depth 10 measures 10-block models
            setup = dataclasses.replace(setup, depth=depth)
    rec = recursion_report(depth, params)
    emp = measure_empirical(setup) if empirical else None
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "recursion": rec,
        "empirical": emp,
        "provenance": {"command": command, **versions()},
    }
    json_path = out / "theory.json"
    write_json_atomic(json_path, result, indent=1)
    fig = plot_theory(
        out / "theory.png",
        variance=rec["variance"],
        gradient_bound=rec["gradient_bound"],
        emp_variance={k: v["variance"] for k, v in emp["schemes"].items()} if emp else None,
        emp_jacobian_depths=emp["jacobian_depths"] if emp else None,
        emp_jacobian_gain={k: v["jacobian_gain"] for k, v in emp["schemes"].items()} if emp else None,
        emp_label=_emp_label(emp["setup"]) if emp else "",
    )
    result["paths"] = {"json": str(json_path), "figure": str(fig)}
    log.info("theory: wrote %s and %s", json_path, fig)
    return result


def _emp_label(setup: dict[str, Any]) -> str:
    return (f"random init, width {setup['d_model']}, std {setup['init_std']}, "
            f"B×T={setup['batch_size']}×{setup['seq_len']}, {len(setup['seeds'])} seed(s)")


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A short human summary of ``run_theory``'s result (the CLI prints it)."""
    rec = result["recursion"]
    fv, fg = rec["fits"]["variance"], rec["fits"]["gradient_bound"]
    lines = [
        f"recursions to depth {rec['depth']} (c={rec['params']['c']}, σ²_1={rec['params']['sigma1_sq']}):",
        f"  variance   pre: σ²_L={rec['variance']['pre'][-1]:.4g}, power-law exponent (deeper half) "
        f"{fv['pre']['power_law_tail']['exponent']:.2f} | lns: σ²_L={rec['variance']['lns'][-1]:.4g}, "
        f"exponent {fv['lns']['power_law_tail']['exponent']:.2f}",
        f"  grad bound pre: {rec['gradient_bound']['pre'][-1]:.4g} (exponent {fg['pre']['power_law_tail']['exponent']:.2f})"
        f" | lns: {rec['gradient_bound']['lns'][-1]:.4g} (exponent {fg['lns']['power_law_tail']['exponent']:.2f})",
    ]
    emp = result.get("empirical")
    if emp:
        lines.append(f"empirical, {emp['setup']['depth']} layers ({_emp_label(emp['setup'])}):")
        for name, s in emp["schemes"].items():
            f = s["fits"]
            lines.append(
                f"  {name:<4} variance {s['variance'][0]:.3g} -> {s['variance'][-1]:.3g} "
                f"(×{s['variance_ratio_last_to_embedding']:.1f}; exponent {f['variance']['power_law']['exponent']:.2f})"
                f", ‖∂y_L/∂x_1‖ ≈ {s['jacobian_gain'][-1]:.3g} (exponent {f['jacobian_gain']['power_law']['exponent']:.2f})"
            )
    return lines
