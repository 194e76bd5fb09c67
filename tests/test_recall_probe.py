"""The recall probe (scripts/recall_probe.py, tasks/mqar.py's sequences: tests/test_tasks.py): the accuracy is 1 for a
model that looks each query up and 0 for one that copies its input; the probe reads every run of a study with the
same sequences, one line per variant; bad input is one line."""
import json

import pytest
import torch

from data.tokenizer import train_tokenizer
from data_helpers import write_corpus
from interop_helpers import VOCAB, llama_cfg
from model.transformer import Transformer
from scripts import recall_probe
from storage.checkpoint import save_checkpoint


class LookUp(torch.nn.Module):
    """Predicts, at each position, the token that followed the last earlier occurrence of its token (an induction
    head, by hand), or its own token (copy=True: no recall at all)."""

    def __init__(self, copy: bool, vocab: int = 64):
        super().__init__()
        self.copy, self.vocab = copy, vocab

    def forward(self, tokens):
        predicted = tokens.clone()
        for b, row in enumerate(tokens.tolist()):
            for t in range(1, len(row)) if not self.copy else []:
                earlier = [s for s in range(t - 1) if row[s] == row[t]]
                if earlier:
                    predicted[b, t] = row[earlier[-1] + 1]
        return torch.nn.functional.one_hot(predicted, self.vocab).float()


def test_the_accuracy_is_one_for_a_model_that_looks_queries_up_and_zero_for_one_that_copies():
    pieces = torch.arange(4, 64)
    assert recall_probe.recall_accuracy(LookUp(copy=False), 16, pieces, 80) == 1.0  # two batches: 64 + 16
    assert recall_probe.recall_accuracy(LookUp(copy=True), 16, pieces, 80) == 0.0  # a key is never its value


@pytest.fixture(scope="module")
def study(tmp_path_factory, tokenizer_file):
    """Two lines of a study: two seeds of one config (variant a), one of another (b); random weights."""
    root = tmp_path_factory.mktemp("study")
    for run, variant, seed in (("a/seed0", "a", 0), ("a/seed1", "a", 1), ("b/seed0", "b", 0)):
        torch.manual_seed(seed + (variant == "b"))
        save_checkpoint(root / run / "ckpt", Transformer(llama_cfg()), tokenizer_file)
        (root / run / "config.yaml").write_text(f"variant: {variant}\ntrain:\n  seed: {seed}\n")
    return root


def test_the_probe_reads_every_run_with_the_same_sequences_a_line_per_variant(study, tmp_path, capsys):
    """The seeds of one config are one line, named as compare.py names the variant."""
    out = tmp_path / "recall.json"
    assert recall_probe.main([str(study), "--pairs", "2", "8", "--sequences", "8", "--json", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()[-4:]
    assert table[0] == "| line | runs | 2 pairs | 8 pairs |"
    assert [row.split(" | ")[:2] for row in table[2:]] == [["| a", "2"], ["| b", "1"]]
    written = json.loads(out.read_text())
    assert [(run["line"], run["run"]) for run in written["runs"]] == [
        ("a", str(study / "a" / "seed0")), ("a", str(study / "a" / "seed1")), ("b", str(study / "b" / "seed0"))]
    assert all(0 <= accuracy <= 1 for run in written["runs"] for accuracy in run["accuracy"].values())


def test_sequences_longer_than_a_context_are_one_line(study, capsys):
    assert recall_probe.main([str(study), "--pairs", "17"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --pairs 17: its sequences of 68 tokens are longer than a run's context, 64"]


def test_no_pairs_is_a_usage_error(study, capsys):
    with pytest.raises(SystemExit) as exit_info:
        recall_probe.main([str(study), "--pairs", "0"])
    assert exit_info.value.code == 2
    assert "--pairs 0 --sequences 256: each must be >= 1" in capsys.readouterr().err.splitlines()[-1]


def test_a_folder_without_a_checkpoint_is_one_line(tmp_path, capsys):
    assert recall_probe.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {tmp_path}: no run dir with a checkpoint (ckpt/) there"]


def test_runs_of_different_vocabularies_are_one_line(study, tmp_path, capsys):
    other = train_tokenizer(write_corpus(tmp_path / "play.txt").read_text().splitlines(), VOCAB,
                            tmp_path / "tokenizer.model")
    save_checkpoint(tmp_path / "c" / "seed0" / "ckpt", Transformer(llama_cfg()), other.model_file)
    (tmp_path / "c" / "seed0" / "config.yaml").write_text("{}\n")
    assert recall_probe.main([str(study), str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: the runs have different vocabularies: the probe gives them all the same sequences"]
