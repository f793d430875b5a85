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
    """The registry's tiny Llama (norm weights jittered, so a wrong or missing norm shows)."""
    from depthlab.hf.tiny import tiny_model

    return tiny_model("llama", num_hidden_layers=n_layers)


@pytest.fixture
def tiny_hf():
    return tiny_hf_llama


@pytest.fixture
def make_cfg():
    return tiny_cfg
