"""Shared test settings, the fixtures of the modules that run train.py on a tiny model, and the interop tests'
tokenizer."""
import sys
from pathlib import Path

import pytest
import torch

from data.tokenizer import Tokenizer, train_tokenizer
from data_helpers import tiny_run
from interop_helpers import VOCAB, corpus
from processes import Descendants


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Matmuls this small gain nothing from a second thread, and on a busy CPU handing each of
    thousands of them to the thread pool costs more than the work (test_model's tests over every
    combination of its settings, measured in docs/setup.md#one-thread-per-test-process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)



def pytest_collection_modifyitems(items):
    """The tests that share a process (an xdist_group: a study trained once, read by several) first, then the modules
    in reverse order of their names: under -n 2 the long runs start early, and the many short tests of the first
    modules (the configs', the model's combinations) end the suite on both workers, not one long test alone."""
    names = sorted({item.module.__name__ for item in items}, reverse=True)
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None, names.index(item.module.__name__)))


@pytest.fixture(autouse=True, scope="session")
def descendants():
    """Every process the suite starts (tests/processes.py): none may outlive it, each given GRACE_S to end."""
    seen = Descendants().start()
    yield seen
    seen.stop()
    if "wandb" in sys.modules:  # its service (wandb-core), which the suite's in-process runs share, ends with them
        sys.modules["wandb"].teardown()
    left = seen.outliving()
    assert not left, f"processes the suite started outlived it (killed now): {left}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request):
    """One folder per test module for its runs, corpus and token cache."""
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))


@pytest.fixture(scope="module")
def tiny(workdir) -> list[str]:
    """train.py overrides for a tiny run in this module's workdir (data_helpers.tiny_run)."""
    return tiny_run(workdir)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """The data pipeline's tokenizer, trained on interop_helpers' tiny corpus."""
    return train_tokenizer(corpus(), VOCAB, tmp_path_factory.mktemp("tok") / "tokenizer.model").model_file


@pytest.fixture(scope="module")
def tok(tokenizer_file) -> Tokenizer:
    return Tokenizer(tokenizer_file)
