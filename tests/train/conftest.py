import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread_and_shared_cache(monkeypatch, tmp_path_factory):
    """One torch thread (2 shared cores: OpenMP spinning makes tiny ops ~100x slower) and one
    tokenizer/token cache for the whole session (bpe:4096 on the builtin corpus is built once)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("DEPTHLAB_CACHE", str(tmp_path_factory.getbasetemp() / "depthlab-cache"))
    yield
    torch.set_num_threads(threads)
