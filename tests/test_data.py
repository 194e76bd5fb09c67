"""Corpora, the train/val split, the token cache and bad input (see data/prepare.py)."""
import json
import math
import os
import socket
import subprocess
from pathlib import Path

import datasets
import numpy as np
import pytest
from data_helpers import data_settings, documents

from data import DataError, prepare_data
from data.__main__ import main as data_main
from data import prepare
from data.prepare import split_documents
from data.sources import play_text, shakespeare

PLAY_MARKDOWN = """# The Tempest

## ACT I

### SCENE I. On a ship at sea.

_Enter a Master and a Boatswain_

**MASTER**  
Boatswain!

**BOATSWAIN**  
Here, master: what cheer?  
_\\[Aside]_ Good, speak to the mariners.\\--fall to't.
"""

PLAY_TEXT = """The Tempest

ACT I

SCENE I. On a ship at sea.

Enter a Master and a Boatswain

MASTER
Boatswain!

BOATSWAIN
Here, master: what cheer?
[Aside] Good, speak to the mariners.--fall to't.
"""


def test_play_markdown_becomes_plain_play_text():
    assert play_text(PLAY_MARKDOWN) == PLAY_TEXT


def block_network(patch: pytest.MonkeyPatch):
    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    patch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def no_network(monkeypatch):
    block_network(monkeypatch)


@pytest.fixture(scope="module")
def shakespeare_data(tmp_path_factory):
    # A small vocabulary keeps tokenizer training fast; the corpus is the full default one.
    cfg = data_settings("shakespeare", tmp_path_factory.mktemp("cache"), vocab_size=512, num_proc=1)
    with pytest.MonkeyPatch.context() as patch:
        block_network(patch)
        return prepare_data(cfg, context_length=64, batch_size=4)


def test_embedded_plays_are_38_plain_documents(no_network):
    plays = shakespeare({}).load()["text"]
    assert len(plays) == 38
    assert 4_500_000 < sum(map(len, plays)) < 5_500_000
    for play in plays:
        assert not any(mark in play for mark in ("**", "_", "#", "\\"))
    assert plays[0].startswith("A Midsummer Night's Dream\n\nACT I\n\nSCENE I. Athens. The palace of THESEUS.\n\n"
                               "Enter THESEUS, HIPPOLYTA, PHILOSTRATE, and Attendants\n\nTHESEUS\nNow, fair Hippolyta")


def test_default_corpus_prepares_with_the_network_blocked(shakespeare_data):
    data = shakespeare_data
    plays = shakespeare({}).load()["text"]
    assert data.stats["train"]["documents"] == 36 and data.stats["val"]["documents"] == 2
    assert data.train.dtype == np.uint16 and data.tokenizer.vocab_size == 512
    # The streams decode back to exactly the plays: val holds plays 9 and 28 of 38, train the rest in order.
    assert documents(data.val, data.tokenizer) == [plays[9], plays[28]]
    assert documents(data.train, data.tokenizer) == [p for i, p in enumerate(plays) if i not in (9, 28)]
    for split, stream in (("train", data.train), ("val", data.val)):
        stats = data.stats[split]
        assert stats["tokens"] == len(stream)
        assert data.bytes_per_token[split] == stats["bytes"] / len(stream)
        assert 1.5 < data.bytes_per_token[split] < 4


def test_split_holds_out_whole_documents_spread_evenly():
    docs = datasets.Dataset.from_dict({"text": [f"doc {i}" for i in range(40)]})
    train, val = split_documents(docs, 0.05)
    assert val["text"] == ["doc 10", "doc 30"]
    assert train["text"] == [f"doc {i}" for i in range(40) if i not in (10, 30)]
    assert split_documents(docs, 0.05)[1]["text"] == val["text"]


def test_split_with_few_documents_holds_out_each_tail():
    texts = ["a" * 100, "b" * 55]
    train, val = split_documents(datasets.Dataset.from_dict({"text": texts}), 0.1)
    assert val["text"] == ["a" * 10, "b" * 6]
    assert [h + t for h, t in zip(train["text"], val["text"])] == texts


