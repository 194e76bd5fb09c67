"""scripts/recall_study.py: the study's lines trained on MQAR itself, each run's result written when it ends and kept
by a rerun; its budget in steps or (a fake clock here) seconds; bad input one line, before any run; Ctrl-C one line."""
import json
import math
import os
import signal
import time

import pytest

from data.recall import recall_batch
from data_helpers import ROOT, start_script
from scripts import recall_study

TINY = ["--", "model.d_model=32", "model.n_heads=2", "model.context_length=32", "train.batch_size=8"]


def study(out, *flags) -> list[str]:
    return ["--out", str(out), "--vocab", "32", "--pairs", "2", "4", "--sequences", "8", "--threads", "1", *flags]


def test_each_run_is_trained_on_the_task_and_kept_by_a_rerun(tmp_path, capsys):
    args = study(tmp_path, "--variants", "baseline", "gdn_hybrid", "--seeds", "1", "--steps", "12",
                 "--json", str(tmp_path / "recall.json"), *TINY)
    recall_study.main(args)
    out = capsys.readouterr().out
    assert out.count("training") == 2
    table = out.splitlines()[-4:]
    assert table[0] == "| line | lr | steps | 2 pairs | 4 pairs |"
    assert [row.split(" | ")[:3] for row in table[2:]] == [
        ["| baseline", "0.004", "12"], ["| gdn_hybrid", "0.016", "12"]]
    written = json.loads((tmp_path / "recall.json").read_text())
    assert [(run["variant"], run["seed"], run["steps"]) for run in written["runs"]] == [
        ("baseline", 0, 12), ("gdn_hybrid", 0, 12)]
    assert all(0 <= accuracy <= 1 for run in written["runs"] for accuracy in run["accuracy"].values())
    assert all(0 < run["last_loss"] < 2 * math.log(32) for run in written["runs"])  # ln 32 = 3.47 at the start
    result = tmp_path / "baseline" / "lr0.004" / "seed0" / "result.json"  # the line's own learning rate
    before = result.read_text()

    recall_study.main(args)  # nothing left to train: the results as they were
    assert "training" not in capsys.readouterr().out and result.read_text() == before
    # a seed is one run: the same batches, the same held-out sequences, the same numbers in another study
    recall_study.main(study(tmp_path / "again", "--variants", "baseline", "--seeds", "1", "--steps", "12", *TINY))
    again = json.loads((tmp_path / "again" / "baseline" / "lr0.004" / "seed0" / "result.json").read_text())
    assert {key: again[key] for key in ("accuracy", "last_loss")} == {
        key: written["runs"][0][key] for key in ("accuracy", "last_loss")}


def test_a_budget_in_seconds_ends_the_run_at_that_much_training_time(tmp_path, monkeypatch, capsys):
    ticks = iter(range(10_000))
    monkeypatch.setattr(recall_study.time, "perf_counter", lambda: float(next(ticks)))  # each step takes 1 s
    recall_study.main(study(tmp_path, "--variants", "baseline", "--seeds", "1", "--seconds", "5", *TINY))
    result = json.loads((tmp_path / "baseline" / "lr0.004" / "seed0" / "result.json").read_text())
    assert (result["steps"], result["trained_s"]) == (5, 5.0)


@pytest.mark.parametrize("flags, message", [
    (["--steps", "2", "--pairs", "20"], "--pairs 20 with --vocab 32: each at least 1, and 2 x the largest distinct "
                                        "tokens at most the vocabulary"),
    (["--steps", "2", "--pairs", "9", "--vocab", "64"], "--pairs 9: its sequences of 36 tokens are longer than a "
                                                        "model's context, 32"),
    (["--steps", "0"], "--steps=0 must be > 0"),
    (["--steps", "2", "--lrs", "0.01", "0"], "--lrs 0.01 0.0: each must be > 0"),
    (["--steps", "2", "--lrs-of", "nowhere"], "--lrs-of=nowhere: no finished run of baseline, gdn_hybrid, gdn_all there"),
    (["--steps", "2", "--variants", "nosuch"], "In 'experiment/ablation': Could not find 'ablation/nosuch'")])
