"""sweep.py end to end on a tiny model and corpus, its stages run by Hydra's launchers: 2 variants x 2 learning
rates, seeds at each best, then compare.py's learning-rate table, curve table, JSON and plot on the same dirs; a
second call, through the joblib launcher, keeps every finished run and runs one killed mid-way again; Ctrl-C stops
the study with one line and the same command resumes it; bad input, a failed run and a study dir in use are one
line."""
import json
import math
import os
import shlex
import signal
import time
from pathlib import Path

import pytest
from matplotlib.image import imread

import compare
import sweep
from data_helpers import ROOT, run_script, stages_in_forks, start_script, write_corpus
from study.launch import check_overrides
from study.lr_study import Point
from training.multirun import RECORDS
from training.run_lock import dir_lock, lock_holder

LRS = (3e-3, 3e-2)


def tiny_study(root: Path) -> list[str]:
    """Overrides for a study of tiny runs on write_corpus's text."""
    corpus = write_corpus(root / "corpus.txt")
    return ["data=text", f"data.path={corpus}", "data.vocab_size=300", f"data.cache_dir={root / 'cache'}",
            "data.num_proc=1", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
            "model.context_length=32", "train.batch_size=8", "train.micro_batch_size=8", "train.max_steps=6",
            "train.time_budget=null", "train.eval_interval=3", "train.eval_tokens=512", "wandb.mode=disabled",
            f"latest_link={root / 'latest'}"]


@pytest.fixture
def forked_stages():
    with stages_in_forks():
        yield


# the tests that read the study run in one process (pytest -n's --dist loadgroup), which trains it once: for the
# session, since a module's fixture is made again when that process comes back to the module from another one
STUDY = pytest.mark.xdist_group("study")


@pytest.fixture(scope="session")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    out = root / "study"
    args = ["--out", str(out), "--variants", "baseline", "--probe", "baseline", "--lrs", *map(str, LRS),
            "--seeds", "2", "--widen", "0", "--", *tiny_study(root)]
    with stages_in_forks():
        sweep.main(args)  # Hydra's basic launcher: the runs one after another
    return out, args


@STUDY
def test_every_point_of_the_study_ran_in_its_own_dir(study):
    out, _ = study
    best = json.loads((out / "best_lr.json").read_text())
    assert set(best) == {"baseline", "baseline-nowarmup"}
    for line, lr in best.items():
        assert lr in LRS
        for grid_lr in LRS:
            config = (out / line / f"lr{grid_lr:.4g}" / "seed0" / "config.yaml").read_text()
            assert f"lr: {grid_lr}" in config and f"min_lr: {grid_lr / 10:.6g}" in config
        seeds = sorted(d.name for d in (out / line / f"lr{lr:.4g}").iterdir())
        assert seeds == (["seed0"] if line.endswith("nowarmup") else ["seed0", "seed1"])
    assert "warmup_fraction: 0.0" in (out / "baseline-nowarmup" / f"lr{LRS[0]:.4g}" / "seed0" / "config.yaml").read_text()


@STUDY
def test_a_second_call_keeps_finished_runs_and_reruns_a_killed_one(study, capsys):
    out, args = study
    killed = out / "baseline" / f"lr{LRS[0]:.4g}" / "seed0"
    (killed / "summary.json").unlink()
    # a stage in an interpreter of its own, as always outside these tests: only its end shuts joblib's idle
    # workers down (a fork ends without the interpreter's exit, and would leave them to their parent-death watch)
    sweep.main([*args, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "train.threads=1"])  # in a worker process
    printed = capsys.readouterr().out
    assert "grid: 3 of 4 runs kept from an earlier call" in printed and "seeds: 1 of 1 runs kept" in printed
    assert [line for line in printed.splitlines() if line.startswith("[")] == [
        line for line in printed.splitlines() if line.startswith(f"[1] baseline/lr{LRS[0]:.4g}/seed0: val bpb ")]
    assert json.loads((killed / "summary.json").read_text())["stop_reason"] == "completed"
    assert "Joblib.Parallel(n_jobs=2" in (out / "logs" / "grid.log").read_text()  # the stage went through joblib


