"""train.py -m under Hydra's basic, joblib and submitit_local launchers: every job of a sweep in a dir of its own,
named by its swept overrides; a failed job makes the whole command exit non-zero and is named; a sweep dir in
use, an unknown launcher and one whose plugin is not installed are one line; compare.py reads the layout."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compare
from data_helpers import ROOT, TRAIN, TRAIN_ENV, summary
from training.multirun import RECORDS
from training.run_lock import dir_lock

# tiny_run's settings without its run dir and link: a multirun names its own dirs
SWEEP_SETTINGS = ["train.seed=0", "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
                  "model.context_length=32", "train.batch_size=8", "train.micro_batch_size=4", "train.max_steps=6",
                  "train.eval_tokens=256", "train.sample_tokens=8", "wandb.mode=disabled", "latest_link=null"]


def multirun(workdir, tiny, *overrides, command=TRAIN) -> subprocess.CompletedProcess:
    data = [o for o in tiny if o.startswith("data")]
    return subprocess.run([*command, "-m", *data, *SWEEP_SETTINGS, *overrides, f"hydra.sweep.dir={workdir / 'sweep'}"],
                          cwd=ROOT, env=TRAIN_ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def lr_sweep(workdir, tiny):
    done = multirun(workdir, tiny, "+experiment=ablation", "ablation=baseline,postnorm", "train.lr=1e-3,1e-2")
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir / "sweep"


def test_an_lr_multirun_keeps_every_run_in_a_dir_of_its_own(lr_sweep):
    runs = sorted(str(d.relative_to(lr_sweep)) for d in compare.find_run_dirs(lr_sweep))
    assert runs == [f"{variant}/train.lr={lr},train.seed=0" for variant in ("baseline", "postnorm")
                    for lr in ("0.001", "0.01")]
    assert all(compare.load_run(lr_sweep / run).problem is None for run in runs)


def test_compare_reads_the_multirun_as_an_lr_study(lr_sweep, capsys):
    compare.main([str(lr_sweep)])
    out = capsys.readouterr().out
    header, _, *rows = out.split("\n\n")[0].splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    cells = {row.split("|")[1].strip(): dict(zip(columns, (c.strip() for c in row.strip("|").split("|"))))
             for row in rows}
    assert sorted(cells) == ["baseline", "postnorm"]
    for variant in cells.values():  # both learning rates of each variant were kept: a sensitivity and a best lr
        assert variant["best lr"] in ("0.001", "0.01") and float(variant["LR sensitivity"]) >= 0
    assert "over the 2 learning rates every variant has (0.001, 0.01)" in out


def test_a_failed_job_fails_the_multirun_and_is_named(workdir, tiny):
    done = multirun(workdir / "failing", tiny, "train.lr=1e-3,-1")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"error: 1 of 2 jobs failed: {workdir / 'failing' / 'sweep' / 'train.lr=-1'} (exit 2)"
    assert "error: train.lr=-1.0 must be a positive number" in done.stderr
    assert (workdir / "failing" / "sweep" / "train.lr=0.001" / "summary.json").is_file()  # the other job ran


def test_a_multirun_with_an_unreadable_value_exits_non_zero(workdir, tiny):
    done = multirun(workdir / "mistyped", tiny, "train.lr=1e-3,abc")
    assert done.returncode != 0
    assert "train.lr=abc" in done.stderr and not (workdir / "mistyped" / "sweep" / "train.lr=0.001").exists()


@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
                                      ["hydra/launcher=submitit_local"]], ids=["joblib", "submitit_local"])
def test_a_launcher_keeps_every_job_and_a_failed_one_fails_the_multirun(workdir, tiny, launcher):
    """The jobs run in other processes (joblib's workers; submitit's, as on a SLURM node): each names its own dir
    from the multirun's swept keys, and each records its end where the launching process reads it."""
    sweep = workdir / launcher[0].split("=")[1] / "sweep"
    done = multirun(sweep.parent, tiny, *launcher, "train.threads=1", "train.lr=1e-3,2e-3,-1", "wandb.mode=offline")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"error: 1 of 3 jobs failed: {sweep / 'train.lr=-1'} (exit 2)"
    for lr in ("0.001", "0.002"):
        assert summary(sweep / f"train.lr={lr}")["stop_reason"] == "completed"
        assert f"lr: {lr}\n" in (sweep / f"train.lr={lr}" / "config.yaml").read_text()  # its own job's settings
    # both runs' W&B files in the sweep's wandb dir, where `wandb leet <sweep>/wandb` browses them side by side
    logged = [json.loads(subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--summary",
                                         "--json", str(run)], capture_output=True, text=True, timeout=120).stdout)
              for run in (sweep / "wandb").glob("offline-run-*")]
    assert sorted(run["summary"]["val_bpb"] for run in logged) == sorted(
        summary(sweep / f"train.lr={lr}")["val_bpb"] for lr in ("0.001", "0.002"))


def test_a_sweep_dir_in_use_by_another_multirun_is_one_line(workdir, tiny):
    sweep = workdir / "busy" / "sweep"
    with dir_lock(sweep / RECORDS / "lock", "held by this test, as a running multirun holds it"):
        done = multirun(sweep.parent, tiny, "train.lr=1e-3,2e-3")
    assert done.returncode == 2
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: hydra.sweep.dir={sweep} is in use by another multirun (pid {os.getpid()}); wait for it to end or "
        f"choose another"]
    assert not (sweep / "train.lr=0.001").exists()


# train.py with Hydra's plugin package emptied: no launcher plugin is installed, as on a machine without [cluster]
WITHOUT_PLUGINS = (sys.executable, "-c", "import runpy, sys, hydra_plugins; hydra_plugins.__path__ = []; "
                   "sys.argv[0] = 'train.py'; runpy.run_path('train.py', run_name='__main__')")


@pytest.mark.parametrize("launcher, command, message", [
    ("foo", TRAIN, "In 'hydra/config': Could not find 'hydra/launcher/foo' Available options in 'hydra/launcher': "
                   "basic joblib submitit_local submitit_slurm"),
    ("submitit_slurm", WITHOUT_PLUGINS,
     'hydra/launcher=submitit_slurm: its plugin is not installed; pip install -e ".[cluster]" installs it')])
def test_an_unknown_or_missing_launcher_is_one_line_before_any_job(workdir, tiny, launcher, command, message):
    sweep = workdir / f"launcher-{launcher}" / "sweep"
    done = multirun(sweep.parent, tiny, f"hydra/launcher={launcher}", "train.lr=1e-3,2e-3", command=command)
    assert (done.returncode, done.stderr.strip()) == (2, f"error: {message}")
    assert not sweep.exists()
