"""Everything that measures a model and draws what it measured.

    diagnostics/  angular distance, removal loss, variance, Jacobians; in memory or one layer at a time
    monitor/      the same per-block series inside any training loop, and the experiment trackers
    evaluate/     downstream accuracy as lm-evaluation-harness scores it
    theory/       the variance recursions of the paper's lemmas and their random-init check
    plots/        every figure, one function each
"""
