"""train.py -m under Hydra's basic, joblib and submitit_local launchers: every job of a sweep in a dir of its own,
named by its swept overrides; a failed job makes the whole command exit non-zero and is named; a job killed with
SIGKILL costs itself alone, a signal to the launching command stops every job once, each saving, and the same
command resumes them; a sweep dir in use, an unknown launcher and one whose plugin is not installed are one line;
compare.py reads the layout."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

import compare
from data_helpers import ROOT, TRAIN_ENV, hashes, run_script, start_script, summary
from settings import compose_config
from study.runs import find_run_dirs, load_run
from training.multirun import RECORDS, run_job
from training.run_lock import dir_lock, lock_holder

# tiny_run's settings without its run dir and link: a multirun names its own dirs
SWEEP_SETTINGS = ["train.seed=0", "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.n_kv_heads=1",
                  "model.context_length=32", "train.batch_size=8", "train.micro_batch_size=4", "train.max_steps=6",
                  "train.eval_tokens=256", "train.sample_tokens=8", "wandb.mode=disabled", "latest_link=null"]


def multirun(workdir, tiny, *overrides, command=None) -> subprocess.CompletedProcess:
    """`python train.py -m` (a fork of this process: data_helpers.run_script) or `command -m`, until it ends."""
    data = [o for o in tiny if o.startswith("data")]
    args = ["-m", *data, *SWEEP_SETTINGS, *overrides, f"hydra.sweep.dir={workdir / 'sweep'}"]
    if command is None:
        return run_script(ROOT / "train.py", *args)
    return subprocess.run([*command, *args], cwd=ROOT, env=TRAIN_ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def no_process_outlives_the_test(descendants):
    """Whatever a multirun starts (its jobs, a launcher's workers and their helpers) ends with it."""
    before = set(descendants.seen)
    yield
    descendants.sample()
    left = descendants.outliving(descendants.seen - before)
    assert not left, f"processes this test started outlived it (killed now): {left}"


# the tests that read the lr multirun share one process under pytest -n (--dist loadgroup), which runs it once
LR_SWEEP = pytest.mark.xdist_group("lr_sweep")


@pytest.fixture(scope="module")
def lr_sweep(workdir, tiny):
    done = multirun(workdir, tiny, "+experiment=ablation", "ablation=baseline,postnorm", "train.lr=1e-3,1e-2")
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir / "sweep"


@LR_SWEEP
def test_an_lr_multirun_keeps_every_run_in_a_dir_of_its_own(lr_sweep):
    runs = sorted(str(d.relative_to(lr_sweep)) for d in find_run_dirs(lr_sweep))
    assert runs == [f"{variant}/train.lr={lr},train.seed=0" for variant in ("baseline", "postnorm")
                    for lr in ("0.001", "0.01")]
    assert all(load_run(lr_sweep / run).problem is None for run in runs)


@LR_SWEEP
def test_a_finished_multirun_run_again_leaves_every_job_as_it_is(lr_sweep, workdir, tiny):
    """The basic launcher (the other launchers: the test below): each finished job says it is complete and writes
    nothing, so compare.py reads the same records."""
    jobs = compare.find_run_dirs(lr_sweep)
    before = {job: hashes(job) for job in jobs}
    again = multirun(workdir, tiny, "+experiment=ablation", "ablation=baseline,postnorm", "train.lr=1e-3,1e-2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert {job: hashes(job) for job in jobs} == before
    assert all(f"{job} is complete: 6 steps, ended by train.max_steps" in again.stderr for job in jobs)


@LR_SWEEP
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


# rerun: the same command again. What a rerun keeps is each job's own choice (training/multirun.py), whatever
# process runs it, so one launcher shows it: submitit's, whose jobs run as on a SLURM node.
@pytest.mark.parametrize("launcher, rerun", [(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], False),
                                             (["hydra/launcher=submitit_local"], True)],
                         ids=["joblib", "submitit_local"])
def test_a_launcher_keeps_every_job_and_a_failed_one_fails_the_multirun(workdir, tiny, launcher, rerun):
    """The jobs run in other processes (joblib's workers; submitit's, as on a SLURM node): each names its own dir
    from the multirun's swept keys, and each records its end where the launching process reads it."""
    sweep = workdir / launcher[0].split("=")[1] / "sweep"
    jobs = ["train.threads=1", "train.lr=1e-3,-1", "wandb.mode=offline"]  # one job trains, the other fails
    done = multirun(sweep.parent, tiny, *launcher, *jobs)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"error: 1 of 2 jobs failed: {sweep / 'train.lr=-1'} (exit 2)"
    trained = sweep / "train.lr=0.001"
    assert summary(trained)["stop_reason"] == "completed"
    assert "lr: 0.001\n" in (trained / "config.yaml").read_text()  # its own job's settings
    # its W&B files in the sweep's wandb dir, where `wandb leet <sweep>/wandb` browses a sweep's runs side by side
    logged = [json.loads(subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--summary",
                                         "--json", str(run)], capture_output=True, text=True, timeout=120).stdout)
              for run in (sweep / "wandb").glob("offline-run-*")]
    assert [run["summary"]["val_bpb"] for run in logged] == [summary(trained)["val_bpb"]]
    if not rerun:
        return
    # the same command again: the finished job's files stay byte for byte, the failed one runs (and fails) again
    finished = hashes(trained)
    again = multirun(sweep.parent, tiny, *launcher, *jobs)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == done.stderr.strip().splitlines()[-1]
    assert hashes(trained) == finished


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
    ("foo", None, "In 'hydra/config': Could not find 'hydra/launcher/foo' Available options in 'hydra/launcher': "
                   "basic joblib submitit_local submitit_slurm"),
    ("submitit_slurm", WITHOUT_PLUGINS,
     'hydra/launcher=submitit_slurm: its plugin is not installed; pip install -e ".[cluster]" installs it')])
