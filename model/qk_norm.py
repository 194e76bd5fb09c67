"""QK-norm: an RMSNorm over each query and key head before RoPE (OLMo 2, Gemma 3, Qwen3).

    q_h <- q_h / sqrt(mean(q_h^2) + eps) * g_q        q: [B, H, T, D],    g_q: [D], one gain for every query head
    k_h <- k_h / sqrt(mean(k_h^2) + eps) * g_k        k: [B, H_kv, T, D], g_k: [D], one for every K/V head

Without it the attention logit q.k / sqrt(D) grows with the norms of q and k, which the projections can grow
without bound: at a high learning rate the logits blow up, the softmax saturates to one-hot and training
diverges (Dehghani et al. 2023, Wortsman et al. 2023). With it |q| <= sqrt(D) max|g_q| and |k| <= sqrt(D) max|g_k|,
so |q.k| / sqrt(D) <= sqrt(D) max|g_q| max|g_k|: the logits' scale is the gains' (initialised at 1), not the
projections'.
RMSNorm over a head of one dimension would keep only the sign of each q and k, so the head dim must be >= 2.
"""
import math

import torch
from torch import nn

from model.norms import RMSNorm

MIN_HEAD_DIM = 2


class QKNorm(nn.Module):
    def __init__(self, head_dim: int, eps: float):
        super().__init__()
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def logit_bound(self) -> float:
        """sqrt(D) max|g_q| max|g_k|: the largest |q . k| / sqrt(D) of a normalised q and k (Cauchy-Schwarz; RoPE
        turns them without changing their norms)."""
        D = self.q_norm.weight.numel()
        return math.sqrt(D) * self.q_norm.weight.abs().max().item() * self.k_norm.weight.abs().max().item()

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)
