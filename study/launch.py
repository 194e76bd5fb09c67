"""A study's runs launched as Hydra multiruns (sweep.py's stages, scripts/equal_time.py, scripts/long_context.py):
every point one job in a dir of its own, kept when it has a result, resumed when it has none, stopped cleanly on a
signal."""
import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from cli import run_command
from errors import UsageError
from settings import compose_config
from training.multirun import RECORDS, die_with_parent, how_it_ended
from training.run_lock import dir_lock
from training.tracking import read_summary


ROOT = Path(__file__).resolve().parents[1]  # the repo's root, where train.py is
# Where a study's runs go: set by launch(), so the overrides after -- may not
PLACEMENT = ("ablation", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.searchpath")


def finished(run_dir: Path) -> dict | None:
    """The summary of a run that ended by itself (completed or diverged), else None."""
    summary = read_summary(run_dir)
    reason = summary.get("stop_reason", "")
    return summary if reason == "completed" or reason.startswith("diverged") else None


class RunFailed(UsageError):
    """Runs that ended without a result of their own (completed or diverged): a bad setting, mostly."""


class StudyStopped(Exception):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) while the study ran: the runs in progress saved and stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def study_dir(out: Path):
    """The study's dir, this process's alone while the study runs (a second study there is one error line)."""
    with dir_lock(out / ".lock", f"--out {out} is in use by another study (pid {{pid}}); wait for it to end"):
        yield


def check_overrides(overrides: list[str], points: list, experiment: str = "ablation") -> DictConfig:
    """The overrides after --, refused before anything is written: one that sets what the study's points set
    themselves (a point's config would lose to it), and any that cannot be composed (a mistyped key or value, an
    unknown launcher or one whose plugin is not installed). Returns the first point's config, hydra's included."""
    own = set(PLACEMENT).union(*(point.settings() for point in points))
    for override in overrides:
        key = override.split("=")[0].lstrip("+~")
        if key in own:
            raise UsageError(f"{override}: the study sets {key} for each run itself")
    return compose_config([f"+experiment={experiment}", f"ablation={points[0].variant}", *overrides],
                          return_hydra_config=True)


def launch(points: list, out: Path, overrides: list[str], stage: str, done: list, experiment: str = "ablation") -> None:
    """Trains the points (each with a variant, a name and its settings) that have no result yet in OUT/<name>,
    as one Hydra multirun: python train.py -m +experiment=<experiment> <overrides> +point=<name>,<name>,...
    (configs/experiment/: ablation's model and budget, or the speedrun's).

    Each point is a config of the group `point`, written to OUT/.plan/point/<name>.yaml; the multirun's launcher
    (basic, joblib, submitit_slurm, ...: the overrides choose it) runs them, each in OUT/<name>. A point whose
    run was stopped or killed resumes from its checkpoint (a multirun's train.resume=auto), one that never saved
    one starts again; nothing is deleted. The multirun's output goes to OUT/logs/<stage>.log; a line is printed
    as each run ends. SIGINT reaches the multirun as SIGINT, SIGTERM and SIGHUP as SIGTERM, once: its jobs save
    and stop, and so does the study (StudyStopped). Should this process be killed outright, the multirun gets
    SIGTERM from the OS (die_with_parent)."""
    todo = [p for p in points if finished(out / p.name) is None]
    if len(todo) < len(points):
        print(f"{stage}: {len(points) - len(todo)} of {len(points)} runs kept from an earlier call", flush=True)
    if not todo:
        return
    with dir_lock(out / RECORDS / "lock", f"--out {out}: a multirun of an earlier call still runs there (pid {{pid}}); "
                                          f"wait for it to end, or stop it with kill -INT {{pid}}"):
        pass  # not one run dir is touched while another process trains in it
    plan = out / ".plan"
    for point in todo:
        write_point_config(plan, point)
    log = out / "logs" / f"{stage}.log"
    log.parent.mkdir(exist_ok=True)
    command = [sys.executable, str(ROOT / "train.py"), "-m", f"+experiment={experiment}", "hydra.sweeper.params=null",
               f"hydra.searchpath=[file://{plan.resolve()}]", f"hydra.sweep.dir={out}",
               "hydra.sweep.subdir=${hydra:runtime.choices.point}", *overrides,
               "+point=" + ",".join(p.name for p in todo)]
    print(f"{stage}: {len(todo)} runs, as one multirun (its output: {log})", flush=True)
    started, waiting = time.perf_counter(), list(todo)
    with open(log, "a") as output:
        multirun = start_multirun(command, output)
        with signals_passed_to(multirun) as stopped_by:
            while waiting:
                ended = multirun.poll() is not None
                for point, summary in [(p, finished(out / p.name)) for p in waiting]:
                    if summary is None:
                        continue
                    waiting.remove(point)
                    done.append(point)
                    result = f"val bpb {summary['val_bpb']:.4f}" if "val_bpb" in summary else summary["stop_reason"]
                    print(f"[{len(done)}] {point.name}: {result} "
                          f"({time.perf_counter() - started:.0f} s into the stage)", flush=True)
                if ended:
                    break
                try:  # a second between looks, or less: the stage ends as soon as its multirun does
                    multirun.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
            multirun.wait()
    if stopped_by:
        raise StudyStopped(stopped_by[0])
    if waiting:
        records = [json.loads(record.read_text()) for record in (out / RECORDS).glob("[0-9]*.json")]  # each job's end
        ends = {Path(record["dir"]).resolve(): how_it_ended(record["exit_code"]) for record in records}
        failed = ", ".join(f"{p.name} ({ends.get((out / p.name).resolve(), f'multirun exit {multirun.returncode}')})"
                           for p in waiting)
        raise RunFailed(f"{stage}: {len(waiting)} of {len(todo)} runs ended without a result: {failed}; "
                        f"their output: {log}")


