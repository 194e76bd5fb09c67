"""Residual and x0 scalars (modded-nanogpt's records, nanochat): two learned numbers per block that mix what enters it.

    x_l <- lambda_r[l] x_l + lambda_0[l] x_0        before block l;  x_0: [B, T, d], the embedding stream block 0 gets
    lambda_r: [n_layers], 1 at init;  lambda_0: [n_layers], 0 at init: the model starts as the plain residual stream

lambda_0 gives every block a direct line to the token embedding (a skip the stream's sum would otherwise dilute
with depth), lambda_r lets a block scale down what the earlier ones wrote. model.residual_scalars=true turns them on.
They are not weight matrices: AdamW trains them without weight decay (training/optim.py), Muon never sees them.
"""
import torch
from torch import nn


class ResidualScalars(nn.Module):
    def __init__(self, n_layers: int):
        super().__init__()
        self.residual = nn.Parameter(torch.ones(n_layers))
        self.x0 = nn.Parameter(torch.zeros(n_layers))

    def forward(self, x: torch.Tensor, x0: torch.Tensor, layer: int) -> torch.Tensor:
        return self.residual[layer] * x + self.x0[layer] * x0
