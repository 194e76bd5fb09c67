"""Muon (Jordan et al. 2024): momentum, orthogonalised, for weight matrices.

For each matrix W: [A, B] with gradient G, momentum 0.95, lr and weight decay wd:
    M <- 0.95 M + 0.05 G                    the momentum
    N  = 0.95 M + 0.05 G                    its Nesterov blend
    W <- W (1 - lr wd) - lr 0.2 sqrt(max(A, B)) NS5(N)
NS5(N) approximates U V^T (N = U S V^T), the nearest semi-orthogonal matrix: every direction the gradient
moves gets a step of the same size, however small its singular value. Five Newton-Schulz iterations make it
from matmuls alone, X <- a X + (b X X^T + c (X X^T)^2) X from X = N / |N|_F (spectral norm <= 1), with the
quintic's coefficients (a, b, c) = (3.4445, -4.7750, 2.0315): they drive every singular value into about
[0.7, 1.2] fast rather than exactly to 1. NS5(N) then has rms ~ 1 / sqrt(max(A, B)), so the factor
0.2 sqrt(max(A, B)) (Liu et al. 2025, "Muon is scalable") gives the update AdamW's typical rms of 0.2 lr.

A weight that stacks matrices for one matmul ([Wq; Wk; Wv], SwiGLU's [W1; W3]) names their rows, and each is
orthogonalised and scaled as the matrix it is (nanochat and modded-nanogpt keep them as separate layers):
orthogonalising the stack whole would couple their updates and scale them by the stack's larger side.
The iterations run in the weight's dtype (float32). torch.optim.Muon casts to bfloat16, a GPU speed trick: on a
CPU without bf16 units that is far slower, and on one with them (the Xeon of docs/ablation.md, AMX) it saved
nothing measurable at these sizes.
"""
import math

import torch
from torch import nn

NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)


def orthogonalise(n: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """NS5(N) ~ U V^T for N: [A, B], iterated on the wide side (X X^T is min(A, B) square)."""
    a, b, c = NEWTON_SCHULZ
    tall = n.shape[0] > n.shape[1]
    x = n.T if tall else n
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Muon for the 2-D weights w of rows, rows[w] the row counts of the matrices stacked in w."""

    def __init__(self, rows: dict[nn.Parameter, list[int]], lr: float, weight_decay: float, momentum: float = 0.95):
        super().__init__(list(rows), {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})
        self.rows = rows

    @torch.no_grad()
    def step(self) -> None:  # no closure: train.py computes the loss before stepping, as for AdamW
        for group in self.param_groups:
            lr, decay, beta = group["lr"], group["weight_decay"], group["momentum"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                state = self.state[w]
                # torch.optim.Muon's name: a run saved with it (optim=muon before this file) resumes with its
                # momentum, and goes on with this update (its other settings were always the defaults here)
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(w)
                momentum = state["momentum_buffer"].lerp_(w.grad, 1 - beta)
                blend = w.grad.lerp(momentum, beta)
                w.mul_(1 - lr * decay)
                for matrix, n in zip(w.split(self.rows[w]), blend.split(self.rows[w])):  # views: in place in w
                    matrix.add_(orthogonalise(n), alpha=-lr * 0.2 * math.sqrt(max(n.shape)))
