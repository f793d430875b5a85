import pytest
import torch


@pytest.fixture
def one_thread():
    """One torch thread for the trainer tests (tiny ops on 2 shared cores: spinning threads cost more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