def test_bad_input_is_one_line_before_any_run(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        recall_study.main(study(tmp_path, *flags, *TINY))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {message}") and len(captured.err.splitlines()) == 1
    assert "training" not in captured.out and not any(tmp_path.iterdir())


def test_training_batches_hold_the_scored_numbers_of_pairs_only(tmp_path, monkeypatch):
    drawn = []

    def recording(batch, pairs, tokens, generator):
        drawn.append(pairs)
        return recall_batch(batch, pairs, tokens, generator)
    monkeypatch.setattr(recall_study, "recall_batch", recording)
    recall_study.main(study(tmp_path, "--variants", "baseline", "--seeds", "1", "--steps", "40", *TINY))
    assert set(drawn) == {2, 3, 4}  # from the smallest --pairs (2) to the largest (4): never 1


def test_a_lines_best_rate_is_the_one_with_the_highest_accuracy_over_every_number_of_pairs():
    runs = {0.001: {"accuracy": {"4": 0.9, "32": 0.1}}, 0.003: {"accuracy": {"4": 0.6, "32": 0.5}},
            0.01: {"accuracy": {"4": 0.0, "32": 0.0}}}
    assert recall_study.best_lr(runs) == 0.003  # 0.55 over the pairs, against 0.5 and 0
    assert recall_study.best_lr({0.001: runs[0.001], 0.002: runs[0.001]}) == 0.001  # a tie: the first


def test_the_grid_trains_the_first_seed_at_each_rate_and_the_others_at_each_lines_best(tmp_path, capsys):
    grid = tmp_path / "grid"
    args = study(grid, "--variants", "baseline", "--seeds", "2", "--steps", "30", "--lrs", "0.0001", "0.01",
                 "--json", str(tmp_path / "grid.json"), *TINY)
    recall_study.main(args)
    written = json.loads((tmp_path / "grid.json").read_text())
    scores = {run["lr"]: sum(run["accuracy"].values()) / 2 for run in written["grid"]}
    best = max(scores, key=scores.get)  # a tie: the lower rate, the grid's first
    assert written["best_lr"] == {"baseline": best}
    assert sorted(str(p.relative_to(grid)) for p in grid.rglob("result.json")) == sorted(
        ["baseline/lr0.0001/seed0/result.json", "baseline/lr0.01/seed0/result.json",
         f"baseline/lr{best:g}/seed1/result.json"])
    assert [(run["lr"], run["seed"]) for run in written["runs"]] == [(best, 0), (best, 1)]
    seed0 = json.loads((grid / "baseline" / "lr0.01" / "seed0" / "result.json").read_text())
    assert seed0["lr"] == 0.01
    printed = capsys.readouterr().out
    assert f"| baseline | {scores[0.0001]:.4f} | {scores[0.01]:.4f} |" in printed

    # another budget, each line at its best rate of the grid: one run per seed, at that rate only
    again = tmp_path / "again"
    recall_study.main(study(again, "--variants", "baseline", "--seeds", "1", "--steps", "5", "--lrs-of",
                            str(grid), *TINY))
    assert [str(p.relative_to(again)) for p in again.rglob("result.json")] == [f"baseline/lr{best:g}/seed0/result.json"]


def test_ctrl_c_stops_the_study_with_one_line_and_exit_130(tmp_path):
    """A real SIGINT in the middle of a run, to the whole group as a terminal's Ctrl-C: the run is dropped (no result),
    and the study ends with one `stopped:` line and 130, as sweep.py does, not a traceback."""
    log, out = tmp_path / "study.log", tmp_path / "out"
    with log.open("w") as output:
        started = start_script(ROOT / "scripts" / "recall_study.py", *study(out, "--variants", "baseline", "--seeds",
                                                                            "1", "--seconds", "600", *TINY),
                               new_session=True, output=output,
                               preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}))
        try:
            deadline = time.monotonic() + 60
            while "training" not in log.read_text() and time.monotonic() < deadline and started.poll() is None:
                time.sleep(0.05)
            os.killpg(started.pid, signal.SIGINT)
            assert started.wait(60) == 130, log.read_text()[-2000:]
        finally:
            started.kill()
    assert log.read_text().splitlines() == [
        "baseline lr 0.004 seed 0: training",
        "stopped: SIGINT: a run in progress is dropped; the same command resumes the study (runs with a result.json "
        "are kept, the others train from the start)"]
    assert not list(out.rglob("result.json"))
