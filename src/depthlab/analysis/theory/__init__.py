"""The paper's variance theory (docs/paper.md §6): recursions and bounds, and an empirical check of them.

    recursions.py   Lemma 3.2 / 4.1 variance recursions, the frozen-σ upper bounds, the gradient-bound
                    products of Theorems 3.3 / 4.2, power-law / exponential growth fits (no model)
    empirical.py    random-init pre and lns models: residual variance and ‖∂y_l/∂x_1‖ at every depth
    study.py        run_theory: both, written to theory.json + theory.png; summary_lines for the CLI
    options.py      TheoryOptions, RecursionParams, EmpiricalSetup: plain data (the CLI derives its flags from them)
"""

from depthlab.base.lazy import lazy_exports

__all__ = [
    "MAX_EMPIRICAL_DEPTH",
    "EmpiricalSetup",
    "RecursionParams",
    "TheoryOptions",
    "fit_exponential",
    "fit_power_law",
    "gradient_bound",
    "growth_fits",
    "jacobian_rms_gains",
    "lns_variance",
    "measure_empirical",
    "measure_scheme",
    "paper_constants",
    "pre_ln_variance",
    "recursion_report",
    "run_theory",
    "summary_lines",
    "upper_bound_log10",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("jacobian_rms_gains", "measure_empirical", "measure_scheme"), "depthlab.analysis.theory.empirical"),
    **dict.fromkeys(("MAX_EMPIRICAL_DEPTH", "EmpiricalSetup", "RecursionParams", "TheoryOptions"),
                    "depthlab.analysis.theory.options"),
    **dict.fromkeys((
        "fit_exponential", "fit_power_law", "gradient_bound", "growth_fits", "lns_variance",
        "paper_constants", "pre_ln_variance", "recursion_report", "upper_bound_log10"), "depthlab.analysis.theory.recursions"),
    **dict.fromkeys(("run_theory", "summary_lines"), "depthlab.analysis.theory.study"),
})
