"""Hub corpora. The Hub cannot be reached from the tests, so the success path mocks the two calls
that would reach it (the reachability probe and datasets.load_dataset); the offline failure is real."""
import io
import socket
import time
import urllib.request

import datasets
import huggingface_hub
import pytest
from data_helpers import data_settings, documents

from data import DataError, prepare_data

STORIES = [f"Once upon a time, story {i} had a cat named Tom{i}. The end.\n" for i in range(40)]


@pytest.fixture
def fake_hub(monkeypatch):
    """Stands in for the Hub: answers the probe and serves `rows` for load_dataset."""
    calls = []

    def load_dataset(path, **kwargs):
        calls.append(dict(kwargs, path=path))
        return datasets.Dataset.from_dict({"text": fake_hub.rows})

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: io.BytesIO())  # an empty answer
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    fake_hub.calls = calls
    return fake_hub


def test_tinystories_reads_the_parquet_files_and_splits_by_story(tmp_path, fake_hub):
    fake_hub.rows = STORIES
    data = prepare_data(data_settings("tinystories", tmp_path, vocab_size=300), 16, 4)
    assert fake_hub.calls == [{"path": "roneneldan/TinyStories", "revision": "main", "split": "train+validation",
                               "data_files": {"train": "data/train-*.parquet",
                                              "validation": "data/validation-*.parquet"}}]
    assert documents(data.val, data.tokenizer) == [STORIES[10], STORIES[30]]
    assert len(documents(data.train, data.tokenizer)) == 38


def test_tinyshakespeare_joins_its_rows_into_one_text(tmp_path, fake_hub):
    fake_hub.rows = ["First Citizen:\nBefore we proceed any further, hear me speak.\n\n" * 30,
                     "All:\nSpeak, speak.\n\n" * 4, "MENENIUS:\nWhat work's, my countrymen?\n" * 4]
    data = prepare_data(data_settings("tinyshakespeare", tmp_path, vocab_size=300), 16, 4)
    call = fake_hub.calls[0]
    assert call["path"] == "karpathy/tiny_shakespeare" and call["split"] == "train+validation+test"
    assert len(call["revision"]) == 40  # a pinned commit: main still holds a loading script
    text = "".join(fake_hub.rows)
    assert documents(data.train, data.tokenizer)[0] + documents(data.val, data.tokenizer)[0] == text


def test_unreachable_hub_fails_at_once_naming_the_offline_choices(tmp_path, monkeypatch):
    # A real connection attempt to a local port nobody listens on, instead of the Hub (and no proxy).
    monkeypatch.setenv("no_proxy", "*")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("load_dataset would retry for ~25 s"))
        started = time.monotonic()
        with pytest.raises(DataError) as error:
            prepare_data(data_settings("tinystories", tmp_path), 16, 4)
        elapsed = time.monotonic() - started
    message = str(error.value)
    assert "\n" not in message and "data=tinystories" in message and "cannot reach the Hugging Face Hub" in message
    assert "data=shakespeare" in message and "data=text" in message
    assert elapsed < 10  # it fails at once rather than waiting through datasets' own retries
