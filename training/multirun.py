"""A multirun (python train.py -m ..., under any Hydra launcher) that keeps every run, stops cleanly and fails loudly.

Hydra's launchers run a job where they like: in the launching process (basic), in a worker process (joblib),
in a process of its own or on another machine (submitit_local, submitit_slurm). Everything here works from
what Hydra hands each job, never from the launching process's memory or its sys.argv:

- Each job trains in a dir of its own, named by the keys the multirun sweeps, with this job's values:
  multirun/<date>/<time>/train.lr=0.001 (configs/config.yaml's hydra.sweep.subdir, `${swept:${swept_keys:}}`).
  The keys are those with several values on the command line (train.lr=1e-3,1e-2) or in hydra.sweeper.params,
  less hydra.job.config.override_dirname.exclude_keys; the keys every job shares stay out of the name, which
  they would make longer than a file name may be. The keys are read once, in the launching process, from the
  multirun's own overrides (MultirunRecord.on_multirun_start). Hydra copies that config's resolver cache into
  every job's config (so that `${now:}` names one sweep dir for all the jobs), and `${swept_keys:}` travels
  in it: a worker or a SLURM node gets the multirun's keys and takes only the values from its own job.
- Each job trains in a process of its own (run_job): a fork of whatever runs the job (the launching process,
  a joblib worker, a submitit process), made once the job's config is composed, which trains it as a single
  run in its dir. A kill of that process (SIGKILL, the out-of-memory killer) costs that job alone: the process
  that forked it records how it ended, and the launcher goes on to the next job.
- Each job records how it ended in <sweep dir>/.multirun/<job number>.json (its exit code; a negative one is
  the signal that killed it; null: it never started). At the end the launching process reads every record
  and, if any job failed, exits 1 with one `error:` line that names each failed job's dir and how it ended.
- SIGINT, SIGTERM or SIGHUP to the launching process stops the multirun: it writes <sweep dir>/.multirun/stop,
  each running job's starter passes the signal (SIGTERM for SIGHUP) to its training process exactly once, so
  that it saves a checkpoint and stops, and a job that had not started does not start. The command then exits
  128 + the signal's number with one line naming the stopped jobs. The training processes run in sessions of
  their own, so a terminal's Ctrl-C reaches them only this way, once; one whose starter dies (the launching
  process killed with SIGKILL) gets SIGTERM, so no job outlives the command that started it.
- The same command again continues the multirun: train.resume=null, the default, is `auto` for a job
  (resume where its dir holds a checkpoint, start where none is); a job that had finished says so and writes
  nothing (training/state.py's continue_settings), so its files stay byte for byte.
- No process outlives the command: a job's training process dies with its starter (the kernel's parent-death
  signal), and a worker that runs starters for the launching process (joblib's loky workers, a submitit job's
  process) ends once that process is gone and its job has saved (exit_when_orphaned).
- The launching process holds <sweep dir>/.multirun/lock for the whole multirun: a second multirun into the
  same sweep dir is one `error:` line, exit 2. The jobs leave latest_link where it was.
"""
import ctypes
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from errors import ConfigError
from storage.files import write_json
from training.run_lock import dir_lock, lock_holder

RECORDS = ".multirun"  # in the sweep dir: the lock, the stop request and each job's end
POLL_S = 0.2  # how often a job's starter looks for a stop request


def swept_keys(hydra: DictConfig) -> str:
    """The keys this multirun sweeps, from its own overrides and hydra.sweeper.params, comma-joined."""
    keys = {key.lstrip("+~") for key in hydra.sweeper.get("params") or {}}
    keys |= {override.key_or_group for override in OverridesParser.create().parse_overrides(list(hydra.overrides.task))
             if override.is_sweep_override()}
    return ",".join(sorted(keys - set(hydra.job.config.override_dirname.exclude_keys)))


def no_keys_outside_a_multirun() -> str:
    raise ConfigError("${swept_keys:} is known only inside a multirun (python train.py -m ...)")


def swept(keys: str, _root_) -> str:
    """This job's values of the swept keys as key=value,key=value, from the job's own overrides."""
    own = OverridesParser.create().parse_overrides(list(_root_.hydra.overrides.task))
    name = ",".join(sorted(o.input_line.lstrip("+~") for o in own if o.key_or_group in keys.split(","))) or "run"
    return name.replace("/", "_")  # a swept path names one dir, not a tree


# use_cache: the value resolved in the launching process is the one every job's config gets (see above)
OmegaConf.register_new_resolver("swept_keys", no_keys_outside_a_multirun, use_cache=True, replace=True)
OmegaConf.register_new_resolver("swept", swept, replace=True)


