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
from model.ffn import FeedForward
from model.gated_deltanet import GatedDeltaNet
from model.interfaces import FeedForwardKind, LayerCache, Mixer
from model.mla import LatentAttention
from model.moe import MoE
from model.norms import make_norm
from model.positions import Rotary


# The kind of each component a config chooses, made here and nowhere else: by ModelConfig.attention (MHA, GQA and
# MQA are one class, Attention) and by model.ffn (SwiGLU, ReLU, GELU and ReLU² are FeedForward).
ATTENTION_CLASSES = {"mla": LatentAttention, "gated_deltanet": GatedDeltaNet}
FFN_CLASSES = {"moe": MoE}
ATTENTION_KINDS = (Attention, *ATTENTION_CLASSES.values())  # the first: the estimators' default
FFN_KINDS = (FeedForward, *FFN_CLASSES.values())


def attention_class(cfg, layer: int | None = None) -> type[Mixer]:
    """Block `layer`'s attention kind (None: the model's own, which may make some blocks attention: a Gated DeltaNet
    hybrid): what it caches and can do at generation, asked of the class where there is no model (the estimators)."""
    kind = ATTENTION_CLASSES.get(cfg.attention, Attention)
    return kind if layer is None else kind.layer_class(cfg, layer)


def ffn_class(cfg, layer: int | None = None) -> type[FeedForwardKind]:
    """Block `layer`'s FFN kind (None: the model's own, past an MoE's model.dense_layers dense SwiGLU blocks)."""
    kind = FFN_CLASSES.get(cfg.ffn, FeedForward)
    return kind if layer is None or layer >= cfg.dense_layers else FeedForward


def rope_dim(cfg) -> int:
    """The dims of each head RoPE rotates, by the model's attention kind's rule (0 without RoPE)."""
    return attention_class(cfg).rope_dim(cfg)


def validate_kinds(cfg) -> None:
    """Each kind's rules for its own settings (model/transformer.py's validate calls this): the chosen attention's and
    FFN's validate, and each other kind's refuse_settings, so that no setting of a kind not chosen does nothing
    silently."""
    chosen = (attention_class(cfg), ffn_class(cfg))
    for kind in (*reversed(ATTENTION_KINDS), *reversed(FFN_KINDS)):  # the special kinds first
        if kind in chosen:
            kind.validate(cfg)
        else:
            kind.refuse_settings(cfg)


class Block(nn.Module):
    def __init__(self, cfg, layer: int, rotary: Rotary | None):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.attn = attention_class(cfg, layer).from_config(cfg, layer, rotary)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.ffn = ffn_class(cfg, layer).from_config(cfg)
        # p = 0 (the default) skips the call: an eval-mode Dropout still costs a dispatch per residual branch
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()

    def residual_weights(self) -> list[nn.Parameter]:
        """The weights that write the block's two branches into the residual stream, in parameter order: what
        GPT-2's scaled init draws again (model/transformer.py)."""
        return [*self.attn.residual_weights(), *self.ffn.residual_weights()]

    def forward(self, x: torch.Tensor, start: int = 0, cache: LayerCache | None = None,
                value_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """value_embedding: [B, T, H_kv D], this block's table of the tokens for its values (model/value_embeddings.py:
        only a kind with a value_width gets one), or None."""
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.attn_norm(x), start, cache, value_embedding))
            return x + self.dropout(self.ffn(self.ffn_norm(x)))
        x = self.attn_norm(x + self.dropout(self.attn(x, start, cache, value_embedding)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


def final_norm(cfg) -> nn.Module | None:
    """The norm between the last block and the LM head: Pre-Norm blocks leave the residual stream
    unnormalised, so the model needs one; Post-Norm blocks already end in a norm."""
    return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps) if cfg.norm_position == "pre" else None