@STUDY
def test_compare_reads_the_study_as_a_learning_rate_sweep(study, tmp_path, capsys):
    out, _ = study
    compare.main([str(out), "--lr-plot", str(tmp_path / "lr.png"), "--plot", str(tmp_path / "curves.png"),
                  "--json", str(tmp_path / "numbers.json")])
    printed = capsys.readouterr().out
    header, _, *rows = printed.splitlines()[:5]
    assert header.startswith("| variant | best lr | LR sensitivity |")
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    best = json.loads((out / "best_lr.json").read_text())
    for line, values in numbers["variants"].items():
        finals = values["final_bpb_seed0"]
        assert values["best_lr"] == best[line] and finals[f"{best[line]:g}"] == min(finals.values())
        hand = sum(min(f, numbers["init_bpb"]) for f in finals.values()) / len(finals) - min(finals.values())
        assert values["lr_sensitivity"] == pytest.approx(hand)
        assert len(values["best_lr_val_bpb"]) == (1 if line.endswith("nowarmup") else 2)
    assert numbers["init_bpb"] == pytest.approx(math.log(300) / math.log(2) /
                                                 _bytes_per_token(out / "baseline" / f"lr{LRS[0]:.4g}" / "seed0"))
    for name in ("lr.png", "curves.png"):
        assert imread(tmp_path / name).shape[1] > 600


def _bytes_per_token(run_dir: Path) -> float:
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    return last["val_loss"] / last["val_bpb"] / math.log(2)


@pytest.mark.parametrize("args, message", [(["--lrs", "1e-3"], "--lrs 0.001: at least two"),
                                           (["--seeds", "0"], "--seeds 0 must be >= 1"),
                                           (["--", "train.lr=1"],
                                            "train.lr=1: the study sets train.lr for each run itself"),
                                           (["--", "hydra/launcher=foo"], "Could not find 'hydra/launcher/foo'")])
