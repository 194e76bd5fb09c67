"""The training loss, and the validation metrics computed from it over a fixed set of batches.

    loss = mean over the B*T positions of -log p(y | x)            (nats per token)
    val_ppl = exp(val_loss)
    val_bpb = val_loss / ln 2 / bytes_per_token                     (bits per byte of val text)
    val_acc = the mean over a task's levels of the share of its answers that are the argmax (tasks/)
bpb divides out the tokenizer: a bigger vocab packs more bytes into each token, which raises the
loss per token but not the cost per byte, so bpb compares runs across vocab sizes and corpora. A synthetic task
has no text: its loss and accuracy are at its scored positions only (its other targets are IGNORE).
"""
import math
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch import nn

from tasks.base import IGNORE
from model.moe import max_violation


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x, y: [B, T] token ids, y[:, t] the token after x[:, t]. The logits [B, T, V] go to fp32 at
    least for the softmax, which bf16 autocast would otherwise compute in bf16 (fp64 stays fp64)."""
    return cross_entropy(model(x), y)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean of -log p(y) over the targets that are not IGNORE, from logits [B, T, V]."""
    logits = logits.flatten(0, 1)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), y.flatten(),
                           ignore_index=IGNORE)


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor, str | None]],
             autocast: AbstractContextManager, bytes_per_token: float | None) -> dict:
    """The metrics over every target of the batches (the last batch may be the smaller: each counts by its targets),
    and an MoE's routing over them (routing_metrics). A batch's level name (a task's: '' where it has one level,
    None for text) makes its accuracy count, as val_acc and val_acc/<level>; bytes_per_token (text's) makes val_bpb
    and val_ppl."""
    model.eval()
    nats, targets, tokens, routing, levels = 0.0, 0, 0, {}, {}
    with autocast:
        for x, y, level in batches:
            logits = model(x)
            scored = y != IGNORE
            n_scored = scored.sum().item()
            nats += cross_entropy(logits, y).item() * n_scored
            targets, tokens = targets + n_scored, tokens + y.numel()
            if level is not None:
                right, count = levels.get(level, (0, 0))
                hits = (logits.argmax(-1)[scored] == y[scored]).sum().item()
                levels[level] = (right + hits, count + n_scored)
            for layer, moe in model.moe_layers().items():  # each block's loads and entropy, weighted by targets
                load, entropy = routing.get(layer, (0, 0))
                last = moe.last_routing()
                routing[layer] = (load + last["load"] * y.numel(), entropy + last["entropy"] * y.numel())
    model.train()
    metrics = {"val_loss": nats / targets}
    if bytes_per_token is not None:
        val_loss = metrics["val_loss"]
        metrics |= {"val_bpb": val_loss / math.log(2) / bytes_per_token,
                    "val_ppl": math.exp(val_loss) if val_loss < 700 else math.inf}  # exp(710) overflows a float
    if levels:
        shares = {level: right / count for level, (right, count) in levels.items()}
        metrics["val_acc"] = sum(shares.values()) / len(shares)
        metrics |= {f"val_acc/{level}": share for level, share in shares.items() if level}
    return metrics | routing_metrics({layer: (load / tokens, entropy / tokens)
                                      for layer, (load, entropy) in routing.items()})


def routing_metrics(routing: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """From each MoE block's loads f [E] (the fraction of the k choices per expert) and its router's entropy:
        moe/load/<block>/<e>   f_e
        moe/max_vio/<block>    max_e f_e / mean_e f_e - 1    (Wang et al. 2024's MaxVio; 0 is perfect balance)
        moe/entropy/<block>    the router's mean entropy over tokens / ln E  (1: uniform scores, 0: one expert)
        moe/max_vio            the mean of the blocks' MaxVio
    """
    metrics = {}
    for layer, (load, entropy) in routing.items():
        metrics |= {f"moe/load/{layer}/{e}": f for e, f in enumerate(load.tolist())}
        metrics |= {f"moe/max_vio/{layer}": max_violation(load), f"moe/entropy/{layer}": entropy.item()}
    if routing:
        metrics["moe/max_vio"] = sum(metrics[f"moe/max_vio/{layer}"] for layer in routing) / len(routing)
    return metrics


def divergence(train_loss: float, grad_norm: float, model: nn.Module) -> str | None:
    """What went non-finite, or None: a NaN/inf loss or gradient, or weights that AdamW pushed to inf (its
    decay term with a huge lr). The weights are the same on every process, so all reach the same verdict."""
    weights_finite = torch.stack([p.isfinite().all() for p in model.parameters()]).all().item()
    if math.isfinite(train_loss) and math.isfinite(grad_norm) and weights_finite:
        return None
    return (f"train loss {train_loss:.4g}, grad norm {grad_norm:.4g}, "
            f"weights {'finite' if weights_finite else 'not finite'}")
