"""A multirun (python train.py -m ...) that keeps every run and fails loudly.

Each job trains in a dir of its own, named by the overrides that differ between the jobs: the keys swept
on the command line (train.lr=1e-3,1e-2) or in hydra.sweeper.params, with this job's values, e.g.
multirun/<date>/<time>/train.lr=0.001 (configs/config.yaml's hydra.sweep.subdir, `${swept:}`, settings.py). The
overrides every job shares stay out of the name, which they would make longer than a file name may be.
A job that fails does not stop the others: the sweep goes on, and at its end FailedJobs makes the whole
command exit 1 with one `error:` line that names every failed job, so a sweep that lost runs never
reports success. (A signal still stops the sweep at once: train.py exits with it.)
"""
import sys

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback


class FailedJobs(Callback):
    def __init__(self):
        self.jobs, self.failed = 0, []

    def on_job_end(self, config, job_return, **kwargs) -> None:
        self.jobs += 1
        code = job_return.return_value if job_return.status == JobStatus.COMPLETED else 1
        if code:
            self.failed.append(f"{job_return.hydra_cfg.hydra.runtime.output_dir} (exit {code})")

    def on_multirun_end(self, config, **kwargs) -> None:
        if self.failed:
            print(f"error: {len(self.failed)} of {self.jobs} jobs failed: {', '.join(self.failed)}", file=sys.stderr)
            sys.exit(1)
