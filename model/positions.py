"""Position information: rotary (inside attention) or absolute (added to the embeddings).

RoPE (LLaMA), applied to q and k of every layer, per head, head_dim = D, half-split layout:
    theta_i = base^(-2i / D),  i = 0 .. D/2 - 1
    angle[m, i] = m * theta_i for a token at absolute position m
    rope(x)[m] = x * cos(angle[m]) + rotate_half(x) * sin(angle[m]),  rotate_half([a, b]) = [-b, a]
  so <rope(q)[m], rope(k)[n]> depends only on m - n.  q, k: [batch, heads, seq, D].

Sinusoidal (2017), added to the token embeddings [batch, seq, d_model], scaled by sqrt(d) as in the paper:
    x[m] = sqrt(d) * E[token_m] + PE[m],  PE[m, 2i] = sin(m / 10000^(2i/d)),  PE[m, 2i+1] = cos(m / 10000^(2i/d))
  PE entries have rms 0.71; the token part's rms depends on E's init (model.embedding_scale,
  model/transformer.py): 0.23 with GPT-2's, 1 with the 2017 Transformer's.
Learned (GPT-2): a trained table PE: [context_length, d_model], initialised at the token signal's rms and
not weight-decayed (training/optim.py).  None: no position signal at all (the causal mask alone still
leaks some order).

Absolute tables are indexed by absolute position, so a KV-cached step at position m adds PE[m].
"""
import math

import torch
from torch import nn

from model.config import ModelConfig


class Rotary(nn.Module):
    """Precomputes cos/sin tables once for every position up to max_len."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        # fp32 like transformers' LLaMA, so the two agree to the last bit of the angle
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(max_len).float(), inv_freq)  # [max_len, D/2]
        # Half-split: the same angle for i and i + D/2. rotate_half([a, b]) * [sin, sin] = [b, a] * [-sin, sin],
        # so `sin` carries rotate_half's sign and forward swaps the halves with one roll (bit-identical).
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([-angles.sin(), angles.sin()], dim=-1), persistent=False)

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x: [batch, heads, seq, D], its first token at absolute position `start`."""
        seq = x.shape[-2]
        cos, sin = self.cos[start:start + seq], self.sin[start:start + seq]
        if cos.dtype != x.dtype:  # bf16 activations under autocast; fp32 skips two calls per layer
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin  # rounded as transformers' (addcmul is not)


def sinusoidal_table(max_len: int, dim: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table.float()


class AbsolutePositions(nn.Module):
    """Adds PE[start : start + seq] to token embeddings; the table is fixed (sinusoidal) or trained."""

    def __init__(self, kind: str, max_len: int, dim: int, token_rms: float):
        super().__init__()
        if kind == "learned":  # starts at the token signal's scale, neither drowning it nor drowned
            self.table = nn.Parameter(torch.zeros(max_len, dim))
            nn.init.normal_(self.table, std=token_rms)
        else:
            self.register_buffer("table", sinusoidal_table(max_len, dim), persistent=False)

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        return x + self.table[start:start + x.shape[1]].to(x.dtype)


def make_positions(cfg: ModelConfig, token_rms: float) -> tuple[Rotary | None, AbsolutePositions | None]:
    """model.position as modules: (the rotary table every layer's attention shares, the absolute table
    added to the embeddings, a learned one initialised at token_rms); at most one, none for position=none."""
    if cfg.position == "rope":
        return Rotary(cfg.head_dim, cfg.context_length, cfg.rope_base), None
    if cfg.position in ("sinusoidal", "learned"):
        return None, AbsolutePositions(cfg.position, cfg.context_length, cfg.d_model, token_rms)
    return None, None