def test_bad_arguments_are_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_setting_that_cannot_be_composed_is_one_line_and_nothing_is_written(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--out", str(tmp_path / "study"), "--variants", "baseline", "--probe", "--lrs", "1e-3", "2e-3",
                    "--", "train.batch_size=abc"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: Error merging override train.batch_size=abc: Value 'abc' of type 'str' could not be converted to Integer"]
    assert not (tmp_path / "study").exists()


@pytest.mark.usefixtures("forked_stages")
def test_runs_that_fail_stop_the_study_with_one_line_that_names_them(tmp_path, capsys):
    out = tmp_path / "study"
    with pytest.raises(SystemExit) as exit_info:  # composes, but has no corpus to train on
        sweep.main(["--out", str(out), "--variants", "baseline", "--probe", "--lrs", "1e-3", "2e-3", "--",
                    *tiny_study(tmp_path), f"data.path={tmp_path / 'missing.txt'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: grid: 2 of 2 runs ended without a result: baseline/lr0.001/seed0 (exit 2), "
                   f"baseline/lr0.002/seed0 (exit 2); their output: {out / 'logs' / 'grid.log'}"]
    assert "missing.txt" in (out / "logs" / "grid.log").read_text() and not (out / "best_lr.json").exists()


def test_a_study_dir_in_use_is_one_line(tmp_path, capsys):
    with dir_lock(tmp_path / ".lock", "held by this test, as a running study holds it"):
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(["--out", str(tmp_path), "--variants", "baseline", "--probe", "--lrs", "1e-3", "2e-3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --out {tmp_path} is in use by another study (pid {os.getpid()}); wait for it to end"]


def unblocked_sigint() -> None:
    """Ctrl-C unblocked in the study's process, whatever mask the test worker that forks it has."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.usefixtures("forked_stages")
def test_ctrl_c_stops_the_study_with_one_line_and_the_same_command_resumes_it(tmp_path):
    out = tmp_path / "study"
    command = ["--out", str(out), "--variants", "baseline", "--probe", "--lrs", "1e-3", "2e-3", "--seeds", "1",
               "--widen", "0", "--", *tiny_study(tmp_path),
               # runs of 3 s on any machine: a margin for the signal's way to the run (it used to be 1 s, and the
               # run sometimes completed first on a busy machine)
               "train.max_steps=null", "train.time_budget=3", "train.log_interval=1",
               "train.ckpt_interval=1000", "train.sample_interval=1000"]  # the ablation's follow max_steps
    study = start_script(ROOT / "sweep.py", *command, new_session=True, preexec_fn=unblocked_sigint)
    first = out / "baseline" / "lr0.001" / "seed0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not first.exists() and time.monotonic() < deadline and study.poll() is None:
        time.sleep(0.1)
    os.killpg(study.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    _, err = study.communicate(timeout=120)
    assert study.returncode == 130, err[-2000:]
    assert err.splitlines() == ["stopped: SIGINT: the runs in progress saved a checkpoint and stopped; the same "
                                "command resumes the study (finished runs are kept, stopped ones continue from their "
                                "checkpoints)"]
    assert json.loads((first.parent / "summary.json").read_text())["stop_reason"] != "completed"
    again = run_script(ROOT / "sweep.py", *command)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [line.split(":")[0] for line in again.stdout.splitlines() if line.startswith("[")] == [
        "[1] baseline/lr0.001/seed0", "[2] baseline/lr0.002/seed0"]
    assert json.loads((first.parent / "summary.json").read_text())["ended_by"] == "time_budget"


@pytest.mark.usefixtures("forked_stages")
def test_the_study_is_planned_from_results_so_the_same_command_gives_the_same_study(tmp_path, capsys):
    """Learning rates far below the best, so that the highest is best on both sides of every step: the edge stage
    adds one point (--widen 1) and the study ends there. A point beyond the grid whose run lost its result (killed
    before its summary) trains again, and a finished study run again is the same study: no new point, no new
    best lr."""
    out = tmp_path / "study"
    args = ["--out", str(out), "--variants", "baseline", "--probe", "--lrs", "1e-5", "2e-5", "--seeds", "1",
            "--widen", "1", "--", *tiny_study(tmp_path)]
    sweep.main(args)
    assert "edges1: 1 runs" in capsys.readouterr().out
    assert json.loads((out / "best_lr.json").read_text()) == {"baseline": 4e-5}
    edge = out / "baseline" / "lr4e-05" / "seed0"
    (edge / "summary.json").unlink()
    sweep.main(args)
    ran = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert ran == ["[1] baseline/lr4e-05/seed0"] and json.loads((edge / "summary.json").read_text())["stop_reason"] == "completed"
    sweep.main(args)
    printed = capsys.readouterr().out
    assert "grid: 2 of 2 runs kept" in printed and "edges1: 1 of 1 runs kept" in printed
    assert not [line for line in printed.splitlines() if line.startswith("[")]
    assert sorted(d.name for d in (out / "baseline").iterdir()) == ["lr1e-05", "lr2e-05", "lr4e-05"]
    assert json.loads((out / "best_lr.json").read_text()) == {"baseline": 4e-5}


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP])
def test_a_study_killed_outright_stops_its_runs_and_a_live_multirun_is_never_touched(tmp_path, signum, capsys):
    """sweep.py killed (kill -9, or SIGHUP: a closed terminal): the multirun it started gets SIGTERM, and the run
    in progress saves and stops. While a multirun still holds the study's dir, the next call is one line and
    changes nothing."""
    out = tmp_path / "study"
    args = ["--out", str(out), "--variants", "baseline", "--probe", "--lrs", "1e-3", "2e-3", "--seeds", "1",
            "--widen", "0", "--", *tiny_study(tmp_path), "train.max_steps=null", "train.time_budget=600",
            "train.log_interval=1", "train.ckpt_interval=1000", "train.sample_interval=1000"]
    study = start_script(ROOT / "sweep.py", *args, new_session=True)
    run = out / "baseline" / "lr0.001" / "seed0"
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() and time.monotonic() < deadline and study.poll() is None:
        time.sleep(0.1)
    training, multirun = lock_holder(run / ".lock"), lock_holder(out / RECORDS / "lock")
    study.send_signal(signum)
    study.wait(timeout=60)
    deadline = time.monotonic() + 60
    while (_alive(training) or _alive(multirun)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(training) or _alive(multirun):
        for pid in (training, multirun):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the multirun went on after sweep.py got {signal.Signals(signum).name}")
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "SIGTERM"
    assert (run / "ckpt" / "config.json").is_file()
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
    with dir_lock(out / RECORDS / "lock", "held by this test, as a multirun of an earlier call would hold it"):
        with pytest.raises(SystemExit) as exit_info:
            sweep.main(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --out {out}: a multirun of an earlier call still runs there (pid {os.getpid()}); wait for it to "
        f"end, or stop it with kill -INT {os.getpid()}"]
    assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == before


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def slurm_overrides() -> list[str]:
    """What follows -- in docs/cluster.md's sweep.py command for a SLURM cluster, split as a shell splits it."""
    doc = (ROOT / "docs" / "cluster.md").read_text().replace("\\\n", " ")  # its lines go on after a backslash
    command = next(line for line in doc.splitlines() if line.startswith("python sweep.py") and "submitit_slurm" in line)
    words = shlex.split(command)
    return words[words.index("--") + 1:]


def test_the_slurm_command_of_docs_cluster_md_composes():
    """The overrides docs/cluster.md gives for a SLURM cluster pass the study's check and reach submitit's SLURM
    launcher with the doc's values, each of which changes the launcher's default."""
    overrides = slurm_overrides()
    doc = dict(o.removeprefix("hydra.launcher.").split("=", 1) for o in overrides if o.startswith("hydra.launcher."))
    assert overrides[0] == "hydra/launcher=submitit_slurm"
    assert doc.keys() >= {"partition", "gpus_per_node", "timeout_min", "array_parallelism"}
    points = [Point("baseline", 1e-3)]
    launcher = check_overrides(overrides, points).hydra.launcher
    default = check_overrides(overrides[:1], points).hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert {key: str(launcher[key]) for key in doc} == doc
    assert all(str(default[key]) != value for key, value in doc.items())
