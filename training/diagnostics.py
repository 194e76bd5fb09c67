"""Per-layer training dynamics, measured on one fixed batch: what a run looks like inside, logged
next to val loss when train.diagnostics=true (metrics.jsonl and W&B, keys `diag/<stat>/<layer>`).

For block l (0-based), with h_l the residual stream leaving it, x_l the stream entering it:
    stream_rms      rms(h_l)
    attn_ratio      rms(Attn output) / rms(x_l)     how loud the attention branch is next to the stream
    ffn_ratio       rms(FFN output) / rms(x_l)      the same for the FFN branch
    position_cos    mean over t != s of cos(h_l[t], h_l[s]) within a sequence: 1 when every position
                    carries the same vector, i.e. the stream no longer says which token is where
    attn_entropy    mean over heads and query positions t >= 1 of H(softmax row) / ln(t + 1): 1 for
                    uniform attention over the t + 1 visible keys, 0 for attention on one key
    grad_norm       ||dL/dtheta_l|| over block l's weights, for the same batch's next-token loss
and for the embedding stream entering block 0, x = m E[token] + PE[position] (model/transformer.py), its
two parts apart, keys `diag/<stat>`:
    token_rms       rms(m E[token]) over the batch's tokens
    position_rms    rms(PE[0 : T]), with sinusoidal or learned positions only: next to token_rms, which of
                    the two signals the first block hears louder
Measured on a copy of the model in eval mode (no dropout): no random numbers are drawn, and the
training model's gradients, optimizer and DDP hooks are untouched, so a run trains the same with or
without it.
"""
import copy

import torch
import torch.nn.functional as F

from model.transformer import Transformer
from training.evaluate import next_token_loss


def rms(t: torch.Tensor) -> float:
    return t.detach().pow(2).mean().sqrt().item()


def position_cosine(h: torch.Tensor) -> float:
    """h: [B, T, d] -> the mean cosine similarity of distinct positions' vectors within each sequence."""
    unit = F.normalize(h.detach().float(), dim=-1)
    T = h.shape[1]
    total = (unit @ unit.transpose(1, 2)).sum(dim=(1, 2)) - T  # drop the T self-similarities of 1
    return (total / (T * (T - 1))).mean().item()


def normalised_entropy(weights: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """weights: [..., T, T] causal attention rows (model.attention.attention_weights) -> [..., T - 1]: the
    entropy of row t over the log of the keys it sees, ln(t + 1) or ln(window) past a local layer's window, for
    t >= 1 (row 0 sees one key: entropy 0 of max 0; a window of 1 has rows of one key alike, counted as 0)."""
    T = weights.shape[-1]
    entropy = -(weights * weights.clamp_min(1e-30).log()).sum(dim=-1)[..., 1:]
    visible = torch.arange(2, T + 1, device=weights.device, dtype=entropy.dtype).clamp_max(window or T)
    return torch.where(visible > 1, entropy / visible.log(), 0.0)


def attention_entropy(mixer, x: torch.Tensor) -> float | None:
    """The mean normalised entropy of a block's mixer's causal rows (its weights: a local layer's window and
    sinks as model.attention.attention_weights takes them) on its input x; None where no softmax makes them."""
    if mixer.logits(x) is None:
        return None
    return normalised_entropy(mixer.weights(x), mixer.window).mean().item()


def layer_stats(model: Transformer, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The stats above for x, y: [B, T] token ids (T >= 2), as {"diag/<stat>/<layer>": value}."""
    model = copy.deepcopy(model).eval()
    records: dict[int, dict] = {i: {} for i in range(len(model.blocks))}
    hooks = []
    for i, block in enumerate(model.blocks):
        def on_block(_module, inputs, output, i=i):
            records[i]["stream_in"] = rms(inputs[0])
            records[i]["stream_rms"] = rms(output)
            records[i]["position_cos"] = position_cosine(output)

        def on_attn(module, inputs, output, i=i):
            records[i]["attn_out"] = rms(output)
            with torch.no_grad():
                records[i]["attn_entropy"] = attention_entropy(module, inputs[0])

        def on_ffn(_module, _inputs, output, i=i):
            records[i]["ffn_out"] = rms(output)

        hooks += [block.register_forward_hook(on_block), block.attn.register_forward_hook(on_attn),
                  block.ffn.register_forward_hook(on_ffn)]
    next_token_loss(model, x, y).backward()
    with torch.no_grad():
        stats = {"diag/token_rms": rms(model.token_signal(x))}
        if model.abs_pos is not None:
            stats["diag/position_rms"] = rms(model.abs_pos.table[:x.shape[1]])
    for i, block in enumerate(model.blocks):
        r = records[i]
        grads = [p.grad.flatten() for p in block.parameters()]
        values = {"stream_rms": r["stream_rms"], "attn_ratio": r["attn_out"] / r["stream_in"],
                  "ffn_ratio": r["ffn_out"] / r["stream_in"], "position_cos": r["position_cos"],
                  "attn_entropy": r["attn_entropy"], "grad_norm": torch.cat(grads).norm().item()}
        stats.update({f"diag/{name}/{i}": value for name, value in values.items() if value is not None})
    return stats
