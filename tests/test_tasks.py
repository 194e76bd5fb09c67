"""The synthetic tasks (tasks/): each generator deterministic in its seed, each scored answer recoverable from
the sequence (a hand-written solver scores 100%), each chance level what its file says, a test sequence never a
training one; and a task run through train.py like a text run: accuracy per level in metrics.jsonl, summary.json
and W&B, an exact resume after kill -9, generate on its checkpoint."""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tasks import TASKS
from tasks.base import IGNORE
from data.task_sets import make_task, prepare_task
from errors import UsageError
from data_helpers import ROOT, metrics, run_script, run_train, start_script, summary

SETS = {"task_seed": 0, "train_examples": 64, "seq_len": None, "vocab_size": None}


def task_at(name: str, seq_len: int = 128, **settings):
    return make_task({"task": name, **SETS, **settings}, seq_len)


@pytest.mark.parametrize("name", TASKS)
def test_a_task_is_its_seeds_and_its_answers_are_in_the_sequence(name):
    task = task_at(name)
    for level in task.levels:
        inputs, targets = task.generate(300, level, np.random.default_rng(7))
        again, _ = task.generate(300, level, np.random.default_rng(7))
        other, _ = task.generate(300, level, np.random.default_rng(8))
        assert np.array_equal(inputs, again) and not np.array_equal(inputs, other)
        assert inputs.shape == targets.shape == (300, 128) and inputs.min() >= 0 and inputs.max() < task.symbols
        scored = targets != IGNORE
        assert scored.sum(axis=1).min() >= 1
        assert np.array_equal(task.solve(inputs), targets)  # every answer, and nothing else, read off the sequence


@pytest.mark.parametrize("name", TASKS)
def test_chance_is_one_over_the_answers_a_task_draws_each_as_often(name):
    """Guessing scores the file's chance level: the answers are 1 / chance symbols, each drawn as often (within
    5 standard deviations of a binomial count)."""
    task = task_at(name)
    for level in task.levels:
        _, targets = task.generate(2000, level, np.random.default_rng(0))
        answers = targets[targets != IGNORE]
        counts = np.bincount(answers)
        counts = counts[counts > 0]
        share = task.chance(level)
        assert len(counts) == round(1 / share)
        expected, spread = len(answers) * share, math.sqrt(len(answers) * share * (1 - share))
        assert np.abs(counts - expected).max() < 5 * spread


def test_the_test_set_holds_no_training_sequence(tmp_path):
    """In-context recall of 2 keys and 2 values in 4 pairs: 64 sequences in all, so a draw of 64 training
    sequences holds many of them; the test set is what is left, and none of it a training sequence."""
    data = prepare_task({"task": "in_context_recall", **SETS, "vocab_size": 4, "seq_len": 8, "cache_dir": tmp_path}, 8)
    training = {tuple(row) for row in data.train[0].tolist()}
    [(inputs, targets, level)] = data.eval_batches(1000, 1000, "cpu")
    assert level == "" and 0 < len(inputs) < 1000
    assert not training & {tuple(row) for row in inputs.tolist()}
    only_one = {"task": "in_context_recall", **SETS, "vocab_size": 2, "seq_len": 4, "cache_dir": tmp_path}
    with pytest.raises(UsageError, match="in_context_recall: every test sequence is a training sequence too"):
        prepare_task(only_one, 4).eval_batches(8, 8, "cpu")


@pytest.mark.parametrize("settings, message", [
    ({"task": "sorting"}, "data.task='sorting' must be one of mqar, in_context_recall"),
    ({"task": "k_hop", "pairs": 8}, "data.pairs=8 is a setting of data.task=mqar, not of data.task=k_hop"),
    ({"task": "mqar", "pairs": [4, 12], "vocab_size": 16}, "data.task=mqar: data.pairs=12 needs 24 distinct keys "
                                                           "and values, but data.vocab_size=16 holds 16"),
    ({"task": "mqar", "pairs": 0}, "data.pairs=0 must be a positive integer or a list of them"),
    ({"task": "mqar", "seq_len": 65}, "data.seq_len=65 is longer than the model's window, model.context_length=64"),
    ({"task": "noisy_in_context_recall", "noise": 1.0}, "data.noise=1.0 must be in [0, 1)"),
    ({"task": "selective_copying", "tokens": 40}, "data.tokens=40 needs a body of at least 40 positions"),
    ({"task": "k_hop", "hops": [1, 30]}, "data.hops=[1, 30] must be at most 20"),
])
def test_a_setting_a_task_cannot_take_is_refused_naming_it(settings, message):
    with pytest.raises(UsageError) as refused:
        make_task({**SETS, **settings}, 64)
    assert message in str(refused.value)


# -------- a task run through train.py
TASK_RUN = ["data=task", "data.task=mqar", "data.pairs=[2,4]", "data.vocab_size=16", "data.train_examples=64",
            "position=none", "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
            "model.context_length=16", "model.tie_embeddings=false", "train.batch_size=8", "train.time_budget=null",
            "train.max_steps=8", "train.eval_tokens=64", "train.eval_interval=4", "train.ckpt_interval=4",
            "train.sample_interval=8", "train.sample_tokens=4", "train.log_interval=1"]