# --- the text source and the cache ------------------------------------------------------------------

def write_corpus(folder, n_files=4, lines=60) -> list:
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(n_files):
        text = "".join(f"File {i}, line {j}: the  quick\tbrown fox — café {j * i}.\n" for j in range(lines))
        path = folder / f"part{i}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def text_settings(tmp_path, path, **changes):
    return data_settings("text", tmp_path / "cache", path=path, vocab_size=300, num_proc=1, **changes)


def test_text_source_reads_globs_one_document_per_file(tmp_path):
    paths = write_corpus(tmp_path / "corpus")
    data = prepare_data(text_settings(tmp_path, str(tmp_path / "corpus" / "*.txt"), val_fraction=0.25), 16, 4)
    texts = [p.read_text(encoding="utf-8") for p in paths]
    assert documents(data.val, data.tokenizer) == [texts[2]]
    assert documents(data.train, data.tokenizer) == [texts[0], texts[1], texts[3]]
    non_ascii = sum(len(t.encode()) - len(t) for t in texts[:2] + texts[3:])
    assert data.stats["train"]["bytes"] == data.stats["train"]["characters"] + non_ascii


def test_more_processes_give_the_same_stream(tmp_path):
    write_corpus(tmp_path / "corpus")
    path = str(tmp_path / "corpus" / "*.txt")
    one = prepare_data(data_settings("text", tmp_path / "one", path=path, vocab_size=300, num_proc=1), 16, 4)
    two = prepare_data(data_settings("text", tmp_path / "two", path=path, vocab_size=300, num_proc=2), 16, 4)
    assert np.array_equal(one.train, two.train) and np.array_equal(one.val, two.val)


@pytest.fixture
def corpus_cfg(tmp_path):
    return text_settings(tmp_path, str(write_corpus(tmp_path / "corpus", n_files=1)[0]))


def refuse_to_load(monkeypatch):
    def load_dataset(*args, **kwargs):
        raise AssertionError("the corpus was read although the cache is valid")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def test_unchanged_settings_reuse_the_cache_without_reading_the_corpus(corpus_cfg, monkeypatch):
    first = prepare_data(corpus_cfg, 16, 4)
    refuse_to_load(monkeypatch)
    second = prepare_data(corpus_cfg, 16, 4)
    assert second.cache_dir == first.cache_dir
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)


def test_the_unigram_level_is_computed_once_with_the_cache(corpus_cfg, monkeypatch):
    """The val bpb of predicting each val token by its add-one smoothed train frequency, computed here by hand;
    kept in the manifest, so a later start reads it instead of counting the whole train stream again."""
    first = prepare_data(corpus_cfg, 16, 4)
    counts = np.ones(first.tokenizer.vocab_size)
    for token in np.asarray(first.train):
        counts[token] += 1
    nats = -np.mean([math.log(counts[t] / counts.sum()) for t in np.asarray(first.val)])
    bytes_per_token = first.stats["val"]["bytes"] / first.stats["val"]["tokens"]
    assert first.unigram_val_bpb == pytest.approx(nats / math.log(2) / bytes_per_token, rel=1e-9)
    assert json.loads((first.cache_dir / "manifest.json").read_text())["unigram_val_bpb"] == first.unigram_val_bpb
    monkeypatch.setattr(np, "bincount", lambda *args, **kwargs: pytest.fail("the unigram level was counted again"))
    assert prepare_data(corpus_cfg, 16, 4).unigram_val_bpb == first.unigram_val_bpb


