"""The optimizer (train.optimizer, the `optim` group) and the learning-rate schedule.

adamw: AdamW with decoupled weight decay on the weight matrices only, at train.lr.
muon:  Muon (training/muon.py) for the blocks' weight matrices, at train.muon_lr, and AdamW as above for the
       rest (the token embedding and the LM head tied to it, norms' gains, biases), at train.lr: the split of
       nanochat and modded-nanogpt. Muon's update has AdamW's typical rms, so train.lr's scale fits it too.
       Each of the matrices stacked in one weight (Wq, Wk, Wv; W1, W3) is orthogonalised on its own.

Decayed: the weights of every nn.Linear and nn.Embedding (the attention and FFN projections, the
token embedding and the LM head tied to it). Not decayed: norm gains and biases, linear biases and
the learned position table: pulling them towards 0 would fight their role (a gain of 1, an offset,
a position signal) without any regularising benefit.

The learning rate is one shape over the fraction f of the run done before a step, and s, the
fraction that step takes (training/horizon.py gives both, from whichever limit is nearer its end):
    warm-up   f < w:      lr * min(1, (f + s) / w)            w = train.warmup_fraction
    cosine    w <= f < 1: min_lr + (lr - min_lr) * (1 + cos(pi * (f - w) / (1 - w))) / 2
    floor     f >= 1:     min_lr
or, with train.decay_fraction d set, warm-up-stable-decay (WSD: MiniCPM's; modded-nanogpt's and nanochat's
warm-down) in place of the cosine, the peak held until the last d of the run:
    stable    w <= f < 1 - d: lr
    decay     1 - d <= f < 1: lr - (lr - min_lr) * (f - (1 - d)) / d
Counted in steps, f = step / S and s = 1 / S, so the warm-up is lr * (step + 1) / (w S): a function of the
step alone, which is all a resumed run needs to continue it bit for bit.
"""
import math

import torch
from omegaconf import DictConfig
from torch import nn

from training.muon import Muon


OPTIMIZERS = ("adamw", "muon")


def make_optimizer(model: nn.Module, train: DictConfig) -> "torch.optim.Optimizer | MuonAdamW":
    muon = block_matrices(model) if train.optimizer == "muon" else {}
    adamw = adamw_for([p for p in model.parameters() if p not in muon], model, train)
    if not muon:
        return adamw
    matrices = Muon(muon, lr=train.muon_lr, weight_decay=train.weight_decay)
    matrices.param_groups[0]["lr_scale"] = train.muon_lr / train.lr  # the schedule is train.lr's shape: set_lr
    return MuonAdamW(matrices, adamw)


def block_matrices(model: nn.Module) -> dict[nn.Parameter, list[int]]:
    """The weights of the blocks' linear layers (attention's and the FFN's projections), Muon's, each with the
    row counts of the matrices stacked in it (the layer's stacked_rows; one matrix if it has none)."""
    return {m.weight: getattr(m, "stacked_rows", [m.out_features])
            for block in model.blocks for m in block.modules() if isinstance(m, nn.Linear)}


def adamw_for(params: list[nn.Parameter], model: nn.Module, train: DictConfig) -> torch.optim.AdamW:
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    groups = [{"params": [p for p in params if id(p) in matrices], "weight_decay": train.weight_decay},
              {"params": [p for p in params if id(p) not in matrices], "weight_decay": 0.0}]
    # fused: one kernel for the whole update instead of a dozen per tensor
    return torch.optim.AdamW(groups, lr=train.lr, betas=tuple(train.betas), fused=True)


class MuonAdamW:
    """Muon's matrices and AdamW's rest, stepped, zeroed, saved and loaded as one optimizer."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def set_lr(optimizer: "torch.optim.Optimizer | MuonAdamW", lr: float) -> None:
    """lr: the schedule's value for train.lr; a group with its own peak (Muon's) follows it in proportion."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def lr_at(done: float, step: float, train: DictConfig) -> float:
    """The learning rate of a step that starts at fraction `done` of the run and takes fraction `step` of it."""
    warmup = train.warmup_fraction
    if done < warmup:
        return train.lr * min(1.0, (done + step) / warmup)
    if done >= 1:
        return train.min_lr
    if train.decay_fraction is not None:
        decayed = max(0.0, done - (1 - train.decay_fraction)) / train.decay_fraction
        return train.lr - (train.lr - train.min_lr) * decayed
    progress = (done - warmup) / (1 - warmup)
    return train.min_lr + (train.lr - train.min_lr) * (1 + math.cos(math.pi * progress)) / 2
