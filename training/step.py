"""One optimizer step's forward and backward passes: its micro-batches' gradients accumulated, and the losses it logs.

    backward of  (loss_lm + sum_i w_i aux_i) / accum_steps     per micro-batch, the gradients summing over them
    train_loss = mean over the micro-batches (and processes) of loss_lm
    aux_i      = the same mean of each auxiliary loss (Transformer.aux_losses: an MoE's router_aux and router_z)

train_loss is the language model's alone, as val bpb is: the auxiliary losses, each weighted by its component
(Transformer.aux_loss), shape the gradients and are logged apart.
"""
from contextlib import AbstractContextManager
from typing import Callable, Iterable

import torch
from torch import nn

from model.transformer import Transformer
from training.distributed import Distributed, mean_over_processes, syncing


def accumulate_gradients(model: nn.Module, raw_model: Transformer, loss_of: Callable, batches: Iterable,
                         accum_steps: int, ddp: Distributed, autocast: AbstractContextManager
                         ) -> tuple[float, dict[str, float]]:
    """The backward passes of the step's accum_steps micro-batches (x, y) through model (raw_model, DDP-wrapped
    where it runs in several processes, which syncs the gradients on the last): its train_loss and auxiliary
    losses by name, each the mean over the micro-batches and processes."""
    loss_sum, aux_sums = torch.zeros((), device=ddp.device), {}
    for micro, (x, y) in enumerate(batches):
        with syncing(ddp, model, last_micro_batch=micro == accum_steps - 1):
            with autocast:
                loss = loss_of(model, x, y)
                aux = raw_model.aux_losses()  # {} for a model whose components have none
            ((loss + raw_model.aux_loss(aux)) / accum_steps).backward()
        loss_sum += loss.detach()
        for name, value in aux.items():
            aux_sums[name] = aux_sums.get(name, 0) + value.detach()
    train_loss = mean_over_processes(ddp, loss_sum / accum_steps)
    return train_loss, {name: mean_over_processes(ddp, value / accum_steps) for name, value in aux_sums.items()}
