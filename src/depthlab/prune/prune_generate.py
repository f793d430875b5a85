"""Generative accuracy of a model while it is being pruned: a generative task (``--generate builtin-arith``) scored by
exact match on the original, the pruned and the healed model, beside the likelihood numbers (a layer that costs
little held-out loss can still be needed to produce an answer)."""

from __future__ import annotations

from typing import Any

from torch import nn


def generative_accuracy(target: Any, model: nn.Module, opts: Any) -> dict[str, Any]:
    """Exact-match accuracy of ``model`` (the target's model or a pruned copy of it, same tokenizer) on
    ``opts.generate``'s first ``opts.generate_limit`` items: ``{"task", "n", "acc", "acc_stderr"}``."""
    from depthlab.analysis.evaluate.accuracy import Codec, load_tasks
    from depthlab.analysis.evaluate.scoring import score_exact_match
    from depthlab.prune.export import lm_logits

    (task,) = load_tasks(opts.generate, opts.generate_limit)
    codec = Codec(target)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        res = score_exact_match(lambda ids: lm_logits(model, ids), task, codec.encode, codec.decode,
                                eos_id=codec.eos_id, batch_size=opts.batch_size, max_length=target.max_seq_len or 2048,
                                pad_id=codec.pad_id, device=device, progress=False)
    finally:
        model.train(was)
    return {"task": task.name, "n": res["n"], "acc": res["acc"], "acc_stderr": res["acc_stderr"]}
