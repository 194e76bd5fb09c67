"""What the repo asks of each kind of component: one base class per family, declared once.

    BlockComponent   what the next two share: the rules of their settings, residual weights, FLOPs
    Mixer         a block's sequence mixer, in attention's place: Attention (MHA, GQA, MQA, windows, sinks),
                  LatentAttention (MLA), GatedDeltaNet (a fixed state)      forward(x [B, T, d], start, cache,
                                                                            value_embedding) -> [B, T, d]
    FeedForwardKind  a block's position-wise FFN: FeedForward (SwiGLU, ReLU, GELU, ReLU²), MoE
                                                                            forward(x [B, T, d]) -> [B, T, d]
    PositionKind  a position table: Rotary (turns q and k), AbsolutePositions (added to the embeddings)
    LayerCache    one layer's generation cache: FullCache (RollingCache, StreamingCache), StateCache

A member marked abstract is required: a kind that leaves one out cannot be built, and missing_members names it
(tests/test_interfaces.py asks it of every registered kind, so a new kind that misses one fails before any command
runs). A required class attribute is an annotation without a value. The other members are optional: the base's
answer is what a kind without that feature means (no value embedding, no window, no auxiliary loss, ...).
docs/architecture.md's table of these members is checked against this file by the same test.
"""
from abc import ABCMeta, abstractmethod

import torch
from torch import nn


class KindMeta(ABCMeta, type(nn.Module)):
    """nn.Module's metaclass with ABC's abstract members."""


def missing_members(kind: type, family: type) -> list[str]:
    """The members of `family` that `kind` does not implement: abstract methods left abstract, and class
    attributes annotated on the family without a value on the kind."""
    missing = sorted(getattr(kind, "__abstractmethods__", ()))
    return missing + [name for name in family.__dict__.get("__annotations__", {}) if not hasattr(kind, name)]


class BlockComponent(nn.Module, metaclass=KindMeta):
    """What a block's mixer and its FFN both answer: the rules of their settings, their residual weights and FLOPs."""

    @classmethod
    @abstractmethod
    def validate(cls, cfg) -> None:
        """The rules of its own settings, and the settings it cannot take: a ConfigError naming the first broken."""

    @classmethod
    @abstractmethod
    def refuse_settings(cls, cfg) -> None:
        """Another kind is chosen: a ConfigError for any of this kind's settings that is set all the same."""

    @abstractmethod
    def residual_weights(self) -> list[nn.Parameter]:
        """The weights it writes into the residual stream with (GPT-2's scaled init draws them again)."""

    @classmethod
    @abstractmethod
    def flops_per_token(cls, cfg, layer: int, seq_len: int) -> float:
        """Forward FLOPs per token of block `layer`'s component in a causal sequence of seq_len tokens."""