@contextmanager
def signals_passed_to(process: subprocess.Popen):
    """While the block runs, SIGINT reaches the process as SIGINT, SIGTERM and SIGHUP as SIGTERM, once (a second
    SIGINT would abort its runs before their checkpoints); yields the list that records that first signal."""
    stopped_by = []

    def stop(signum, frame):
        if not stopped_by:
            stopped_by.append(signum)
            process.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield stopped_by
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start_multirun(command: list[str], output, cwd: Path = ROOT) -> subprocess.Popen:
    """The stage's `python train.py -m ...` (or a benchmark's one run: scripts/time_to_loss.py), its stdout and
    stderr into output. In a session of its own: a terminal's Ctrl-C reaches this process alone, which passes it on
    exactly once (a second SIGINT would abort the runs before their checkpoints); it ends when this process does."""
    return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                            preexec_fn=die_with_parent)


def write_point_config(plan: Path, point) -> None:
    """The point as a config of the group `point`: its variant, then its own settings."""
    settings = OmegaConf.create()
    for key, value in point.settings().items():
        OmegaConf.update(settings, key, value)
    config = plan / "point" / f"{point.name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"# @package _global_\ndefaults:\n  - override /ablation: {point.variant}\n\n"
                      f"{OmegaConf.to_yaml(settings)}")


RESUMES = ("the runs in progress saved a checkpoint and stopped; the same command resumes the study (finished runs "
           "are kept, stopped ones continue from their checkpoints)")  # a study of train.py runs


def run_main(study, resumes: str = RESUMES) -> None:
    """Runs a study as a script does: bad input is one `error:` line and exit 2; a signal one line, saying what the
    stop kept (resumes), and 128 + its number (130 for Ctrl-C)."""
    try:
        status = run_command(study)
    except (StudyStopped, KeyboardInterrupt) as stopped:  # a KeyboardInterrupt: Ctrl-C between two stages
        signum = getattr(stopped, "signum", signal.SIGINT)
        print(f"stopped: {signal.Signals(signum).name}: {resumes}", file=sys.stderr)
        sys.exit(128 + signum)
    if status:
        sys.exit(status)
