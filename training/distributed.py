"""Data-parallel training under torchrun: one process per device, gradients averaged by DDP.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without them this is a single process. CPU
processes talk over gloo, CUDA ones over nccl, one GPU per process (cuda:LOCAL_RANK).
"""
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


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


def agree_on_step(ddp: Distributed, loss: torch.Tensor, stop_signal: int) -> tuple[float, int]:
    """Averages the step's loss over the processes and spreads a stop request to all of them,
    so every process logs the same loss and stops (or goes on) at the same step."""
    if ddp.world_size == 1:
        return loss.item(), stop_signal
    loss = loss.detach().float().clone()
    dist.all_reduce(loss)
    signal = torch.tensor(stop_signal, device=loss.device)
    dist.all_reduce(signal, op=dist.ReduceOp.MAX)
    return loss.item() / ddp.world_size, int(signal.item())


def from_master(ddp: Distributed, values: list[float]) -> list[float]:
    """Rank 0's values on every process: what a time budget decides from rank 0's clock (this step's
    lr, whether it is the last) must be the same decision everywhere."""
    if ddp.world_size == 1:
        return values
    shared = torch.tensor(values, dtype=torch.float64, device=ddp.device)
    dist.broadcast(shared, src=0)
    return shared.tolist()
