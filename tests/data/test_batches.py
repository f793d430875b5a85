"""Packed rows as the datasets other trainers take."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_causal_lm_windows_give_hf_the_loss_of_next_token_prediction():
    """An HF causal LM fed a ``CausalLMWindows`` item (labels = input_ids, as HF's Trainer passes them) reports the
    mean cross-entropy of each token predicting the next one: a naive shifted loss over its logits."""
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    from depthlab.data import CausalLMWindows

    rows = np.random.default_rng(0).integers(0, 50, (3, 9))
    data = CausalLMWindows(rows)
    assert len(data) == 3 and torch.equal(data[1]["input_ids"], torch.as_tensor(rows[1]))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    batch = torch.utils.data.default_collate([data[0], data[2]])
    with torch.no_grad():
        out = model(**batch)
    naive = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), batch["input_ids"][:, 1:].flatten())
    assert float(out.loss) == pytest.approx(float(naive), abs=1e-6)
