"""What each block does to the residual stream, on the prompt, and what its FFN's activation looks like.

The stream: training/diagnostics.py's layer_stats (its formulas are there) with the prompt as the batch and
its next tokens as the targets: per block the stream's rms, each branch's rms over the stream's, the mean
cosine between positions and the gradient norm of the block's weights for that one batch's loss.

The FFN: the activation of each block's hidden units, as its FFN gives them (hidden_activations) for the input a
forward hook reads:
    SwiGLU: silu(x W1), the gate (before it multiplies x W3)      ReLU / GELU: relu(x W1) / gelu(x W1)
    ReLU²: relu(x W1)², what W2 reads
    MoE: silu(x W1_e), each expert's gate on the tokens its block's router sends it (a dense first block: SwiGLU's)
zero: the fraction exactly 0; near zero: the fraction with |a| < NEAR_ZERO * rms(a) over the layer.
The histogram spans the 0.1% to 99.9% quantiles of every layer's activations; what lies beyond is left out of
its bins (ReLU²'s right tail, the squares of the largest inputs, reaches far past the 99.9% quantile) and counted
in `beyond`, with `range` the smallest and largest activation, so the figure can say how far the axis cuts.
"""
import torch

from model.transformer import Transformer
from training.diagnostics import layer_stats

STREAM_STATS = ("stream_rms", "attn_ratio", "ffn_ratio", "position_cos", "grad_norm")
NEAR_ZERO = 0.1  # of the layer's activation rms: a unit a tenth as loud as a typical one passes little
HISTOGRAM_BINS = 60


def residual_stream(model: Transformer, tokens: torch.Tensor) -> dict:
    """tokens [1, T] (T >= 3, so that the batch tokens[:, :-1] has two positions to compare) -> {stat: [block]}."""
    stats = layer_stats(model, tokens[:, :-1], tokens[:, 1:])
    return {name: [stats[f"diag/{name}/{i}"] for i in range(len(model.blocks))] for name in STREAM_STATS}


def ffn_activations(model: Transformer, tokens: torch.Tensor) -> dict:
    """tokens [1, T] -> the FFN kind, per layer the zero and near-zero fractions, and the histogram of every
    layer's activations together (density over HISTOGRAM_BINS bins between their 0.1% and 99.9% quantiles, the
    share beyond them, the smallest and largest activation)."""
    found = []

    def keep(ffn, inputs, _output):  # the inputs of the forward that just ran (an MoE's router's picks too)
        found.append(ffn.hidden_activations(inputs[0]))

    hooks = [block.ffn.register_forward_hook(keep) for block in model.blocks]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    every = torch.cat(found)
    low, high = torch.quantile(every, torch.tensor([0.001, 0.999])).tolist()
    # histc leaves out what lies beyond the quantiles (clamped, the tails would pile up in the end bins as if they
    # were data); the density stays a share of every activation
    counts = torch.histc(every, HISTOGRAM_BINS, low, high)
    width = (high - low) / HISTOGRAM_BINS
    # the activation the model's FFN kind reads (its last block's: past an MoE's dense first blocks)
    return {"kind": model.cfg.ffn, "activation": model.blocks[-1].ffn.hidden_activation,
            "zero": [(a == 0).float().mean().item() for a in found],
            "near_zero": [(a.abs() < NEAR_ZERO * a.pow(2).mean().sqrt()).float().mean().item() for a in found],
            "edges": torch.linspace(low, high, HISTOGRAM_BINS + 1).tolist(),
            "density": (counts / (every.numel() * width)).tolist(),
            "beyond": 1 - counts.sum().item() / every.numel(),
            "range": [every.min().item(), every.max().item()]}