def test_an_unknown_or_missing_launcher_is_one_line_before_any_job(workdir, tiny, launcher, command, message):
    sweep = workdir / f"launcher-{launcher}" / "sweep"
    done = multirun(sweep.parent, tiny, f"hydra/launcher={launcher}", "train.lr=1e-3,2e-3", command=command)
    assert (done.returncode, done.stderr.strip()) == (2, f"error: {message}")
    assert not sweep.exists()


def wait_for(condition, what: str, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the multirun ended (exit {process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.1)


def alive(pid: int | None) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, TypeError):
        return False


# Jobs that train until a signal ends them: 600 s of budget, which no job of these tests reaches
STOPPABLE = ["train.seed=0,1,2", "train.time_budget=600", "train.max_steps=null", "train.threads=1",
             "train.log_interval=1", "train.ckpt_interval=1000"]


@pytest.mark.parametrize("launcher, signum", [([], signal.SIGINT),
                                              (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], signal.SIGTERM),
                                              (["hydra/launcher=submitit_local"], signal.SIGINT)],
                         ids=["basic-SIGINT", "joblib-SIGTERM", "submitit_local-SIGINT"])
def test_a_killed_job_costs_itself_alone_and_a_signal_stops_every_job_once(workdir, tiny, launcher, signum):
    """kill -9 of one job's training process: the launcher goes on. Then a signal to the launching process: every
    running job saves and stops, no job starts, none outlives the command, whose last line names each job's end."""
    sweep = workdir / f"stopped-{launcher[0].split('=')[1] if launcher else 'basic'}" / "sweep"
    data = [o for o in tiny if o.startswith("data")]
    command = ["-m", *data, *SWEEP_SETTINGS, *launcher, *STOPPABLE, f"hydra.sweep.dir={sweep}"]
    jobs = [sweep / f"train.seed={seed}" for seed in range(3)]
    started = start_script(ROOT / "train.py", *command, new_session=True)
    try:
        training = lambda: [job for job in jobs if (job / "metrics.jsonl").is_file()]  # noqa: E731
        wait_for(training, "job training", started)
        killed = training()[0]
        os.kill(lock_holder(killed / ".lock"), signal.SIGKILL)
        wait_for(lambda: set(training()) - {killed}, "second job training", started)  # the launcher went on
        started.send_signal(signum)
        _, err = started.communicate(timeout=120)
    finally:
        started.kill()
    assert started.returncode == 128 + signum, err[-3000:]
    ends = err.strip().splitlines()[-1]
    name = signal.Signals(signum).name
    assert ends.startswith(f"stopped: {name}: 3 of 3 jobs stopped before their end: ") and \
        ends.endswith("; the same command resumes them"), ends
    assert f"{killed} (killed by SIGKILL)" in ends
    for job in set(jobs) - {killed}:
        assert f"{job} (stopped by {name})" in ends or f"{job} (never started)" in ends, ends
        assert not alive(lock_holder(job / ".lock"))  # no job outlives the command
        if f"{job} (stopped by {name})" in ends:  # it saved the step it stopped after
            saved = summary(job)
            assert saved["stop_reason"] == name and (job / "ckpt" / "config.json").is_file()
    if not launcher:  # the same command again, with an end in sight: the stopped and killed jobs resume, the rest start
        again = run_script(ROOT / "train.py", *command, "train.max_steps=12")
        assert again.returncode == 0, again.stderr[-3000:]
        assert all(summary(job)["stop_reason"] == "completed" for job in jobs)
        resumed = [job for job in jobs if f"{job} | resumed at step" in again.stdout]
        assert resumed == [job for job in jobs if f"{job} (stopped by {name})" in ends]