def test_a_null_vocab_size_follows_the_rule_by_the_train_splits_bytes(corpus_cfg, monkeypatch, capsys):
    # the measured rule (docs/data.md): 512 pieces at the study's 0.91 MB of train text, 2048 at its 4.68 MB
    assert [prepare.vocab_for(n) for n in (912_739, 4_680_000, 10**12)] == [512, 2048, 2048]
    # a rule small enough for this corpus: 300 pieces up to 1 kB of train text, 320 above (it has 2.7 kB)
    monkeypatch.setattr(prepare, "VOCAB_RULE", ((1_000, 300), (math.inf, 320)))
    assert [prepare.vocab_for(n) for n in (1, 1_000, 1_001)] == [300, 300, 320]
    ruled = prepare_data(dict(corpus_cfg, vocab_size=None), 16, 4)
    assert ruled.tokenizer.vocab_size == 320
    assert "training a 320-piece BPE tokenizer on the train split (data.vocab_size=null" in capsys.readouterr().out
    assert ruled.cache_dir != prepare_data(dict(corpus_cfg, vocab_size=320), 16, 4).cache_dir  # the rule is in the key


def test_changed_settings_or_corpus_rebuild(corpus_cfg):
    first = prepare_data(corpus_cfg, 16, 4)
    bigger_vocab = prepare_data(dict(corpus_cfg, vocab_size=320), 16, 4)
    assert bigger_vocab.cache_dir != first.cache_dir and bigger_vocab.tokenizer.vocab_size == 320
    n_chars = first.stats["train"]["characters"] + first.stats["val"]["characters"]
    assert prepare_data(dict(corpus_cfg, val_fraction=0.2), 16, 4).stats["val"]["characters"] == math.ceil(0.2 * n_chars)
    with open(corpus_cfg["path"], "a", encoding="utf-8") as f:
        f.write("An added closing line.\n")
    edited = prepare_data(corpus_cfg, 16, 4)
    assert edited.cache_dir != first.cache_dir
    assert edited.tokenizer.decode(edited.val).endswith("An added closing line.\n")


def break_truncate(cache):
    with open(cache / "train.bin", "r+b") as f:
        f.truncate(os.path.getsize(cache / "train.bin") - 2)


def break_manifest_missing(cache):  # as left by a process killed before the manifest was written
    (cache / "manifest.json").unlink()


def break_foreign_format(cache):
    manifest = json.loads((cache / "manifest.json").read_text())
    (cache / "manifest.json").write_text(json.dumps(dict(manifest, format=manifest["format"] + 1)))


@pytest.mark.parametrize("damage", [break_truncate, break_manifest_missing, break_foreign_format])
def test_damaged_or_foreign_cache_is_rebuilt_not_used(corpus_cfg, damage):
    first = prepare_data(corpus_cfg, 16, 4)
    train, val = np.array(first.train), np.array(first.val)
    tokenizer_written = os.stat(first.tokenizer.model_file).st_mtime_ns
    damage(first.cache_dir)
    rebuilt = prepare_data(corpus_cfg, 16, 4)
    assert np.array_equal(rebuilt.train, train) and np.array_equal(rebuilt.val, val)
    assert os.stat(rebuilt.tokenizer.model_file).st_mtime_ns == tokenizer_written  # the tokenizer is reused


