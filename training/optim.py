"""AdamW with decoupled weight decay on the weight matrices only, and the learning-rate schedule.

Decayed: the weights of every nn.Linear and nn.Embedding (the attention and FFN projections, the
token embedding and the LM head tied to it). Not decayed: norm gains and biases, linear biases and
the learned position table: pulling them towards 0 would fight their role (a gain of 1, an offset,
a position signal) without any regularising benefit.

The learning rate is one shape over the fraction f of the run done before a step, and s, the
fraction that step takes (training/horizon.py gives both, from whichever limit is nearer its end):
    warm-up   f < w:      lr * min(1, (f + s) / w)            w = train.warmup_fraction
    cosine    w <= f < 1: min_lr + (lr - min_lr) * (1 + cos(pi * (f - w) / (1 - w))) / 2
    floor     f >= 1:     min_lr
Counted in steps, f = step / S and s = 1 / S, so the warm-up is lr * (step + 1) / (w S): a function of the
step alone, which is all a resumed run needs to continue it bit for bit.
"""
import math

import torch
from omegaconf import DictConfig
from torch import nn


def make_optimizer(model: nn.Module, train: DictConfig) -> torch.optim.AdamW:
    matrices = {id(m.weight): m.weight for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    others = [p for p in model.parameters() if id(p) not in matrices]  # parameters() lists a tied weight once
    groups = [{"params": list(matrices.values()), "weight_decay": train.weight_decay},
              {"params": others, "weight_decay": 0.0}]
    # fused: one kernel for the whole update instead of a dozen per tensor
    return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas), fused=True)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def lr_at(done: float, step: float, train: DictConfig) -> float:
    """The learning rate of a step that starts at fraction `done` of the run and takes fraction `step` of it."""
    warmup = train.warmup_fraction
    if done < warmup:
        return train.lr * min(1.0, (done + step) / warmup)
    if done >= 1:
        return train.min_lr
    progress = (done - warmup) / (1 - warmup)
    return train.min_lr + (train.lr - train.min_lr) * (1 + math.cos(math.pi * progress)) / 2
