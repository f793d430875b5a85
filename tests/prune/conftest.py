import pytest
import tiny_models


@pytest.fixture
def hf_dir(tmp_path):
    """Save a tiny HF model (+ byte tokenizer) and return its directory."""
    def make(kind: str = "llama", n_layers: int = 6, tie: bool = False):
        return tiny_models.hf_dir(tmp_path, kind, n_layers, tie_word_embeddings=tie)
    return make


PRUNE_OPTS = {"data": "builtin", "tokens": 128, "seq_len": 32, "batch_size": 2, "progress": False, "latency_tokens": 2}


@pytest.fixture(autouse=True)
def _fresh_logging():
    """``depthlab.cli.main`` configures the root logger on the stderr of the moment (pytest's capture of
    one test); drop that handler afterwards so the next test's main() binds its own stderr."""
    import logging

    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler:  # basicConfig's, not pytest's own capture handlers
            root.removeHandler(handler)