@pytest.fixture(scope="module")
def task_run(workdir) -> Path:
    run_dir = workdir / "whole"
    done = run_train(run_dir, *TASK_RUN, f"data.cache_dir={workdir / 'cache'}", "wandb.mode=offline")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_a_task_runs_accuracy_per_level_is_in_its_metrics_summary_and_wandb(task_run):
    evals = [m for m in metrics(task_run) if "val_loss" in m]
    assert [m["step"] for m in evals] == [4, 8]
    for m in evals:
        assert {"val_acc", "val_acc/pairs=2", "val_acc/pairs=4"} <= m.keys() and "val_bpb" not in m
        assert m["val_acc"] == pytest.approx((m["val_acc/pairs=2"] + m["val_acc/pairs=4"]) / 2)
        assert 0 <= m["val_acc"] <= 1
    ran = summary(task_run)
    assert ran["name"] == "mqar-llama_tiny-position=none" and ran["val_acc"] == evals[-1]["val_acc"]
    [offline] = (task_run / "wandb").glob("offline-run-*/run-*.wandb")
    read = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--summary", "--json",
                           str(offline)], capture_output=True, text=True, timeout=120)
    theirs = json.loads(read.stdout)["summary"]
    assert theirs["val_acc/pairs=4"] == ran["val_acc/pairs=4"] and theirs["val_acc"] == ran["val_acc"]


def test_a_task_run_killed_outright_resumes_bit_exact(workdir):
    """Killed with SIGKILL past its first checkpoint, wherever that finds it, then resumed to 4 steps past the
    checkpoint it left: the same losses, accuracy and weights as a run of those steps in one go (one schedule,
    train.lr_decay_steps, for both)."""
    settings = [*TASK_RUN, f"data.cache_dir={workdir / 'cache'}", "wandb.mode=disabled", "train.lr_decay_steps=1000"]
    run_dir = workdir / "killed"
    started = start_script(ROOT / "train.py", *settings, "train.max_steps=100000", f"hydra.run.dir={run_dir}")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and started.poll() is None:  # past the step-4 checkpoint
            if (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 5:
                break
            time.sleep(0.05)
        os.kill(started.pid, signal.SIGKILL)
    finally:
        started.kill()
        started.wait()
    end = torch.load(run_dir / "ckpt" / "train_state.pt", weights_only=True)["progress"]["step"] + 4
    resumed = run_train(run_dir, "train.resume=true", f"train.max_steps={end}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert OmegaConf.load(run_dir / "config.yaml").train.lr_decay_steps == 1000  # its own, fixed: not max_steps
    whole = run_train(workdir / "unbroken", *settings, f"train.max_steps={end}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    once, again = metrics(workdir / "unbroken"), metrics(run_dir)
    assert [m["train_loss"] for m in again] == [m["train_loss"] for m in once] and len(once) == end
    assert again[-1]["val_acc/pairs=4"] == once[-1]["val_acc/pairs=4"]
    ours = load_file(run_dir / "ckpt" / "model.safetensors")
    theirs = load_file(workdir / "unbroken" / "ckpt" / "model.safetensors")
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_generate_answers_a_query_from_a_task_checkpoint(task_run):
    """The checkpoint's tokenizer writes each symbol as one character: a prompt of pairs and a query comes back
    with one more character per token generated."""
    done = run_script(ROOT / "generate.py", "--ckpt", str(task_run), "--prompt", "0a1b0", "--max-new-tokens", "3",
                      "--temperature", "0", "--ignore-eos")
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout.strip().splitlines()[-1]
    assert text.startswith("0a1b0") and len(text) == len("0a1b0") + 3


def test_compare_reads_a_task_run_by_its_accuracy(task_run, capsys):
    import compare

    compare.main([str(task_run)])
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["val acc"] == f"{summary(task_run)['val_acc']:.4f}" and cells["Δ acc vs baseline"] == "(baseline)"


def test_a_task_setting_on_a_corpus_is_refused_naming_it(tmp_path):
    from data import prepare_data

    corpus = {"name": "text", "source": "text", "path": str(tmp_path / "a.txt"), "vocab_size": None,
              "val_fraction": 0.1, "cache_dir": str(tmp_path), "num_proc": 1, "task": None, "pairs": 8}
    with pytest.raises(UsageError) as refused:
        prepare_data(corpus, 32, 4)
    assert str(refused.value) == "data.pairs=8 is a setting of a synthetic task (data=task), not of data.path=" \
                                 f"{str(tmp_path / 'a.txt')!r}"


def test_memorization_counts_the_bits_its_test_loss_leaves_known():
    """128 facts of 7 bits each (V = 256): all of them at a loss of 0, none at the uniform guess's ln 128."""
    task = task_at("memorization")
    assert task.metrics({"val_loss": 0.0}, 1000) == {"bits_stored": 896.0, "bits_per_param": 0.896}
    assert task.metrics({"val_loss": math.log(128)}, 1000)["bits_stored"] == pytest.approx(0.0, abs=1e-9)
    assert task.metrics({"val_loss": math.log(128) / 2}, 1000)["bits_stored"] == pytest.approx(448.0)


def test_no_k_hop_answer_is_its_own_start():
    """f is one cycle through every symbol, so that 'the answer is the start' scores nothing at any level."""
    task = task_at("k_hop")
    for level in task.levels:
        inputs, targets = task.generate(500, level, np.random.default_rng(0))
        scored = np.argwhere(targets != IGNORE)
        assert all(inputs[row, column] != targets[row, column] for row, column in scored)
