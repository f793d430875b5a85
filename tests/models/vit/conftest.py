"""ViT tests run single-threaded (tiny ops on 2 shared cores are slower with OpenMP threads)."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield
