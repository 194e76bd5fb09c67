"""train.py -m: every job of a sweep in a dir of its own, named by its swept overrides; a failed job makes the
whole command exit non-zero and is named; compare.py reads the layout."""
import subprocess

import pytest

import compare
from data_helpers import ROOT, TRAIN, TRAIN_ENV

# tiny_run's settings without its run dir and link: a multirun names its own dirs
SWEEP_SETTINGS = ["train.seed=0", "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
                  "model.context_length=32", "train.batch_size=8", "train.micro_batch_size=4", "train.max_steps=6",
                  "train.eval_tokens=256", "train.sample_tokens=8", "wandb.mode=disabled", "latest_link=null"]


def multirun(workdir, tiny, *overrides) -> subprocess.CompletedProcess:
    data = [o for o in tiny if o.startswith("data")]
    return subprocess.run([*TRAIN, "-m", *overrides, *data, *SWEEP_SETTINGS, f"hydra.sweep.dir={workdir / 'sweep'}"],
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
