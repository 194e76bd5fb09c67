"""Normalisation layers, over the last (feature) dimension of x: [batch, seq, d_model].

RMSNorm (LLaMA):     y = x / sqrt(mean(x^2) + eps) * gamma              gamma: [d_model]
LayerNorm (2017):    y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

RMSNorm drops the mean subtraction and the bias: one statistic instead of two. Like
transformers' LLaMA it computes the statistic in fp32 whatever the input dtype, so bf16
activations do not lose precision in the sum of squares.
"""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm is x * rsqrt(mean(x^2) + eps) * gain in one call instead of six (bit-identical on CPU).
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Lower precision: the statistic in fp32 and, as in transformers, the gain after the cast back.
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).type_as(x)


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    return nn.LayerNorm(dim, eps=eps)  # gamma and beta, as in the 2017 Transformer
