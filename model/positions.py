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

Any length: RoPE's and the sinusoidal table's angles are computed for every position a sequence reaches, past
model.context_length too (Transformer.forward fits them first); RoPE's frequencies can be rescaled for that
(model.rope_scaling, model/rope_scaling.py). A learned table ends at its trained length.
"""
import math

import torch
from torch import nn

from errors import ConfigError
from model.interfaces import PositionKind
from model.rope_scaling import rope_frequencies, scaling_stream_refusal


class Rotary(PositionKind):
    """cos/sin tables for positions 0 .. n - 1, grown (fit) whenever a longer sequence comes; theta_i as
    model.rope_scaling makes them (model/rope_scaling.py)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, scaling: str = "none",
                 factor: float = 1.0, original: int = 0):
        super().__init__()
        self.head_dim, self.base, self.scaling, self.factor, self.original = head_dim, base, scaling, factor, original
        self.length = 0  # the positions the tables cover
        self.fit(max_len)

    def fit(self, length: int) -> None:
        """Tables for a sequence of `length` positions: grown when it is longer than they are. Dynamic NTK's
        frequencies depend on the length itself, so its tables are remade for each length past L0."""
        if self.scaling == "dynamic":
            length = max(length, self.original)
            if length == self.length:
                return
        elif length <= self.length:
            return
        theta, gain = rope_frequencies(self.head_dim, self.base, self.scaling, self.factor, self.original, length)
        # fp32 like transformers' LLaMA, so the two agree to the last bit of the angle
        angles = torch.outer(torch.arange(length).float(), theta)  # [length, D/2]
        # Half-split: the same angle for i and i + D/2. rotate_half([a, b]) * [sin, sin] = [b, a] * [-sin, sin],
        # so `sin` carries rotate_half's sign and forward swaps the halves with one roll (bit-identical).
        cos, sin = torch.cat([angles.cos(), angles.cos()], dim=-1), torch.cat([-angles.sin(), angles.sin()], dim=-1)
        if gain != 1.0:  # YaRN's attention factor
            cos, sin = cos * gain, sin * gain
        like = dict(device=self.cos.device, dtype=self.cos.dtype) if self.length else {}  # after .to() or .double()
        self.register_buffer("cos", cos.to(**like), persistent=False)
        self.register_buffer("sin", sin.to(**like), persistent=False)
        self.length = length

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x: [batch, heads, seq, D], its first token at absolute position `start` (fit has covered it)."""
        seq = x.shape[-2]
        cos, sin = self.cos[start:start + seq], self.sin[start:start + seq]
        if cos.dtype != x.dtype:  # bf16 activations under autocast; fp32 skips two calls per layer
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin  # rounded as transformers' (addcmul is not)

    def stream_refusal(self, sink_tokens: int | None) -> str | None:
        """Why a cache cannot stream past its length under these frequencies (Transformer.stream_refusal): RoPE's
        rotations compose, so StreamingLLM can turn the sinks on, unless the scaling forbids it."""
        return scaling_stream_refusal(self.scaling, sink_tokens)


def sinusoidal_table(max_len: int, dim: int) -> torch.Tensor:
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table.float()


class AbsolutePositions(PositionKind):
    """Adds PE[start : start + seq] to token embeddings; the table is fixed (sinusoidal, computed for any
    length) or trained (learned, its context_length rows and no more)."""

    def __init__(self, kind: str, max_len: int, dim: int, token_rms: float):
        super().__init__()
        self.learned = kind == "learned"
        if self.learned:  # starts at the token signal's scale, neither drowning it nor drowned
            self.table = nn.Parameter(torch.zeros(max_len, dim))
            nn.init.normal_(self.table, std=token_rms)
        else:
            self.register_buffer("table", sinusoidal_table(max_len, dim), persistent=False)

    def fit(self, length: int) -> None:
        """A table for `length` positions: the sinusoidal one grows, a learned one has no rows past its own."""
        rows, dim = self.table.shape
        if length <= rows:
            return
        if self.learned:
            raise PositionsError(f"model.position=learned has a table of {rows} positions (the trained "
                                 f"model.context_length) and no position past it; {length} positions need one of "
                                 f"rope, sinusoidal or none")
        self.register_buffer("table", sinusoidal_table(length, dim).to(self.table), persistent=False)

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        return x + self.table[start:start + x.shape[1]].to(x.dtype)

    def stream_refusal(self, sink_tokens: int | None) -> str | None:
        """Why a cache cannot stream past its length with these positions (Transformer.stream_refusal): a table added
        to the embeddings fixes each token's position, where StreamingLLM moves them within the cache."""
        if sink_tokens is None:
            return None
        kind = "learned" if self.learned else "sinusoidal"
        return (f"with model.position={kind}: StreamingLLM gives the cached tokens positions within the cache, which "
                f"RoPE's rotations (or no positions) allow and a table added to the embeddings does not")


class PositionsError(ConfigError):
    """A length that the model's positions cannot reach: a learned table's end."""


def table_bytes(cfg, rope_dim: int, length: int) -> int:
    """The bytes fit(length) holds at least, counted before anything is allocated (so that a length too long for
    the machine is refused in a second rather than killed by the OOM killer): RoPE's fp32 cos and sin tables,
    2 * length * rope_dim * 4 (model/block.py's rope_dim: every head dim, or MLA's RoPE part); the sinusoidal table,
    built in fp64 and kept in fp32, length * d_model * (8 + 4). A learned table never grows, and position=none has no
    table."""
    if cfg.position == "rope":
        return 2 * length * rope_dim * 4
    if cfg.position == "sinusoidal":
        return length * cfg.d_model * (8 + 4)
    return 0


def position_limit(cfg) -> int | None:
    """The most positions the model can read: a learned table's rows (model.context_length); None where its positions
    reach any length (RoPE's and the sinusoidal table grow, position=none has none)."""
    return cfg.context_length if cfg.position == "learned" else None


def make_positions(cfg, rope_dim: int, token_rms: float) -> tuple[Rotary | None, AbsolutePositions | None]:
    """model.position as modules: (the rotary table every layer's attention shares, the absolute table
    added to the embeddings, a learned one initialised at token_rms); at most one, none for position=none."""
    if cfg.position == "rope":
        return Rotary(rope_dim, cfg.context_length, cfg.rope_base, cfg.rope_scaling, cfg.rope_factor,
                      cfg.original_context), None
    if cfg.position in ("sinusoidal", "learned"):
        return None, AbsolutePositions(cfg.position, cfg.context_length, cfg.d_model, token_rms)
    return None, None
