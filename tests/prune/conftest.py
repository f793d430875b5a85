import pytest
from prune_models import byte_tokenizer, tiny_hf  # noqa: E402


@pytest.fixture
def hf_dir(tmp_path):
    """Save a tiny HF model (+ byte tokenizer) and return its directory."""
    def make(kind: str = "llama", n_layers: int = 6, tie: bool = False):
        path = tmp_path / f"{kind}-{n_layers}"
        tiny_hf(kind, n_layers, tie).save_pretrained(path)
        byte_tokenizer().save_pretrained(path)
        return path
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
