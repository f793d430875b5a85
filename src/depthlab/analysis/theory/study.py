"""``run_theory``: the recursions (+ the empirical check) written to theory.json and theory.png.

    result = run_theory(1000, "theory/", setup=EmpiricalSetup(depth=256))
    print("\\n".join(summary_lines(result)))
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from depthlab.analysis.theory.empirical import measure_empirical
from depthlab.analysis.theory.options import EmpiricalSetup, RecursionParams, check_int
from depthlab.analysis.theory.recursions import recursion_report
from depthlab.base.fileio import write_json_atomic
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
    """Recursions to ``depth`` (+ empirical check), written to ``out/theory.json`` and ``out/theory.png``."""
    from depthlab.analysis.plots.theory import plot_theory  # late: matplotlib only when drawing

    depth = check_int("depth", depth, 2)
    if setup is not None:
        setup.validate()  # fail before the (quick) recursions, not after
    rec = recursion_report(depth, params)
    emp = measure_empirical(setup) if empirical else None
    out = Path(out)
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
