"""Normalisation layers, over the last (feature) dimension of x: [batch, seq, d_model] (QK-norm: [B, H, T, D]).

RMSNorm (LLaMA):     y = x / sqrt(mean(x^2) + eps) * gamma              gamma: [d_model]
LayerNorm (2017):    y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

RMSNorm drops the mean subtraction and the bias: one statistic instead of two. Like
transformers' LLaMA it computes the statistic in fp32 whatever the input dtype, so bf16
activations do not lose precision in the sum of squares.

RMSNorm's backward, written out (x_hat = x * r, r = 1 / sqrt(mean(x^2) + eps), g = dL/dy):
    dL/dgamma = sum over tokens of g * x_hat
    dL/dx     = r * (g * gamma - x_hat * mean(g * gamma * x_hat))
On CPU F.layer_norm is one fused kernel each way and F.rms_norm is not: autograd differentiates
its ops one by one, 14 of them in the backward, against the seven above. At d_model = 128 such
element-wise ops weigh as much as the matmuls, so CPU training runs the backward above (its A/B:
docs/performance.md).
"""
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


class RMSNormFunction(torch.autograd.Function):
    """Full-precision RMSNorm with the backward above: seven ops (five element-wise over [batch, seq, d_model], two
    sums) where autograd runs fourteen through F.rms_norm's. The forward is transformers' arithmetic in
    its order, x * r, then the gain."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # [batch, seq, 1]
        x_hat = x * r
        ctx.save_for_backward(x_hat, r, weight)
        return x_hat * weight

    @staticmethod
    @once_differentiable  # a second derivative would need the backward's own graph
    def backward(ctx, grad: torch.Tensor):
        x_hat, r, weight = ctx.saved_tensors
        grad_weight = (grad * x_hat).flatten(0, -2).sum(0)
        grad_x_hat = grad * weight
        projection = (grad_x_hat * x_hat).mean(-1, keepdim=True)
        return torch.addcmul(grad_x_hat, x_hat, projection, value=-1).mul_(r), grad_weight, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float16, torch.bfloat16):
            # Lower precision: the statistic in fp32 and, as in transformers, the gain after the cast back.
            return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).type_as(x)
        if x.is_cpu and torch.is_grad_enabled():  # CPU training: the backward above
            return RMSNormFunction.apply(x, self.weight, self.eps)
        # Inference, and CUDA (where F.rms_norm dispatches to fused kernels): the same arithmetic in one call,
        # without the Function's autograd context, which slows a batch-1 decode step and buys nothing where no
        # backward runs (docs/performance.md).
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def make_norm(kind: str, dim: int, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    return nn.LayerNorm(dim, eps=eps)  # gamma and beta, as in the 2017 Transformer
