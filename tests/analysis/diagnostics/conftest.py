import pytest
import torch

import depthlab as d


def tiny_cfg(scheme: str = "pre", **kw):
    base = dict(n_layers=4, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=300, max_seq_len=64, scheme=scheme)
    base.update(kw)
    return d.from_preset("tiny", **base)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return d.build_model(tiny_cfg()).eval()


def tiny_hf_llama(n_layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights, so a wrong/missing norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.fixture
def tiny_hf():
    return tiny_hf_llama


@pytest.fixture
def make_cfg():
    return tiny_cfg
