"""``depthlab prune``: from a diagnosis to a smaller model any runtime loads.

    from depthlab.prune import PruneOptions, prune_target
    from depthlab.targets import load_target
    report = prune_target(load_target("smollm2"), PruneOptions(method="removal", remove=6), "pruned/smollm2-24")
    report = prune_target("path/to/llama-3-8b", PruneOptions(remove=8, stream=None), "pruned/8b-24")  # streams if too big

Pieces: :mod:`~depthlab.prune.dispatch` (``prune_target``: every check once, then the engine of the target),
:mod:`~depthlab.prune.pipeline` (in memory), :mod:`~depthlab.prune.streamed` (one layer at a time),
:mod:`~depthlab.prune.select` (which blocks: greedy removal, angular-block, block influence),
:mod:`~depthlab.prune.export` (HF surgery, export, verification, latency and cost),
:mod:`~depthlab.prune.heal` (short continued training), :mod:`~depthlab.prune.pruned_run` (pruned depthlab
models and run directories), :mod:`~depthlab.prune.prune_report` (prune.json, report.html).
"""

from depthlab.base.lazy import lazy_exports

__all__ = [
    "HEAL_MODES", "METHODS", "PRUNABLE_MODEL_TYPES", "HealOptions", "PruneOptions", "Selection", "angular_block",
    "check_options", "drop_layers", "greedy_removal", "heal", "lowest_influence", "prune_model", "prune_target",
    "select_blocks", "survey_model", "verify_export", "write_hf",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("PRUNABLE_MODEL_TYPES", "drop_layers", "verify_export", "write_hf"), "depthlab.prune.export"),
    **dict.fromkeys(("HEAL_MODES", "HealOptions", "heal"), "depthlab.prune.heal"),
    **dict.fromkeys(("check_options", "prune_model"), "depthlab.prune.pipeline"),
    "prune_target": "depthlab.prune.dispatch",
    "PruneOptions": "depthlab.prune.options",
    **dict.fromkeys((
        "METHODS", "Selection", "angular_block", "greedy_removal", "lowest_influence", "select_blocks",
        "survey_model"), "depthlab.prune.select"),
})
