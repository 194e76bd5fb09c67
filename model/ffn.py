"""Position-wise feed-forward network, x: [B, T, d] -> [B, T, d], hidden width d_ff.

SwiGLU (LLaMA):  FFN(x) = (SiLU(x W1) * (x W3)) W2      W1, W3: [d, d_ff], W2: [d_ff, d], d_ff ~ 8/3 d
ReLU (2017):     FFN(x) = ReLU(x W1) W2                  W1: [d, d_ff], W2: [d_ff, d],      d_ff = 4 d
GELU (GPT-2):    FFN(x) = GELU(x W1) W2
ReLU² (Primer):  FFN(x) = ReLU(x W1)^2 W2               W1: [d, d_ff], W2: [d_ff, d],      d_ff = 4 d

The gated form has three matrices, so 8/3 d keeps the parameter count of the 4 d ungated one:
3 * d * 8/3 d = 2 * d * 4 d = 8 d^2 (model/config.py's hidden_width rounds it up to a multiple of model.ffn_multiple_of).
"""

import torch
import torch.nn.functional as F
from torch import nn

from model.interfaces import FeedForwardKind


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """So et al. 2021: ReLU's zeros, and a square that grows the large activations faster than the small."""
    return F.relu(x).square()


ACTIVATIONS = {"swiglu": F.silu, "relu": F.relu, "gelu": F.gelu, "relu2": relu_squared}
# what hidden_activations reads, as the report's figure names it
HIDDEN_ACTIVATIONS = {"swiglu": "silu(x·W1), the gate", "relu": "relu(x·W1)", "gelu": "gelu(x·W1)",
                      "relu2": "relu(x·W1)², the hidden activation"}


class FeedForward(FeedForwardKind):
    def __init__(self, d_model: int, d_ff: int, kind: str, bias: bool):
        super().__init__()
        self.kind = kind
        self.gated = kind == "swiglu"
        self.activation = ACTIVATIONS[kind]
        # Gated: W1 and W3 stacked [W1; W3] into one matmul, then split (stacked_rows: as in attention.py).
        self.w_in = nn.Linear(d_model, (2 if self.gated else 1) * d_ff, bias=bias)
        self.w_in.stacked_rows = (2 if self.gated else 1) * [d_ff]
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w_in(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.activation(gate) * up
        else:
            h = self.activation(h)
        return self.w_out(h)

    # -------- its answers to the repo (model/interfaces.py's FeedForwardKind)
    @classmethod
    def from_config(cls, cfg) -> "FeedForward":
        """A dense block's FFN: model.ffn's kind (an MoE's dense first blocks: SwiGLU), of the width it gives d_ff."""
        return cls(cfg.d_model, cfg.ffn_width, cfg.dense_ffn, cfg.bias)

    def residual_weights(self) -> list[nn.Parameter]:
        """W2 (GPT-2's scaled init)."""
        return [self.w_out.weight]

    @classmethod
    def flops_per_token(cls, cfg, layer: int, seq_len: int) -> float:
        """2 d d_ff per matrix (2 per multiply-add), three gated (SwiGLU), two otherwise; the activation is
        element-wise and not counted. Any seq_len: each token alone."""
        return 2 * cfg.d_model * cfg.ffn_width * (3 if cfg.dense_ffn == "swiglu" else 2)

    def hidden_activations(self, x: torch.Tensor) -> torch.Tensor:
        """The activation of x W1 (SwiGLU's gate, before it multiplies x W3; ReLU²'s square, what W2 reads)."""
        h = self.w_in(x)
        return self.activation(h.chunk(2, dim=-1)[0] if self.gated else h).flatten()

    @property
    def hidden_activation(self) -> str:
        return HIDDEN_ACTIVATIONS[self.kind]

    # -------- its settings
    @classmethod
    def validate(cls, cfg) -> None:
        """Its settings (model.d_ff, ffn_multiple_of) are every FFN's, checked by ModelConfig."""

    @classmethod
    def refuse_settings(cls, cfg) -> None:
        """Its settings are every FFN's: an MoE's shared experts and dense first blocks are SwiGLUs too."""
