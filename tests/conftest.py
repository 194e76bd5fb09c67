"""Shared test settings."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Matmuls this small gain nothing from a second thread, and on a busy CPU handing each of
    thousands of them to the thread pool costs more than the work (test_model's 144-combination test:
    23 s with 2 threads, 2 s with 1, on 2 cores shared with other jobs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

