"""The training loss, and the validation metrics computed from it over a fixed set of batches.

    loss = mean over the B*T positions of -log p(y | x)            (nats per token)
    val_ppl = exp(val_loss)
    val_bpb = val_loss / ln 2 / bytes_per_token                     (bits per byte of val text)
bpb divides out the tokenizer: a bigger vocab packs more bytes into each token, which raises the
loss per token but not the cost per byte, so bpb compares runs across vocab sizes and corpora.
"""
import math
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch import nn

from model.moe import max_violation


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x, y: [B, T] token ids, y[:, t] the token after x[:, t]. The logits [B, T, V] go to fp32 at
    least for the softmax, which bf16 autocast would otherwise compute in bf16 (fp64 stays fp64)."""
    logits = model(x).flatten(0, 1)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), y.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], autocast: AbstractContextManager,
             bytes_per_token: float) -> dict:
    """The metrics over every token of the batches (the last batch may be the smaller: each counts by its tokens),
    and an MoE's routing over them (routing_metrics)."""
    model.eval()
    nats, routing = 0.0, {}
    with autocast:
        for x, y in batches:
            nats += next_token_loss(model, x, y).item() * y.numel()
            for layer, moe in model.moe_layers().items():  # each block's loads and entropy, weighted by tokens
                load, entropy = routing.get(layer, (0, 0))
                last = moe.last_routing()
                routing[layer] = (load + last["load"] * y.numel(), entropy + last["entropy"] * y.numel())
    model.train()
    tokens = sum(y.numel() for _, y in batches)
    val_loss = nats / tokens
    val_ppl = math.exp(val_loss) if val_loss < 700 else math.inf  # exp(710) overflows a float
    return {"val_loss": val_loss, "val_bpb": val_loss / math.log(2) / bytes_per_token, "val_ppl": val_ppl,
            **routing_metrics({layer: (load / tokens, entropy / tokens) for layer, (load, entropy) in routing.items()})}


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
