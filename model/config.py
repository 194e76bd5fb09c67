"""ModelConfig: the plain-data description of one model, and the checks that reject a bad one.

Every switch is a string naming one option; every size is an int. The Hydra config under
`model.` maps onto these fields one to one, and a checkpoint stores them as JSON.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from errors import ConfigError
from model.ffn import hidden_width

NORMS = ("rmsnorm", "layernorm")
NORM_POSITIONS = ("pre", "post")
POSITIONS = ("rope", "sinusoidal", "learned", "none")
ATTENTIONS = ("gqa", "mha", "mqa")  # the K/V heads: n_kv_heads of them; mha: n_heads; mqa: 1
FFNS = ("swiglu", "relu", "gelu")
EMBEDDING_SCALES = ("gpt2", "transformer2017")  # the token signal's scale: model/transformer.py


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class ModelConfig:
    vocab_size: int
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 2
    context_length: int = 256
    norm: str = "rmsnorm"
    norm_position: str = "pre"
    position: str = "rope"
    attention: str = "gqa"  # a checkpoint from before this field loads as gqa, which allows any n_kv_heads
    ffn: str = "swiglu"
    ffn_multiple_of: int = 32  # SwiGLU's d_ff (model/ffn.py) is rounded up to this multiple
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    bias: bool = False  # biases in the linear layers (LayerNorm always has its beta)
    tie_embeddings: bool = True  # the LM head reuses the token embedding matrix
    embedding_scale: str = "gpt2"

    def __post_init__(self):
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return hidden_width(self.ffn, self.d_model, self.ffn_multiple_of)


    def validate(self) -> None:
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context_length",
                    "ffn_multiple_of"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{key}={value!r} must be a positive integer")
        for key, options in (("norm", NORMS), ("norm_position", NORM_POSITIONS), ("position", POSITIONS),
                             ("attention", ATTENTIONS), ("ffn", FFNS), ("embedding_scale", EMBEDDING_SCALES)):
            if getattr(self, key) not in options:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} must be one of {', '.join(options)}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}")
        expected = {"mha": self.n_heads, "mqa": 1}.get(self.attention, self.n_kv_heads)
        if self.n_kv_heads != expected:
            raise ConfigError(f"model.attention={self.attention} has {expected} K/V heads, not "
                              f"model.n_kv_heads={self.n_kv_heads}; use attention=gqa for another number")
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"model.position=rope needs an even head dim, but model.d_model={self.d_model} / "
                              f"model.n_heads={self.n_heads} = {self.head_dim}")
        if self.context_length < 2:
            raise ConfigError(f"model.context_length={self.context_length} must be >= 2: a window of one token "
                              f"has no next token to predict inside it")
        for key in ("rope_base", "norm_eps"):
            value = getattr(self, key)
            if not (is_number(value) and 0 < value < math.inf):
                raise ConfigError(f"model.{key}={value!r} must be a positive number")
        if not (is_number(self.dropout) and 0 <= self.dropout < 1):
            raise ConfigError(f"model.dropout={self.dropout!r} must be a number in [0, 1)")
        for key in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"model.{key}={getattr(self, key)!r} must be true or false")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """Build from a dict (a checkpoint's JSON or Hydra's `model` node), ignoring keys that are not
        the model's, such as the preset's name."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})
