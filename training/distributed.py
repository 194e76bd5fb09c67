"""Data-parallel training under torchrun: one process per device, gradients averaged by DDP.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them this is a single process. CPU
processes talk over gloo, CUDA ones over nccl, one GPU per process (cuda:LOCAL_RANK).
"""
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Distributed:
    rank: int
    world_size: int
    device: torch.device

    @property
    def master(self) -> bool:
        """Rank 0 alone logs, evaluates, samples and writes checkpoints."""
        return self.rank == 0


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup_distributed(device: torch.device) -> Distributed:
    if world_size() == 1:
        return Distributed(0, 1, device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), device)


def data_parallel(ddp: Distributed, model: nn.Module) -> nn.Module:
    """The model to train: in DDP, wrapped so that backward averages the gradients over the processes."""
    if ddp.world_size == 1:
        return model
    return DistributedDataParallel(model, device_ids=[ddp.device.index] if ddp.device.type == "cuda" else None)


def syncing(ddp: Distributed, model: nn.Module, last_micro_batch: bool) -> AbstractContextManager:
    """DDP all-reduces the gradients in backward: only the last micro-batch of a step needs to, the ones
    before it accumulate locally."""
    return nullcontext() if ddp.world_size == 1 or last_micro_batch else model.no_sync()


def teardown_distributed(ddp: Distributed) -> None:
    if ddp.world_size > 1:
        dist.destroy_process_group()


@contextmanager
def master_first(ddp: Distributed):
    """Rank 0 runs the block first (e.g. building the data cache), then the others, which find it built."""
    if not ddp.master:
        dist.barrier()
    yield
    if ddp.master and ddp.world_size > 1:
        dist.barrier()


def agree_on_signal(ddp: Distributed, stop_signal: int) -> int:
    """A stop request on any process, spread to all of them before a step, so that every process stops
    at the same step, and none starts one that another will not finish."""
    if ddp.world_size == 1:
        return stop_signal
    signal = torch.tensor(stop_signal, device=ddp.device)
    dist.all_reduce(signal, op=dist.ReduceOp.MAX)
    return int(signal.item())


def mean_over_processes(ddp: Distributed, loss: torch.Tensor) -> float:
    """The step's loss averaged over the processes, so that every process logs the same number."""
    if ddp.world_size == 1:
        return loss.item()
    loss = loss.detach().float().clone()
    dist.all_reduce(loss)
    return loss.item() / ddp.world_size


def lost_a_process(ddp: Distributed, err: RuntimeError) -> bool:
    """Whether a collective failed because a peer is gone: NCCL raises DistError, gloo a RuntimeError from
    its TCP transport (connection reset or closed by the peer)."""
    return ddp.world_size > 1 and (isinstance(err, dist.DistError) or "gloo/transport" in str(err))


def lost_process_line(ddp: Distributed, err: Exception, step: int, run_dir) -> str:
    """The `error:` line of a run whose peer process died. With two processes the lost one is the other;
    with more, the backend's message says which connection broke."""
    others = [r for r in range(ddp.world_size) if r != ddp.rank]
    lost = f"rank {others[0]}" if len(others) == 1 else f"one of ranks {others[0]}..{others[-1]}"
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"error: lost process {lost} of {ddp.world_size} after step {step} ({reason}); saved {run_dir / 'ckpt'} "
            f"at step {step}: continue with torchrun ... train.py hydra.run.dir={run_dir} train.resume=true "
            f"(torchrun --max-restarts=N does that by itself)")


def summed_over_processes(ddp: Distributed, values: torch.Tensor) -> torch.Tensor:
    """values summed over the processes, in place: the same on every one (each MoE block's expert choices)."""
    if ddp.world_size > 1:
        dist.all_reduce(values)
    return values


def from_master(ddp: Distributed, values: Sequence[float]) -> Sequence[float]:
    """Rank 0's values on every process: what a time budget decides from rank 0's clock (this step's
    lr, whether it is the last) must be the same decision everywhere."""
    if ddp.world_size == 1:
        return values
    shared = torch.tensor(values, dtype=torch.float64, device=ddp.device)
    dist.broadcast(shared, src=0)
    return shared.tolist()
