"""``depthlab prune``: from a diagnosis to a smaller model any runtime loads.

    from depthlab.analysis.diagnostics import load_target
    from depthlab.prune import PruneOptions, prune_target
    report = prune_target(load_target("smollm2"), PruneOptions(method="removal", remove=6), "pruned/smollm2-24")

Pieces: :mod:`~depthlab.prune.select` (which blocks: greedy removal, angular-block, block influence),
:mod:`~depthlab.prune.export` (HF surgery, export, verification, latency and cost),
:mod:`~depthlab.prune.heal` (short continued training), :mod:`~depthlab.prune.pruned_run` (pruned depthlab
models and run directories), :mod:`~depthlab.prune.prune_report` (prune.json, report.html).
"""

from depthlab.base.lazy import lazy_exports

__all__ = [
    "HEAL_MODES", "METHODS", "PRUNABLE_MODEL_TYPES", "HealOptions", "PruneOptions", "Selection", "angular_block",
    "check_options", "check_target", "drop_layers", "greedy_removal", "heal", "lowest_influence", "prune_model", "prune_target",
    "select_blocks", "survey_model", "verify_export", "write_hf",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("PRUNABLE_MODEL_TYPES", "drop_layers", "verify_export", "write_hf"), "depthlab.prune.export"),
    **dict.fromkeys(("HEAL_MODES", "HealOptions", "heal"), "depthlab.prune.heal"),
    **dict.fromkeys(("PruneOptions", "check_options", "check_target", "prune_model", "prune_target"), "depthlab.prune.pipeline"),
    **dict.fromkeys((
        "METHODS", "Selection", "angular_block", "greedy_removal", "lowest_influence", "select_blocks",
        "survey_model"), "depthlab.prune.select"),
})
