"""One Transformer block: attention then FFN, each wrapped in a residual and a norm.

Pre-Norm (LLaMA, GPT-2):   x = x + Attn(Norm1(x));  x = x + FFN(Norm2(x))
Post-Norm (2017):          x = Norm1(x + Attn(x));  x = Norm2(x + FFN(x))
x: [batch, seq, d_model] throughout.

Pre-Norm leaves an identity path from the loss to every layer, so gradients reach the first
block undiminished; Post-Norm normalises the residual stream itself, which scales them down
with depth and is why it needs a learning-rate warm-up.
"""
import torch
from torch import nn

from model.attention import Attention
from model.config import ModelConfig
from model.ffn import FeedForward
from model.kv_cache import FullCache
from model.mla import LatentAttention
from model.moe import MoE
from model.norms import make_norm
from model.positions import Rotary
from model.qk_norm import QKNorm


ATTENTIONS = (Attention, LatentAttention)  # the attention kinds, the first the default of the estimators


def attention_class(cfg: ModelConfig) -> type[Attention] | type[LatentAttention]:
    """The attention kind of cfg's blocks, chosen here once: what it caches and can do at generation, asked of the
    class where there is no model (the memory estimators)."""
    return LatentAttention if cfg.attention == "mla" else Attention


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: Rotary | None):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        qk_norm = QKNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm == "rmsnorm" else None
        self.attn = LatentAttention(cfg, rotary) if attention_class(cfg) is LatentAttention else \
            Attention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.bias, cfg.dropout, rotary, qk_norm,
                      cfg.layer_windows[layer], cfg.sinks)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.ffn = MoE(cfg) if cfg.ffn == "moe" and layer >= cfg.dense_layers else \
            FeedForward(cfg.d_model, cfg.ffn_width, cfg.dense_ffn, cfg.bias)
        # p = 0 (the default) skips the call: an eval-mode Dropout still costs a dispatch per residual branch
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()

    def forward(self, x: torch.Tensor, start: int = 0, cache: FullCache | None = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.attn_norm(x), start, cache))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attn_norm(x + self.dropout(self.attn(x, start, cache)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


def final_norm(cfg: ModelConfig) -> nn.Module | None:
    """The norm between the last block and the LM head: Pre-Norm blocks leave the residual stream
    unnormalised, so the model needs one; Post-Norm blocks already end in a norm."""
    return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.norm_position == "pre" else None