class Mixer(BlockComponent):
    """A sequence mixer: what each position reads of the earlier ones. The rules, the build, the cost, the
    generation cache and what insight shows are the kind's own answers."""

    PER_POSITION: "PerPosition"  # what one position (and a fixed state) costs its cache: model/kv_cache.py
    window: int | None = None  # the positions a query sees, its own included; None: every earlier one

    # -------- the settings (validate, refuse_settings: BlockComponent's)
    @classmethod
    def layer_class(cls, cfg, layer: int) -> type:
        """Block `layer`'s kind: this one in every block (a hybrid makes some blocks another kind)."""
        return cls

    @staticmethod
    def value_width(cfg) -> int | None:
        """The width of one position's values a value embedding adds to (model/value_embeddings.py); None: none."""
        return None

    @classmethod
    def rope_dim(cls, cfg) -> int:
        """The dims of each head RoPE turns: model.rotary_fraction of the head (none without RoPE)."""
        return int(cfg.head_dim * cfg.rotary_fraction) if cfg.position == "rope" else 0

    # -------- the build and the forward
    @classmethod
    @abstractmethod
    def from_config(cls, cfg, layer: int, rotary) -> "Mixer":
        """Block `layer`'s mixer; rotary: the model's shared RoPE table, or None."""

    @abstractmethod
    def forward(self, x: torch.Tensor, start: int = 0, cache: "LayerCache | None" = None,
                value_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, d] at positions start .. start + T - 1 -> [B, T, d]; cache: this layer's, read and written;
        value_embedding [B, T, value_width], given only to a kind with a value_width."""

    # -------- the generation cache
    @staticmethod
    @abstractmethod
    def cache_dims(cfg) -> dict[str, int]:
        """The widths PER_POSITION reads, of a model of these settings."""

    @classmethod
    @abstractmethod
    def cache_bytes(cls, cfg, layer: int, positions: int, batch: int, bytes_per_element: int) -> int:
        """What new_cache allocates for `positions` in block `layer`."""

    @abstractmethod
    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype, device, sink_tokens: int | None = None
                  ) -> "LayerCache":
        """This layer's cache for a generation of max_len positions (sink_tokens: StreamingLLM's, or None)."""

    @abstractmethod
    def rolls(self, max_len: int) -> bool:
        """Whether its cache of max_len positions goes on past them by itself."""

    @staticmethod
    @abstractmethod
    def stream_refusal(cfg) -> str | None:
        """Why its cache cannot stream with sink tokens, as the engine's error says it; None: it can."""

    # -------- what insight shows
    @abstractmethod
    def weights(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """[B, heads, T, T]: what each of x's positions reads of each earlier one, as the report's maps show it."""

    def logits(self, x: torch.Tensor, start: int = 0, qk_norm: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(q [B, H, T, D], k [B, H_kv, T, D]) whose q . k / sqrt(D) its softmax reads (qk_norm=False: before a
        QK-norm, as the raw projections give them); None: it has no softmax."""
        return None

    def logit_bound(self) -> float | None:
        """The largest |q . k| / sqrt(D) it lets through (a QK-norm's bound); None: no bound."""
        return None

    @abstractmethod
    def cached_value_rows(self) -> list[tuple[nn.Linear, slice]]:
        """For each head its cache holds, the projection and the rows of it that make that head's values."""

    @property
    @abstractmethod
    def output_heads(self) -> int:
        """The heads side by side at the output projection's input (`out`), each of out.in_features / this width."""


class FeedForwardKind(BlockComponent):
    """A block's position-wise FFN."""

    hidden_activation: str  # what hidden_activations reads, as the report's figure names it

    @classmethod
    @abstractmethod
    def from_config(cls, cfg) -> "FeedForwardKind":
        """A block's FFN of this kind."""

    @abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, d] -> [B, T, d], each position alone."""

    @abstractmethod
    def hidden_activations(self, x: torch.Tensor) -> torch.Tensor:
        """Its hidden units' activations for inputs x [..., d], flattened (the report's FFN figure)."""

    def take_aux_losses(self) -> dict[str, torch.Tensor]:
        """The auxiliary losses of its last forward with gradients, by the name each is logged under, taken once."""
        return {}

    aux_weights: dict[str, float] = {}  # each auxiliary loss's weight in the model's loss, by its name

    def after_optimizer_step(self, reduce) -> None:
        """Its update after each optimizer step, outside the gradient; reduce sums a tensor over the processes."""


class PositionKind(nn.Module, metaclass=KindMeta):
    """A table of positions, grown for any length it can reach."""

    @abstractmethod
    def fit(self, length: int) -> None:
        """Tables for a sequence of `length` positions (PositionsError where it has none)."""

    @abstractmethod
    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x with its positions start .. start + T - 1 applied."""

    @abstractmethod
    def stream_refusal(self, sink_tokens: int | None) -> str | None:
        """Why a cache cannot stream past its length with these positions; None: it can."""


class LayerCache(metaclass=ABCMeta):
    """One layer's cache for a generation, preallocated: what the engine asks of every kind of it."""

    def __init__(self, max_len: int):
        self.max_len = max_len  # the generation's positions it was made for

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """What it holds, in bytes (its mixer's cache_bytes counts the same)."""

    @abstractmethod
    def fill_from(self, source: "LayerCache", repeats: int = 1, length: int | None = None) -> None:
        """source's first `length` positions (or state) copied into this one, each row into `repeats` rows."""
