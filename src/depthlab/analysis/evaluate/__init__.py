"""Downstream evaluation: the paper's commonsense tasks (lm-eval-style multiple choice, or
LLM-Adapters-style generation) and offline built-in tasks over the built-in corpus."""

from depthlab.base.lazy import lazy_exports

__all__ = ["FORMATS", "SCORINGS", "EvaluateOptions",
           "Task", "TaskItem", "builtin_mc_rows", "builtin_sft_records", "builtin_task", "detect_format",
           "encode_pair", "evaluate", "extract_answer", "load_task_file", "load_tasks", "logits_fn", "markdown_table",
           "mean_stderr", "parse_rows", "score_generate", "score_loglik", "write_results"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("builtin_mc_rows", "builtin_sft_records", "builtin_task"), "depthlab.data.builtin_tasks"),
    **dict.fromkeys((
        "FORMATS", "Task", "TaskItem", "detect_format", "load_task_file", "parse_rows"), "depthlab.data.tasks"),
    **dict.fromkeys(("evaluate", "load_tasks", "markdown_table", "write_results"), "depthlab.analysis.evaluate.accuracy"),
    **dict.fromkeys(("EvaluateOptions", "SCORINGS"), "depthlab.analysis.evaluate.options"),
    **dict.fromkeys((
        "encode_pair", "extract_answer", "logits_fn", "mean_stderr", "score_generate", "score_loglik"),
        "depthlab.analysis.evaluate.scoring"),
})