def carry_swept_keys(config: DictConfig) -> None:
    """Resolves ${swept_keys:} in the multirun's config, the one every job's config is made from, so that its
    resolver cache holds the keys Hydra then copies into each job's config."""
    keys = swept_keys(config.hydra)
    OmegaConf.register_new_resolver("swept_keys", lambda: keys, use_cache=True, replace=True)
    OmegaConf.select(config, "hydra.sweep.subdir", throw_on_resolution_failure=False)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child before it runs (a fork, or Popen's preexec_fn): Linux sends it `signum` when its parent ends,
    however it ends (kill -9 included). Elsewhere a no-op; a job's starter also checks for its parent itself
    (run_job)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG


def job_settings(cfg: DictConfig, hydra: DictConfig) -> None:
    """What a job's run sets for itself: its W&B files go to the sweep dir and its group is the sweep's (unless
    set); the latest-run link stays where it was; a job that was stopped or killed resumes when run again
    (train.resume=auto, unless set)."""
    cfg.latest_link = None
    cfg.wandb.dir = cfg.wandb.dir or hydra.sweep.dir
    cfg.wandb.group = cfg.wandb.group or hydra.sweep.dir
    cfg.train.resume = "auto" if cfg.train.resume is None else cfg.train.resume


def run_job(cfg: DictConfig, run: Callable[[DictConfig], int]) -> int | None:
    """One job of a multirun, where its launcher runs it: `run` trains it in a process of its own (a fork of this
    one, which has composed the job's config and imported what training needs), in a session of its own; this
    process waits for it and passes a stop request on once. Returns the run's exit code (negative: the signal
    that killed it), or None where the multirun was stopped before the job started."""
    hydra = HydraConfig.get()
    records = Path(hydra.sweep.dir) / RECORDS
    if (records / "stop").exists():
        return None
    parent, own_signal = os.getppid(), []
    launching = lock_holder(records / "lock") == os.getpid()  # basic: the launching process, whose handler stops
    if not launching:  # a worker: a terminal's Ctrl-C is the launching process's to pass on; a scheduler's TERM ours
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda signum, frame: own_signal.append(signal.SIGTERM))
        exit_when_orphaned(parent)  # a joblib worker's watch has run since its start (watch_loky_workers)
    import torch._dynamo  # noqa: F401  what torch's optimizers import when the first is made (~1 s): once, here
    sys.stdout.flush(), sys.stderr.flush()  # what is buffered is this process's to print, not the fork's too
    forking = os.getpid()
    with _job_running:
        pid = os.fork()
        if pid == 0:
            os._exit(run_forked(cfg, hydra, run, forking))
        passed = False
        while not (ended := os.waitpid(pid, os.WNOHANG))[0]:
            orphaned = not launching and os.getppid() != parent  # the launching process died: no job outlives it
            stop = stop_signal(records) or ((own_signal or orphaned) and signal.SIGTERM)
            # once the run holds its dir it stops at a step, saving; before, a signal could land before its handler
            if stop and not passed and lock_holder(Path(hydra.runtime.output_dir) / ".lock") == pid:
                os.kill(pid, stop)
                passed = True
            time.sleep(POLL_S)
        return os.waitstatus_to_exitcode(ended[1])


_job_running = threading.Lock()  # held by a job's starter while its training process runs
_watching = []  # the worker's watchdog: started with its first job, or with a joblib worker itself


def exit_when_orphaned(parent: int) -> None:
    """In a worker that runs jobs for the launching process (joblib's loky workers, a submitit job's process): a
    watchdog thread that ends this process once the launching process is gone, after the job it runs (if any) has
    saved and stopped. Loky keeps its workers alive for the next tasks and makes them ignore SIGTERM, and loky's
    own timeout would leave them for minutes; the kernel's parent-death signal (prctl) cannot be set for them here
    (they exist before the first job) and would fire when the thread that spawned them ends, not the process.
    A worker's end closes its end of loky's resource tracker's pipe, which then ends too."""
    if _watching:
        return

    def watch():
        while os.getppid() == parent:
            time.sleep(POLL_S)
        with _job_running:  # the job's starter passes SIGTERM on and waits for its run to save and end
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(128 + signal.SIGTERM)

    _watching.append(threading.Thread(target=watch, name="exit-when-orphaned", daemon=True))
    _watching[0].start()


def watch_loky_workers(watching: bool) -> None:
    """In the launching process of a joblib multirun, at its start (watching) and end: each loky worker it starts
    runs exit_when_orphaned from its start, not from its first job. A worker that never gets one (more workers than
    jobs, or jobs that come after a stop) then ends with the launching process too, where it would wait out loky's
    idle timeout (5 minutes). Hydra's joblib launcher asks joblib for its backend by the name "loky": the name is
    given again, with the initializer (joblib's register_parallel_backend; its LokyBackend passes extra settings to
    loky's executor), and given back its plain backend at the end."""
    from joblib import register_parallel_backend
    from joblib.parallel import LokyBackend

    backend = functools.partial(LokyBackend, initializer=exit_when_orphaned, initargs=(os.getpid(),))
    register_parallel_backend("loky", backend if watching else LokyBackend)


def run_forked(cfg: DictConfig, hydra: DictConfig, run: Callable[[DictConfig], int], forking: int) -> int:
    """In the fork: the job's run, as a single run in the job's dir. It ends with os._exit, never returning into
    the launcher's code (its handlers, its atexit hooks are the parent's)."""
    try:
        os.setsid()  # a terminal's Ctrl-C is the launching process's, passed on once
        die_with_parent()
        if os.getppid() != forking:  # it died before the line above could ask for its end to reach this process
            return 128 + signal.SIGTERM
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)  # the parent's handlers are not the run's
        # tqdm's default write lock is a semaphore shared by every process forked after it was made: a job killed
        # while its bar held it (a bar refreshes every step) would leave it taken, and the next job waiting forever
        tqdm.set_lock(threading.RLock())
        job_settings(cfg, hydra)
        return run(cfg)
    except BaseException:  # an exception the run does not turn into an exit code: its traceback, and exit 1
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()


def stop_signal(records: Path) -> int:
    """The signal a stopped multirun passes to its jobs' training processes, 0 while it runs on."""
    try:
        return signal.Signals[(records / "stop").read_text().strip()]
    except (OSError, KeyError):
        return 0


def how_it_ended(code: int | None) -> str:
    if code is None:
        return "never started"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"stopped by {signal.Signals(code - 128).name}"
    return f"exit {code}"


_held = ExitStack()  # the launching process's lock on the sweep dir, from the multirun's start to its end
_stopped_by = []  # the signal that stopped the multirun, in the launching process


def request_stop(records: Path, signum: int, frame=None) -> None:
    """The launching process's handler of SIGINT, SIGTERM and SIGHUP: every job's starter passes the stop on."""
    if not _stopped_by:
        _stopped_by.append(signum)
        passed_on = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
        (records / "stop").write_text(signal.Signals(passed_on).name)


class MultirunRecord(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        records = Path(config.hydra.sweep.dir) / RECORDS
        try:
            _held.enter_context(dir_lock(records / "lock", f"hydra.sweep.dir={config.hydra.sweep.dir} is in use by "
                                         "another multirun (pid {pid}); wait for it to end or choose another"))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        for stale in [*records.glob("*.json"), records / "stop"]:  # an earlier multirun's, in the same sweep dir
            stale.unlink(missing_ok=True)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda signum, frame: request_stop(records, signum))
        if "joblib" in config.hydra.launcher._target_:
            watch_loky_workers(True)
        carry_swept_keys(config)

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        """Runs where the job's starter ran: its end goes to the sweep dir, where the launching process reads it."""
        if config.hydra.mode != RunMode.MULTIRUN:  # a single run's job: nobody reads a record
            return
        code = job_return.return_value if job_return.status == JobStatus.COMPLETED else 1
        write_json(Path(config.hydra.sweep.dir) / RECORDS / f"{config.hydra.job.num}.json",
                   {"dir": config.hydra.runtime.output_dir, "exit_code": code})

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        records = [json.loads(path.read_text()) for path in
                   sorted((Path(config.hydra.sweep.dir) / RECORDS).glob("[0-9]*.json"), key=lambda p: int(p.stem))]
        _held.close()
        if "joblib" in config.hydra.launcher._target_:
            watch_loky_workers(False)
        if _stopped_by:
            name = signal.Signals(_stopped_by[0]).name
            stopped = [f"{r['dir']} ({how_it_ended(r['exit_code'])})" for r in records if r["exit_code"] != 0]
            print(f"stopped: {name}: {len(stopped)} of {len(records)} jobs stopped before their end: "
                  f"{', '.join(stopped)}; the same command resumes them", file=sys.stderr)
            sys.exit(128 + _stopped_by[0])
        failed = [f"{r['dir']} ({how_it_ended(r['exit_code'])})" for r in records if r["exit_code"]]
        if failed:
            print(f"error: {len(failed)} of {len(records)} jobs failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)
        print(f"multirun: {len(records)} jobs in {config.hydra.sweep.dir}", file=sys.stderr)
