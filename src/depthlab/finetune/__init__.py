"""Supervised fine-tuning data: instruction records -> (input_ids, labels) with the prompt masked.

The fine-tuning loop itself lives with the trainer (not here)."""

from depthlab._lazy import lazy_exports

__all__ = ["TEMPLATES", "PromptTemplate", "SFTDataset", "SFTExample", "batches", "get_template", "load_records",
           "pack_examples", "pad_examples"]


def finetune(*args, **kwargs):  # noqa: D103 - late import: the trainer only when fine-tuning
    from depthlab.finetune.run import finetune as _finetune

    return _finetune(*args, **kwargs)


finetune.__doc__ = "Fine-tune a depthlab run or an HF model directory: see :func:`depthlab.finetune.run.finetune`."
__all__ += ["finetune"]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys((
        "TEMPLATES", "PromptTemplate", "SFTDataset", "SFTExample", "batches", "get_template", "load_records",
        "pack_examples", "pad_examples"), "depthlab.data.sft"),
})
