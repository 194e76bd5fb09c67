"""A multirun (python train.py -m ..., under any Hydra launcher) that keeps every run and fails loudly.

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
- A job that fails does not stop the others. Each job records how it ended in
  <sweep dir>/.multirun/<job number>.json, from the process that ran it; at the end, the launching process
  reads every record and, if any job failed, exits 1 with one `error:` line that names each failed job and its
  exit code. A sweep that lost runs never reports success. (A signal still stops the sweep at once: train.py
  exits with it. A job whose process was killed outright makes the launcher itself raise: joblib's
  TerminatedWorkerError, submitit's UncompletedJobError.)
- The launching process holds <sweep dir>/.multirun/lock for the whole multirun: a second multirun into the
  same sweep dir is one `error:` line, exit 2.
"""
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from errors import ConfigError
from storage.files import write_json
from training.run_lock import dir_lock

RECORDS = ".multirun"  # in the sweep dir: the lock and each job's end


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


_held = ExitStack()  # the launching process's lock on the sweep dir, from the multirun's start to its end


class MultirunRecord(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        records = Path(config.hydra.sweep.dir) / RECORDS
        try:
            _held.enter_context(dir_lock(records / "lock", f"hydra.sweep.dir={config.hydra.sweep.dir} is in use by "
                                         "another multirun (pid {pid}); wait for it to end or choose another"))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        for stale in records.glob("*.json"):  # an earlier multirun's, in the same sweep dir
            stale.unlink()
        carry_swept_keys(config)

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        """Runs where the job ran: its end goes to the sweep dir, where the launching process reads it."""
        if config.hydra.mode != RunMode.MULTIRUN:  # a single run's job: nobody reads a record
            return
        code = job_return.return_value if job_return.status == JobStatus.COMPLETED else 1
        write_json(Path(config.hydra.sweep.dir) / RECORDS / f"{config.hydra.job.num}.json",
                   {"dir": config.hydra.runtime.output_dir, "exit_code": code})

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        records = [json.loads(path.read_text()) for path in
                   sorted((Path(config.hydra.sweep.dir) / RECORDS).glob("*.json"), key=lambda p: int(p.stem))]
        _held.close()
        failed = [f"{r['dir']} (exit {r['exit_code']})" for r in records if r["exit_code"]]
        if failed:
            print(f"error: {len(failed)} of {len(records)} jobs failed: {', '.join(failed)}", file=sys.stderr)
            sys.exit(1)
