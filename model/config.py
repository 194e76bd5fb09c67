"""ModelConfig: the plain-data description of one model, and the checks that reject a bad one.

Every switch is a string naming one option; every size is an int. The defaults are the llama_tiny preset
on its corpus, and they are the one place its sizes are written: settings.py makes these fields, types and
defaults the schema of the Hydra config's `model.` node, a preset (configs/model/) sets only what differs, and
a checkpoint stores them as JSON.

The checks here span components (sizes, head counts, the switches' names, RoPE's even head dim). This file knows no
kind's class: each attention and FFN kind checks its own settings (model/transformer.py's validate, run by the model
and by a config composed for training).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from errors import ConfigError
from model.checks import is_number, is_whole
from model.qk_norm import MIN_HEAD_DIM
from model.rope_scaling import SCALINGS
from parsing import whole_number

NORMS = ("rmsnorm", "layernorm")
NORM_POSITIONS = ("pre", "post")
POSITIONS = ("rope", "sinusoidal", "learned", "none")
ATTENTIONS = ("gqa", "mha", "mqa", "mla", "gated_deltanet")  # the attention group's options (configs/attention/)
FFNS = ("swiglu", "relu", "gelu", "relu2", "moe")
QK_NORMS = ("none", "rmsnorm")
EMBEDDING_SCALES = ("gpt2", "transformer2017")  # the token signal's scale: model/transformer.py
# The capped logits lie within +-c: two tokens' probabilities differ by a factor of at most e^2c, and the loss falls
# at most 2c nats below ln V. At c = 1e-3 that is 0.002 nats, a model that cannot learn; below 2^-25 float32 rounds
# e^-2c to 1 and the softmax is exactly uniform (1e-30 trained at ln V). The caps in use are 15 to 30.
MIN_LOGIT_SOFTCAP = 1e-3


def hidden_width(kind: str, d_model: int, multiple_of: int) -> int:
    """The FFN's d_ff: 8/3 d rounded up to a multiple of multiple_of for the gated SwiGLU, 4 d otherwise (both hold
    8 d^2 weights: model/ffn.py)."""
    if kind == "swiglu":
        return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)
    return 4 * d_model


def local_run_of(pattern) -> int | None:
    """N of an N:1 pattern (N >= 1, in ASCII digits: parsing.py), else None."""
    local, _, rest = pattern.partition(":") if isinstance(pattern, str) else ("", "", "")
    run = whole_number(local)
    return run if run is not None and run >= 1 and rest == "1" else None


def local_layers(pattern: str, n_layers: int) -> list[bool]:
    """Which of n_layers blocks a readable model.window_pattern makes local: all of them; alternate: local, global,
    local, ... (gpt-oss); N:1: N local, then one global, repeated (Gemma 3's 5:1). model.linear_pattern reads alike,
    linear for local (Qwen3.5's 3:1)."""
    if pattern == "all":
        return n_layers * [True]
    local_run = 1 if pattern == "alternate" else local_run_of(pattern)
    return [layer % (local_run + 1) < local_run for layer in range(n_layers)]


def window_pattern_of(local: list[bool]) -> str | None:
    """local_layers' inverse: the pattern that makes exactly these blocks local, or None where none does."""
    for pattern in ("all", "alternate", *(f"{n}:1" for n in range(2, len(local) + 1))):
        if local_layers(pattern, len(local)) == local:
            return pattern
    return None


def attention_kind(n_heads: int, n_kv_heads: int) -> str:
    """The attention that n_kv_heads K/V heads make: mha (one per query head), mqa (one for all), else gqa."""
    return "mha" if n_kv_heads == n_heads else "mqa" if n_kv_heads == 1 else "gqa"


def check_attention_choice(choice: str, n_heads: int, n_kv_heads: int, kv_rank: int | None,
                           linear_pattern: str | None) -> None:
    """model.attention, the attention group's name, against the settings it names, before they make a model: mha
    has n_heads K/V heads, mqa one, gqa any divisor of n_heads (so do a hybrid's attention layers); mla is the one with
    a latent (model.kv_rank), gated_deltanet the one with linear layers (model.linear_pattern)."""
    if choice not in ATTENTIONS:
        raise ConfigError(f"model.attention={choice!r} must be one of {', '.join(ATTENTIONS)}")
    if choice == "mla" and kv_rank is None:
        raise ConfigError("model.attention=mla needs the latent's width, but model.kv_rank=null")
    if choice != "mla" and kv_rank is not None:
        raise ConfigError(f"model.kv_rank={kv_rank} is a setting of attention=mla, not of attention={choice}")
    if choice == "gated_deltanet" and linear_pattern is None:
        raise ConfigError("model.attention=gated_deltanet needs its layers, but model.linear_pattern=null")
    if choice != "gated_deltanet" and linear_pattern is not None:
        raise ConfigError(f"model.linear_pattern={linear_pattern} makes Gated DeltaNet layers, a setting of "
                          f"attention=gated_deltanet, not of attention={choice}")
    expected = {"mha": n_heads, "mqa": 1}.get(choice, n_kv_heads)
    if n_kv_heads != expected:
        raise ConfigError(f"model.attention={choice} has {expected} K/V heads, not model.n_kv_heads={n_kv_heads}; "
                          f"use attention=gqa for another number")


@dataclass
class ModelConfig:
    vocab_size: int = 1024  # the default corpus's (configs/data/shakespeare.yaml); train.py sets the tokenizer's
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # K/V heads, a divisor of n_heads: the attention is named after it (attention_kind)
    context_length: int = 128
    norm: str = "rmsnorm"
    norm_position: str = "pre"
    position: str = "rope"
    qk_norm: str = "none"  # rmsnorm: each q and k head RMS-normalised before RoPE (model/qk_norm.py)
    ffn: str = "swiglu"
    ffn_multiple_of: int = 32  # SwiGLU's d_ff (model/ffn.py) is rounded up to this multiple
    d_ff: int | None = None  # the FFN's hidden width; null: its rule of d_model (hidden_width)
    rope_base: float = 10000.0
    rope_scaling: str = "none"  # none, linear, ntk, dynamic or yarn: RoPE past the trained context (model/rope_scaling.py)
    rope_factor: float = 1.0  # the scaling's s: the length it stretches to over the original context
    rope_original_context: int | None = None  # L0, the context RoPE was first trained at (null: context_length)
    norm_eps: float = 1e-5
    dropout: float = 0.0
    bias: bool = False  # biases in the linear layers (LayerNorm always has its beta)
    tie_embeddings: bool = True  # the LM head reuses the token embedding matrix
    embedding_scale: str = "gpt2"  # gpt2: E ~ N(0, 0.02^2); transformer2017: N(0, 1/d) x sqrt(d) (model/transformer.py)
    logit_softcap: float | None = None  # c: the logits c tanh(z / c) (Gemma 2, modded-nanogpt); null: z as it is
    value_embeddings: str | None = None  # all or alternate: a token table added to those layers' values; null: none
    residual_scalars: bool = False  # x <- lambda_r x + lambda_0 x_0 before each block (model/residual_scalars.py)
    # Multi-head latent attention (model/mla.py): the latent's width d_c; null is attention by K/V heads
    kv_rank: int | None = None
    q_rank: int | None = None  # MLA's query latent; null: a full-rank query projection
    rope_head_dim: int | None = None  # d_R, each query head's RoPE part and the shared RoPE key (null: head_dim / 2)
    v_head_dim: int | None = None  # each head's value width (null: head_dim)
    # Mixture of experts (ffn=moe, model/moe.py; configs/ffn/moe.yaml sets the sizes): E experts of d_e, k a token
    n_experts: int | None = None
    experts_per_token: int | None = None
    expert_d_ff: int | None = None  # each expert's SwiGLU width d_e (null: the dense SwiGLU's d_ff / k)
    n_shared_experts: int = 0  # always-on experts of d_e (DeepSeekMoE)
    dense_layers: int = 0  # the first blocks keep a dense SwiGLU (DeepSeek-V3's first_k_dense_replace)
    router: str = "softmax"  # softmax (Mixtral, Qwen3-MoE) or sigmoid (DeepSeek-V3)
    router_aux_coef: float = 0.0  # the load-balancing loss's weight (Switch, OLMoE: 0.01)
    router_z_coef: float = 0.0  # the router z-loss's weight (ST-MoE, OLMoE: 0.001)
    router_bias_rate: float = 0.0  # the loss-free balancing bias's step after each optimizer step (DeepSeek-V3)
    # Sliding-window attention (model/attention.py): the local layers see the last `window` positions, a query's
    # own included; null is full causal attention in every layer
    window: int | None = None
    window_pattern: str = "all"  # which layers are local: all, alternate (gpt-oss: local first) or N:1 (Gemma 3's 5:1)
    sinks: bool = False  # a learned sink logit per head (gpt-oss): a softmax column that takes weight, gives no value
    attention_gate: bool = False  # the attention output times sigmoid(x W_g) before W_o (Qwen3-Next, Qwen3.5)
    rotary_fraction: float = 1.0  # the share of each head's dims RoPE turns (Qwen3-Next, Qwen3.5: 0.25)
    # Gated DeltaNet (model/gated_deltanet.py): which layers are linear, a fixed state in place of attention; null is
    # attention in every layer
    linear_pattern: str | None = None  # all, alternate (linear first) or N:1 (N linear to one attention: Qwen3.5's 3:1)
    linear_key_heads: int | None = None  # H_k (null: model.n_heads)
    linear_value_heads: int | None = None  # H_v, a multiple of H_k (null: H_k); Qwen3.5: 16 key, 32 value heads
    linear_head_dim: int | None = None  # d_k = d_v of each linear head (null: the attention's head dim)
    linear_conv: int = 4  # the causal depthwise conv's kernel K
    linear_chunk: int = 64  # the chunked form's chunk: how training and a prefill run it; the result is the same
    linear_delta_rule: bool = True  # false: gated linear attention, the delta rule's correction dropped (the study's)

    def __post_init__(self):
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def dense_ffn(self) -> str:
        """The dense FFN's kind: ffn=moe keeps SwiGLU in its first model.dense_layers blocks (and its shared experts)."""
        return "swiglu" if self.ffn == "moe" else self.ffn

    @property
    def expert_width(self) -> int:
        """d_e: model.expert_d_ff, or the dense SwiGLU's d_ff over k, so that the k active experts hold the dense
        FFN's parameters (at most one unit fewer each)."""
        return self.expert_d_ff or max(1, self.ffn_width // self.experts_per_token)

    @property
    def ffn_width(self) -> int:
        """The dense FFN's d_ff as built: model.d_ff, or the FFN's rule of d_model when it is null."""
        return self.d_ff or hidden_width(self.dense_ffn, self.d_model, self.ffn_multiple_of)

    @property
    def original_context(self) -> int:
        """L0: the context the weights were trained at, before any fine-tune at a longer one."""
        return self.rope_original_context or self.context_length

    @property
    def attention(self) -> str:
        if self.linear_pattern is not None:
            return "gated_deltanet"
        return "mla" if self.kv_rank is not None else attention_kind(self.n_heads, self.n_kv_heads)

    @property
    def linear_layers(self) -> list[bool]:
        """Which blocks are Gated DeltaNet: model.linear_pattern's (all, alternate, N:1), none when it is null."""
        return self.n_layers * [False] if self.linear_pattern is None else local_layers(self.linear_pattern,
                                                                                         self.n_layers)

    @property
    def n_linear_key_heads(self) -> int:
        return self.linear_key_heads or self.n_heads

    @property
    def n_linear_value_heads(self) -> int:
        return self.linear_value_heads or self.n_linear_key_heads

    @property
    def linear_dim(self) -> int:
        return self.linear_head_dim or self.head_dim

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def layer_windows(self) -> list[int | None]:
        """The positions each block attends to: model.window where model.window_pattern makes it local, else None
        (every earlier position)."""
        if self.window is None:
            return self.n_layers * [None]
        return [self.window if local else None for local in local_layers(self.window_pattern, self.n_layers)]

    @property
    def n_local_layers(self) -> int:
        return sum(window is not None for window in self.layer_windows)

    def validate(self) -> None:
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "context_length",
                    "ffn_multiple_of"):
            value = getattr(self, key)
            if not is_whole(value):
                raise ConfigError(f"model.{key}={value!r} must be a positive integer")
        if self.d_ff is not None and not is_whole(self.d_ff):
            raise ConfigError(f"model.d_ff={self.d_ff!r} must be a positive integer, or null for the FFN's rule")
        for key, options in (("norm", NORMS), ("norm_position", NORM_POSITIONS), ("position", POSITIONS),
                             ("ffn", FFNS), ("qk_norm", QK_NORMS), ("embedding_scale", EMBEDDING_SCALES)):
            if getattr(self, key) not in options:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} must be one of {', '.join(options)}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}")
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"model.position=rope needs an even head dim, but model.d_model={self.d_model} / "
                              f"model.n_heads={self.n_heads} = {self.head_dim}")
        if self.qk_norm != "none" and self.head_dim < MIN_HEAD_DIM:
            raise ConfigError(f"model.qk_norm={self.qk_norm} normalises each head, but model.d_model={self.d_model} / "
                              f"model.n_heads={self.n_heads} = {self.head_dim} dim per head, which it would reduce to "
                              f"its sign; use heads of at least {MIN_HEAD_DIM} dims")
        if self.context_length < 2:
            raise ConfigError(f"model.context_length={self.context_length} must be >= 2: a window of one token "
                              f"has no next token to predict inside it")
        self.validate_rope_scaling()
        for key in ("rope_base", "norm_eps"):
            value = getattr(self, key)
            if not (is_number(value) and 0 < value < math.inf):
                raise ConfigError(f"model.{key}={value!r} must be a positive number")
        if not (is_number(self.dropout) and 0 <= self.dropout < 1):
            raise ConfigError(f"model.dropout={self.dropout!r} must be a number in [0, 1)")
        if self.logit_softcap is not None and not (is_number(self.logit_softcap) and 0 < self.logit_softcap < math.inf):
            raise ConfigError(f"model.logit_softcap={self.logit_softcap!r} must be a positive number, or null for none")
        if self.logit_softcap is not None and self.logit_softcap < MIN_LOGIT_SOFTCAP:
            raise ConfigError(f"model.logit_softcap={self.logit_softcap} must be at least {MIN_LOGIT_SOFTCAP}: the "
                              f"capped logits lie within +-{self.logit_softcap}, so the loss can fall at most "
                              f"{2 * self.logit_softcap:g} nats below its untrained ln vocab_size and the model learns "
                              f"nothing (Gemma 2 caps at 30, modded-nanogpt's records at 15 to 30)")
        for key in ("bias", "tie_embeddings", "residual_scalars"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"model.{key}={getattr(self, key)!r} must be true or false")

    def validate_rope_scaling(self) -> None:
        if self.rope_scaling not in SCALINGS:
            raise ConfigError(f"model.rope_scaling={self.rope_scaling!r} must be one of {', '.join(SCALINGS)}")
        if not (is_number(self.rope_factor) and 0 < self.rope_factor < math.inf):
            raise ConfigError(f"model.rope_factor={self.rope_factor!r} must be a positive number")
        original = self.rope_original_context
        if original is not None and (not is_whole(original, 2) or original > self.context_length):
            raise ConfigError(f"model.rope_original_context={original!r} must be an integer in [2, "
                              f"model.context_length={self.context_length}] (null: model.context_length)")
        if self.rope_scaling == "none":
            if self.rope_factor != 1:
                raise ConfigError(f"model.rope_factor={self.rope_factor} does nothing with model.rope_scaling=none; "
                                  f"choose a scaling: {', '.join(SCALINGS[1:])}")
            return
        if self.position != "rope":
            raise ConfigError(f"model.rope_scaling={self.rope_scaling} scales RoPE's frequencies, but "
                              f"model.position={self.position}")
        if self.rope_factor <= 1:
            raise ConfigError(f"model.rope_factor={self.rope_factor} must be > 1 with model.rope_scaling="
                              f"{self.rope_scaling}: it is the new length over the original context")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_settings(cls, settings: dict) -> "ModelConfig":
        """A composed config's `model` node, its vocab_size set: the attention group's name (model.attention) checked
        against the settings it names, then the model."""
        check_attention_choice(settings["attention"], settings["n_heads"], settings["n_kv_heads"], settings["kv_rank"],
                               settings["linear_pattern"])
        return cls.from_dict(settings)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """Build from a dict (a checkpoint's JSON), ignoring keys that are not the model's: the attention's name
        (derived from n_kv_heads; older checkpoints store it). A composed config goes through from_settings, which also
        checks the attention group's name against the head counts."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})
