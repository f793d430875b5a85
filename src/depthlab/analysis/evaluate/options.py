"""What ``evaluate`` scores and how: plain data, no torch (the command line derives its flags from it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from depthlab.base.errors import DepthlabError, check_int, choices

SCORINGS = ("loglik", "generate")


@dataclass
class EvaluateOptions:
    """Options of :func:`depthlab.analysis.evaluate.evaluate` (``depthlab evaluate``)."""

    # ---- tasks
    tasks: str | None = None  # comma-separated: FILE.jsonl, builtin-mc, builtin-arith, builtin-verses, builtin-shapes, hf:NAME
    limit: int | None = None  # score the first N items of each task
    # ---- scoring
    scoring: str = "loglik"  # loglik: lm-eval's multiple choice | generate: generate-and-match (LLM-Adapters; exact match)
    batch_size: int = 8  # sequences per forward
    template: str = "alpaca"  # SFT prompt template for --scoring generate (alpaca, llm-adapters)
    max_new_tokens: int = 32  # generated tokens for --scoring generate
    chat_template: bool = False  # image-text tasks: prompt through the processor's chat template (instruct models)
    progress: bool = True  # progress bars on a terminal

    def validate(self) -> None:
        """Refuse, in one line naming the flag and the value, what cannot work: before a model is loaded."""
        if not self.tasks:
            raise DepthlabError("give --tasks, e.g. --tasks builtin-mc or --tasks arc_easy.jsonl,piqa.jsonl")
        if self.scoring not in SCORINGS:
            raise DepthlabError(f"unknown --scoring {self.scoring!r}; {choices(SCORINGS)}")
        for name in ("batch_size", "max_new_tokens"):
            check_int("--" + name.replace("_", "-"), getattr(self, name), 1)
        if self.limit is not None:
            check_int("--limit", self.limit, 1)

    def scoring_kwargs(self) -> dict[str, Any]:
        """:func:`~depthlab.analysis.evaluate.evaluate`'s keyword arguments for these options (but ``progress``,
        which a command shows on a terminal only)."""
        return {"limit": self.limit, "batch_size": self.batch_size, "scoring": self.scoring, "template": self.template,
                "max_new_tokens": self.max_new_tokens, "chat_template": self.chat_template}
