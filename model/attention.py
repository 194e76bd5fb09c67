"""Causal self-attention with n_heads query heads and n_kv_heads key/value heads.

    x: [B, T, d]  ->  q: [B, H, T, D],  k, v: [B, H_kv, T, D]    (D = d / H, H_kv divides H)
    attn(q, k, v) = softmax(q k^T / sqrt(D) + causal_mask) v      -> [B, H, T, D] -> [B, T, d] Wo

MHA: H_kv = H.  GQA: 1 < H_kv < H, each K/V head serves a group of H / H_kv query heads.
MQA: H_kv = 1.  Fewer K/V heads mean fewer K/V parameters and a KV cache H / H_kv times smaller.
The K/V heads are shared through scaled_dot_product_attention(enable_gqa=True), which
broadcasts them instead of materialising H copies.

With QK-norm (model/qk_norm.py), each q and k head is RMS-normalised first. With RoPE, q and k are then
rotated by their absolute positions before the dot product. With a KV cache, the new tokens start at absolute
position `start` and attend to every cached one.

sdpa never materialises the attention weights; attention_scores and attention_weights below compute
them from Attention.heads' q and k for what looks inside the model (training/diagnostics.py, insight/).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from model.kv_cache import KVCache
from model.positions import Rotary
from model.qk_norm import QKNorm


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool, dropout: float,
                 rotary: Rotary | None, qk_norm: QKNorm | None, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.layer = layer  # index into the KV cache
        # One matmul for Q, K and V: their rows are stacked [Wq; Wk; Wv] (an optimizer that treats each
        # matrix on its own, Muon, reads stacked_rows).
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.qkv.stacked_rows = [n_heads * self.head_dim] + 2 * [n_kv_heads * self.head_dim]
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.qk_norm = qk_norm
        self.rotary = rotary
        self.dropout = dropout

    def heads(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q: [B, H, T, D], k and v: [B, H_kv, T, D], q and k normalised with QK-norm, then rotated with RoPE."""
        B, T, _ = x.shape
        H, H_kv = self.n_heads, self.n_kv_heads
        # [B, T, (H + 2 H_kv) D] -> [B, H + 2 H_kv, T, D]: the q, k and v heads side by side
        heads = self.qkv(x).view(B, T, H + 2 * H_kv, self.head_dim).transpose(1, 2)
        qk, v = heads.split([H + H_kv, H_kv], dim=1)
        if self.qk_norm is not None:
            qk = torch.cat(self.qk_norm(*qk.split([H, H_kv], dim=1)), dim=1)
        if self.rotary is not None:
            qk = self.rotary(qk, start)  # q and k heads in one call: the same rotation per position
        q, k = qk.split([H, H_kv], dim=1)
        return q, k, v

    def forward(self, x: torch.Tensor, start: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.heads(x, start)
        if cache is not None:
            k, v = cache.update(self.layer, start, k, v)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=causal_mask(T, k.shape[2], x.device),
            is_causal=(T > 1 and k.shape[2] == T),
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


def causal_mask(n_queries: int, n_keys: int, device) -> torch.Tensor | None:
    """Bool mask for queries that are the last n_queries of n_keys positions, or None where
    sdpa's own is_causal (n_queries == n_keys) or no mask at all (one query sees every key) is exact."""
    if n_queries == 1 or n_queries == n_keys:
        return None
    offset = n_keys - n_queries
    keys = torch.arange(n_keys, device=device)
    queries = torch.arange(offset, n_keys, device=device)
    return keys[None, :] <= queries[:, None]


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q: [B, H, T_q, D], k: [B, H_kv, T_k, D] -> q k^T / sqrt(D): [B, H, T_q, T_k], in q's dtype. Query head h
    reads K/V head h // (H / H_kv), the grouping enable_gqa gives sdpa."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def attention_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + causal mask) for q and k of the same T positions: [B, H, T, T], row t the
    weights query t gives keys 0 .. t, the ones forward's sdpa applies to v."""
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return attention_scores(q, k).masked_fill(future, -math.inf).softmax(dim=-1)
