"""ViT tests run single-threaded (tiny ops on 2 shared cores are slower with OpenMP threads)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
