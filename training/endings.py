"""How a run ends: at its horizon, or early by a signal, a loss gone non-finite or a lost DDP process.

An early end raises RunEnded from inside the loop, so that the loop reads as the steps alone and every
end goes through the same close: the checkpoint where one is owed, summary.json's stop_reason, the line
printed last and the exit code (0 done, 1 diverged, 2 a lost process, 128 + the signal's number).
"""
import math
import signal
from pathlib import Path

from torch import nn

from training.distributed import Distributed, agree_on_signal, lost_a_process, lost_process_line
from training.evaluate import divergence
from training.state import RunCheckpoint


class RunEnded(Exception):
    def __init__(self, reason: str, exit_code: int, line: str | None = None, process_lost: bool = False):
        super().__init__(reason)
        self.reason = reason  # summary.json's stop_reason: completed, diverged, a signal's name, a lost process
        self.exit_code = exit_code
        self.line = line  # why the run ended early, printed last
        self.process_lost = process_lost  # then there is no process group left to leave

    @property
    def completed(self) -> bool:
        return self.exit_code == 0


def stop_if_signalled(ddp: Distributed, signum: int, step: int, run_dir: Path) -> None:
    """Between two steps, so the last one's eval and checkpoint are done; every process stops at the same step."""
    signum = agree_on_signal(ddp, signum)
    if signum:
        name = signal.Signals(signum).name
        raise RunEnded(name, 128 + signum, f"{name}: stopped after step {step} and saved {run_dir / 'ckpt'}; "
                                           f"continue with python train.py hydra.run.dir={run_dir} train.resume=true")


def stop_if_diverged(train_loss: float, grad_norm: float, model: nn.Module, step: int, lr: float,
                     checkpoint: RunCheckpoint) -> None:
    """After the update of `step` and before anything is saved, so that the checkpoint keeps the last good weights."""
    problem = divergence(train_loss, grad_norm, model)
    if problem:
        kept = (f"the last good checkpoint is {checkpoint.dir} (step {checkpoint.step})"
                if checkpoint.step is not None else "no checkpoint had been saved yet")
        # step 1's loss is the starting weights' own, computed before any update: no learning rate made it
        cause = (f"the loss was not finite before the first update, so train.lr={lr} is not the cause: the model's "
                 f"settings or its starting weights give a non-finite loss" if step == 1 and not math.isfinite(
                     train_loss) else f"try a lower train.lr={lr}")
        raise RunEnded(f"diverged at step {step}", 1, f"error: training diverged at step {step} ({problem}); "
                                                      f"{cause}. Stopped; {kept}")


def process_lost(ddp: Distributed, err: RuntimeError, step: int, run_dir: Path) -> RunEnded:
    """A collective failed because a peer process died (training/distributed.py's lost_a_process); any other
    RuntimeError is a bug and goes on up."""
    if not lost_a_process(ddp, err):
        raise err
    return RunEnded(f"lost a process after step {step}", 2, lost_process_line(ddp, err, step, run_dir),
                    process_lost=True)