def test_a_launching_process_killed_outright_leaves_no_process_running(workdir, tiny, descendants):
    """kill -9 of the launching command (a closed terminal, an out-of-memory kill): its jobs get SIGTERM, save and
    stop, whichever process ran them (joblib's workers here), and every process it started ends: loky's workers,
    which would wait for more tasks (the third one here, which never got a job, too), and loky's resource
    trackers."""
    before = set(descendants.seen)
    sweep = workdir / "orphans" / "sweep"
    data = [o for o in tiny if o.startswith("data")]
    two_jobs = [o for o in STOPPABLE if not o.startswith("train.seed=")] + ["train.seed=0,1"]
    started = start_script(ROOT / "train.py", "-m", *data, *SWEEP_SETTINGS, "hydra/launcher=joblib",
                           "hydra.launcher.n_jobs=3", *two_jobs, f"hydra.sweep.dir={sweep}", new_session=True)
    jobs = [sweep / f"train.seed={seed}" for seed in range(2)]
    try:
        wait_for(lambda: all((job / "metrics.jsonl").is_file() for job in jobs), "two jobs training", started)
        descendants.sample()
        training = {lock_holder(job / ".lock") for job in jobs}  # forks of their workers, named as those are
        workers = [line for line in descendants.running(descendants.seen - before)
                   if "LokyProcess" in line and int(line.split()[0]) not in training]
        started.kill()
        started.wait()
        pids = [lock_holder(job / ".lock") for job in jobs]
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not any(alive(pid) for pid in pids)
    assert len(workers) == 3, workers  # the three workers, seen while two of them ran the jobs
    assert descendants.outliving(descendants.seen - before) == []  # within processes.GRACE_S of the kill
    assert [summary(job)["stop_reason"] for job in jobs] == ["SIGTERM", "SIGTERM"]
    assert all((job / "ckpt" / "config.json").is_file() for job in jobs)


def test_a_job_killed_while_it_prints_leaves_the_next_job_free_to_print(tmp_path):
    """A job killed while its progress bar holds tqdm's write lock (a bar refreshes every step): the next job of
    the same launcher still prints, since no lock is shared between jobs' processes for a dead one to keep."""
    sweep = tmp_path / "sweep"
    cfg = compose_config([f"hydra.sweep.dir={sweep}", f"hydra.runtime.output_dir={sweep / 'job'}"],
                         return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)

    def dies_printing(cfg) -> int:
        tqdm.get_lock().acquire()
        os.kill(os.getpid(), signal.SIGKILL)

    def prints(cfg) -> int:  # 10 s: a lock nobody else holds is taken at once
        return 0 if tqdm.get_lock().acquire(timeout=10) else 3

    try:  # held as the basic launcher's launching process holds it, so that run_job keeps this process's handlers
        with dir_lock(sweep / RECORDS / "lock", "held by this test, as the launching process holds it"):
            assert run_job(cfg, dies_printing) == -signal.SIGKILL
            assert run_job(cfg, prints) == 0
    finally:
        HydraConfig.instance().cfg = None