def break_same_size(cache):  # a flipped block in the middle of the stream: its size still checks out
    with open(cache / "train.bin", "r+b") as f:
        f.seek(os.path.getsize(cache / "train.bin") // 2)
        f.write(b"\xff" * 64)


def test_a_cache_corrupted_in_place_is_rebuilt_with_a_notice(corpus_cfg, capsys):
    first = prepare_data(corpus_cfg, 16, 4)
    train = np.array(first.train)
    break_same_size(first.cache_dir)
    capsys.readouterr()
    rebuilt = prepare_data(corpus_cfg, 16, 4)
    assert f"data: rebuilding the cache in {first.cache_dir}: train.bin does not match the sha256 in manifest.json" \
        in capsys.readouterr().out
    assert np.array_equal(rebuilt.train, train)


def test_a_truncated_tokenizer_is_trained_again(corpus_cfg, capsys):
    first = prepare_data(corpus_cfg, 16, 4)
    train, model_file = np.array(first.train), Path(first.tokenizer.model_file)
    model_file.write_bytes(model_file.read_bytes()[:100])
    rebuilt = prepare_data(corpus_cfg, 16, 4)
    assert "tokenizer.model does not match the sha256 in manifest.json" in capsys.readouterr().out
    assert np.array_equal(rebuilt.train, train) and rebuilt.tokenizer.vocab_size == 300


def test_a_killed_builds_temporary_files_are_removed_by_the_next_build(corpus_cfg):
    first = prepare_data(corpus_cfg, 16, 4)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    leftover = first.cache_dir / f"train.bin.tmp-{dead.pid}"
    leftover.write_bytes(b"")
    live = first.cache_dir / f"train.bin.tmp-{os.getppid()}"  # a process that is alive: its file stays
    live.write_bytes(b"")
    (first.cache_dir / "manifest.json").unlink()
    prepare_data(corpus_cfg, 16, 4)
    assert not leftover.exists() and live.exists()


def test_a_failed_build_leaves_no_cache_dir(corpus_cfg):
    with pytest.raises(DataError):
        prepare_data(dict(corpus_cfg, vocab_size=5000), 16, 4)  # the tokenizer cannot have that many pieces
    assert not list(Path(corpus_cfg["cache_dir"]).glob("text-*"))  # datasets' own cache (hf_datasets/) may stay


# --- bad input: one line naming the setting -------------------------------------------------------

def assert_one_line_error(cfg, *fragments, context_length=16, batch_size=4):
    with pytest.raises(DataError) as error:
        prepare_data(cfg, context_length, batch_size)
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


@pytest.mark.parametrize("path", [None, "", []])
def test_empty_path(tmp_path, path):
    assert_one_line_error(text_settings(tmp_path, path), "data.path=", "is empty")


def test_missing_path(tmp_path):
    assert_one_line_error(text_settings(tmp_path, str(tmp_path / "nowhere" / "*.txt")), "data.path=", "matches no file")


def test_file_that_is_not_utf8(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    assert_one_line_error(text_settings(tmp_path, str(bad)), "data.path", "latin1.txt", "not UTF-8", "offset 3")


def test_a_val_split_smaller_than_one_batch_says_what_to_change(tmp_path):
    """A corpus large enough to train on, with too small a share of it held out: the line names the setting."""
    cfg = text_settings(tmp_path, str(write_corpus(tmp_path / "corpus", n_files=1)[0]), val_fraction=0.001)
    assert_one_line_error(cfg, "the val split has", "use a larger data.val_fraction, or a smaller "
                          "train.micro_batch_size or model.context_length", context_length=32, batch_size=2)


def test_corpus_smaller_than_one_batch(corpus_cfg):
    assert_one_line_error(corpus_cfg, "data.path=", "fewer than one batch", "batch_size=32", "context_length=128",
                          "use a larger corpus, or a smaller train.micro_batch_size or model.context_length",
                          context_length=128, batch_size=32)


def test_empty_corpus(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_one_line_error(text_settings(tmp_path, str(empty)), "data.path=", "no text")


@pytest.mark.parametrize("vocab_size, reason", [(100, "smaller than required"), (5000, "too high")])
def test_vocab_size_the_corpus_cannot_support(corpus_cfg, vocab_size, reason):
    assert_one_line_error(dict(corpus_cfg, vocab_size=vocab_size), f"data.vocab_size={vocab_size}", reason)


@pytest.mark.parametrize("key, value", [("val_fraction", 0.0), ("val_fraction", 0.9), ("vocab_size", "big"),
                                        ("source", "wikipedia")])
def test_bad_settings(corpus_cfg, key, value):
    assert_one_line_error(dict(corpus_cfg, **{key: value}), f"data.{key}={value!r}")


def test_command_line_prints_one_error_line_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        data_main(["data=text", f"data.path={tmp_path}/missing.txt", f"data.cache_dir={tmp_path}"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: data.path='{tmp_path}/missing.txt' matches no file\n"


def test_command_line_reports_the_cache(tmp_path, capsys):
    path = write_corpus(tmp_path / "corpus", n_files=1)[0]
    data_main(["data=text", f"data.path={path}", f"data.cache_dir={tmp_path}", "data.vocab_size=300",
               "model.context_length=16", "train.micro_batch_size=4"])
    out = capsys.readouterr().out
    assert "vocab 300" in out and "train: 1 documents" in out and "val: 1 documents" in out
