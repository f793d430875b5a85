"""Supervised fine-tuning data: instruction records -> (input_ids, labels) with the prompt masked.

The fine-tuning loop itself lives with the trainer (not here)."""

from depthlab.finetune.data import (
    TEMPLATES,
    PromptTemplate,
    SFTDataset,
    SFTExample,
    batches,
    get_template,
    load_records,
    pack_examples,
    pad_examples,
)

__all__ = ["TEMPLATES", "PromptTemplate", "SFTDataset", "SFTExample", "batches", "get_template", "load_records", "pack_examples",
           "pad_examples"]
