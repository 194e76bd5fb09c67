"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025; the linear layers of Qwen3-Next and Qwen3.5): attention's
place taken by a fixed-size state, which the cache holds instead of one K and V per position.

    x: [B, T, d]
    q, k, v = SiLU(causal depthwise conv, kernel K, of x W_qkv)     q, k: [B, H_k, T, d_k], v: [B, H_v, T, d_v]
    q, k L2-normalised over d_k, q then scaled by 1 / sqrt(d_k); key head j serves value heads j r .. j r + r - 1,
    r = H_v / H_k (Qwen3.5: 16 key heads, 32 value heads)
    alpha_t = exp(-exp(A_log) softplus(x_t W_a + dt_bias)),  beta_t = sigmoid(x_t W_b)           [B, H_v, T] each
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T              S: [B, H_v, d_k, d_v], S_0 = 0
    o_t = S_t^T q_t                                                              [B, H_v, T, d_v]
    y = (RMSNorm(o) * SiLU(x W_z)) W_o          the norm per head over d_v; [B, T, H_v d_v] -> [B, T, d]

S is a key -> value memory: k_t^T S is what it recalls for k_t, and each step writes beta_t (v_t - that recall) at
k_t (the delta rule: one step of online least squares), after alpha_t has faded everything (the gate). Without the
delta rule's correction (model.linear_delta_rule=false, for the study) it is gated linear attention, Mamba-2's update:
S_t = alpha_t S_{t-1} + k_t v_t^T, with no beta.

Two forms compute the same o (tests/test_gated_deltanet.py holds them and a naive reference to 1e-10 in float64):
  recurrent  one position at a time (recurrent_delta_rule): the decode step, O(H_v d_k d_v) whatever the length
  chunked    chunks of C positions (model.linear_chunk; chunked_delta_rule): with Gamma_i the gate's product from
             the chunk's start to i and S_0 the state before it, the chunk's corrected values u_i solve
                 (I + A) U = beta V - beta Gamma K S_0,   A_ij = beta_i (Gamma_i / Gamma_j) k_i . k_j  for j < i
             (A strictly lower triangular: one triangular solve), then
                 O = (Gamma Q) S_0 + ((Q K^T) * D) U,   D_ij = Gamma_i / Gamma_j for j <= i, else 0
                 S_C = Gamma_C S_0 + (K Gamma_C / Gamma)^T U
             matmuls of C x C and C x d within a chunk, one pass of the state per chunk: training and a prefill.
The cache is S and the conv's last K - 1 inputs (model/kv_cache.py's StateCache): H_v d_k d_v + (2 H_k d_k + H_v
d_v)(K - 1) numbers per layer, the same at 100 positions as at a million.

model.linear_pattern makes the layers Gated DeltaNet: all of them, or N:1 (N linear layers, then one attention
layer: Qwen3-Next's and Qwen3.5's 3:1), or alternate; the attention layers are model/attention.py's (with Qwen's
output gate, model.attention_gate, and partial RoPE, model.rotary_fraction). The linear layers read no positions:
order comes from the conv and the gate.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from model.attention import WINDOW_PATTERNS, Attention
from model.checks import is_whole, refuse_set
from model.config import local_run_of
from model.interfaces import Mixer
from model.kv_cache import CacheField, PerPosition, StateCache
from model.norms import RMSNorm
from model.positions import Rotary

L2_EPS = 1e-6  # inside the square root of q's and k's L2 norms, as FLA's kernels and transformers' Qwen3.5 have it
SIZES = ("linear_key_heads", "linear_value_heads", "linear_head_dim")  # beside model.linear_pattern, which chooses it
# its attention layers' settings: each one's default, and the override that restores it
ATTENTION_SETTINGS = {"attention_gate": (False, "model.attention_gate=false"),
                      "rotary_fraction": (1.0, "model.rotary_fraction=1.0"), "qk_norm": ("none", "qk_norm=none")}


def l2_normalised(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def faded(gamma: torch.Tensor) -> torch.Tensor:
    """gamma: [..., T], the log of the gate's product from the start to each position -> Gamma_i / Gamma_j: [..., T, T]
    for j <= i, 0 above; exp of a difference <= 0, never of a growing product."""
    T = gamma.shape[-1]
    later = torch.ones(T, T, dtype=torch.bool, device=gamma.device).triu(1)
    return (gamma.unsqueeze(-1) - gamma.unsqueeze(-2)).masked_fill(later, -math.inf).exp()


def recurrent_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                         beta: torch.Tensor | None, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: [B, H, T, d_k] (normalised, q scaled), v: [B, H, T, d_v], log_decay = log alpha and beta: [B, H, T],
    state: [B, H, d_k, d_v] -> (o [B, H, T, d_v], the state after the last position); one position at a time.
    beta None: no delta rule, each v_t written whole (gated linear attention)."""
    outputs = []
    for t in range(q.shape[2]):
        state = state * log_decay[:, :, t, None, None].exp()
        k_t = k[:, :, t]
        if beta is None:
            correction = v[:, :, t]
        else:
            recalled = torch.einsum("bhk,bhkv->bhv", k_t, state)
            correction = beta[:, :, t, None] * (v[:, :, t] - recalled)
        state = state + k_t.unsqueeze(-1) * correction.unsqueeze(-2)
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outputs, dim=2), state


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                       beta: torch.Tensor | None, state: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """recurrent_delta_rule's result, chunk positions at a time (the module docstring's chunked form). The sequence is
    padded to a whole number of chunks with v = 0 and beta = 0 (no write) and log_decay = 0 (no fading): the state
    passes the padding unchanged. beta None: no delta rule, U = V."""
    B, H, T, d_k = k.shape
    pad = -T % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)).unflatten(2, (-1, chunk)) for x in (q, k, v))  # [B, H, N, C, d]
    log_decay = F.pad(log_decay, (0, pad)).unflatten(2, (-1, chunk))  # [B, H, N, C]
    gamma = log_decay.cumsum(-1)  # log Gamma_i, from the chunk's start
    decay = faded(gamma)  # [B, H, N, C, C]
    if beta is None:  # every value written whole: U = V, nothing of S_0 to subtract
        new_values, faded_keys = v, None
    else:
        beta = F.pad(beta, (0, pad)).unflatten(2, (-1, chunk))
        written = (beta.unsqueeze(-1) * decay * (k @ k.transpose(-1, -2))).tril(-1)  # A
        system = written + torch.eye(chunk, dtype=q.dtype, device=q.device)  # I + A, unit lower triangular
        new_values = torch.linalg.solve_triangular(system, beta.unsqueeze(-1) * v, upper=False, unitriangular=True)
        faded_keys = torch.linalg.solve_triangular(system, (beta * gamma.exp()).unsqueeze(-1) * k, upper=False,
                                                   unitriangular=True)  # U = new_values - faded_keys S_0
    scores = (q @ k.transpose(-1, -2)) * decay
    q_faded = q * gamma.exp().unsqueeze(-1)
    k_to_end = k * (gamma[..., -1:] - gamma).exp().unsqueeze(-1)
    chunk_decay = gamma[..., -1].exp()
    outputs = []
    for n in range(q.shape[2]):
        corrected = new_values[:, :, n] if faded_keys is None else new_values[:, :, n] - faded_keys[:, :, n] @ state
        outputs.append(q_faded[:, :, n] @ state + scores[:, :, n] @ corrected)
        state = state * chunk_decay[:, :, n, None, None] + k_to_end[:, :, n].transpose(-1, -2) @ corrected
    return torch.cat(outputs, dim=2)[:, :, :T], state


class GatedDeltaNet(Mixer):
    # No window, no RoPE, no softmax logits and no value embedding (its values go into the state): the Mixer's
    # defaults

    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.key_heads, self.value_heads = cfg.n_linear_key_heads, cfg.n_linear_value_heads
        self.head_dim, self.chunk = cfg.linear_dim, cfg.linear_chunk
        H_k, H_v, D = self.key_heads, self.value_heads, self.head_dim
        self.qkv = nn.Linear(d, (2 * H_k + H_v) * D, bias=cfg.bias)
        self.qkv.stacked_rows = [H_k * D, H_k * D, H_v * D]  # Muon orthogonalises each on its own
        channels = self.qkv.out_features
        self.conv = nn.Conv1d(channels, channels, cfg.linear_conv, groups=channels, bias=False)
        self.decay_proj = nn.Linear(d, H_v, bias=cfg.bias)  # a
        self.beta_proj = nn.Linear(d, H_v, bias=cfg.bias) if cfg.linear_delta_rule else None  # b
        self.gate = nn.Linear(d, H_v * D, bias=cfg.bias)  # z
        # Mamba-2's init: A ~ U(1, 16), and a step dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1] at a = 0, so
        # that the heads start with memories from a few to a few thousand positions
        self.A_log = nn.Parameter(torch.empty(H_v).uniform_(1, 16).log())
        step = torch.empty(H_v).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = nn.Parameter(step + torch.log(-torch.expm1(-step)))  # softplus's inverse
        self.norm = RMSNorm(D, cfg.norm_eps)
        self.out = nn.Linear(H_v * D, d, bias=cfg.bias)

    def forward(self, x: torch.Tensor, start: int = 0, cache: StateCache | None = None,
                value_embedding: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        held = cache.read(start, T) if cache is not None else None
        q, k, v, log_decay, beta, history = self.projections(x, None if held is None else held["conv"])
        state = q.new_zeros(B, self.value_heads, self.head_dim, self.head_dim) if held is None else held["state"]
        if T == 1 and held is not None:  # a decode step: the recurrence itself
            o, state = recurrent_delta_rule(q, k, v, log_decay, beta, state)
        else:
            o, state = chunked_delta_rule(q, k, v, log_decay, beta, state, self.chunk)
        if cache is not None:
            cache.write({"state": state, "conv": history})
        y = self.norm(o.transpose(1, 2)) * F.silu(self.gate(x).view(B, T, self.value_heads, self.head_dim))
        return self.out(y.flatten(2))

    def projections(self, x: torch.Tensor, history: torch.Tensor | None = None):
        """q, k [B, H_v, T, D] (normalised, q scaled, each key head repeated for its value heads), v [B, H_v, T, D],
        log alpha and beta [B, H_v, T], and the conv's last K - 1 inputs after x; history: those before x (None:
        zeros, a sequence's start)."""
        B, T, _ = x.shape
        H_k, H_v, D = self.key_heads, self.value_heads, self.head_dim
        mixed = self.qkv(x).transpose(1, 2)  # [B, channels, T]
        if history is None:
            history = mixed.new_zeros(B, mixed.shape[1], self.conv.kernel_size[0] - 1)
        mixed = torch.cat([history, mixed], dim=-1)
        history = mixed[..., mixed.shape[-1] - history.shape[-1]:]
        mixed = F.silu(self.conv(mixed)).transpose(1, 2)  # [B, T, channels]: only the T outputs of x's positions
        q, k, v = mixed.split([H_k * D, H_k * D, H_v * D], dim=-1)
        q, k = (l2_normalised(t.view(B, T, H_k, D)).repeat_interleave(H_v // H_k, dim=2).transpose(1, 2)
                for t in (q, k))
        v = v.view(B, T, H_v, D).transpose(1, 2)
        log_decay = -self.A_log.exp() * F.softplus(self.decay_proj(x) + self.dt_bias)  # [B, T, H_v]
        beta = None if self.beta_proj is None else self.beta_proj(x).sigmoid().transpose(1, 2)
        return q / math.sqrt(D), k, v, log_decay.transpose(1, 2), beta, history

    # -------- its answers to the repo (model/interfaces.py's Mixer)
    @classmethod
    def from_config(cls, cfg, layer: int, rotary: Rotary | None) -> "GatedDeltaNet":
        return cls(cfg)

    @classmethod
    def layer_class(cls, cfg, layer: int) -> type:
        """Block `layer`'s kind: this one where model.linear_pattern makes it linear, else attention."""
        return cls if cfg.linear_layers[layer] else Attention

    def residual_weights(self) -> list[nn.Parameter]:
        """The weight this branch writes into the residual stream with: W_o (GPT-2's scaled init)."""
        return [self.out.weight]

    @classmethod
    def flops_per_token(cls, cfg, layer: int, seq_len: int) -> float:
        """Forward FLOPs per token (2 per multiply-add), the same at any length: the projections W_qkv, W_a, W_b, W_z
        and W_o, the conv's K taps per channel, and the recurrence's three products with the state per value head
        (k^T S, the rank-one write, S^T q: 2 d_k d_v each). The chunked form that training runs spends more (its
        C x C products), which this does not count, as the attention's count leaves out a kernel's masked work."""
        H_k, H_v, D, d = cfg.n_linear_key_heads, cfg.n_linear_value_heads, cfg.linear_dim, cfg.d_model
        channels, delta = (2 * H_k + H_v) * D, cfg.linear_delta_rule  # without the delta rule: no W_b, no k^T S
        projections = 2 * d * channels + 2 * d * (1 + delta) * H_v + 2 * d * H_v * D + 2 * H_v * D * d
        return projections + 2 * cfg.linear_conv * channels + (2 + delta) * 2 * H_v * D * D

    # The cache: its attention layers' K and V per position (a hybrid's; Attention's), and per linear layer a fixed
    # state (PerPosition.state_terms): S and the conv's history
    PER_POSITION = PerPosition(
        name="state", label="Gated DeltaNet state", title="fixed state (Gated DeltaNet)",
        fields=(*Attention.PER_POSITION.fields,
                CacheField("linear_value_heads", "H_v", "value heads H_v", "Gated DeltaNet's value heads (H_v)"),
                CacheField("linear_key_heads", "H_k", "key heads H_k", "Gated DeltaNet's key heads (H_k)"),
                CacheField("linear_head_dim", "d_h", "head dim d_h", "Gated DeltaNet's head dims (d_k = d_v)"),
                CacheField("conv_history", "K-1", "conv history K - 1", "the conv's kernel less one (default 3)",
                           default=3)),
        terms=Attention.PER_POSITION.terms,
        state_terms=((1, ("linear_value_heads", "linear_head_dim", "linear_head_dim")),
                     (2, ("linear_key_heads", "linear_head_dim", "conv_history")),
                     (1, ("linear_value_heads", "linear_head_dim", "conv_history"))),
        text="2 (K, V) x {kv_heads} KV heads x {head_dim} head dim in an attention layer; a state of "
             "{linear_value_heads} x {linear_head_dim} x {linear_head_dim} + the conv's last {conv_history} inputs "
             "in a linear layer",
        window_refusal="a Gated DeltaNet layer has no keys to window",
        row="fixed state ({linear_value_heads} x {linear_head_dim}^2 + conv)")

    @staticmethod
    def cache_dims(cfg) -> dict[str, int]:
        """The widths PER_POSITION reads, of a model of these settings (its attention layers' too)."""
        return Attention.cache_dims(cfg) | {
            "linear_value_heads": cfg.n_linear_value_heads, "linear_key_heads": cfg.n_linear_key_heads,
            "linear_head_dim": cfg.linear_dim, "conv_history": cfg.linear_conv - 1}

    @classmethod
    def cache_bytes(cls, cfg, layer: int, positions: int, batch: int, bytes_per_element: int) -> int:
        """What new_cache allocates, whatever the positions: the state and the conv's history."""
        return cls.PER_POSITION.state_elements(cls.cache_dims(cfg)) * batch * bytes_per_element

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str,
                  sink_tokens: int | None = None) -> StateCache:
        """The state S and the conv's history, zeros (stream_refusal refuses sink tokens for an all-linear model; a
        hybrid's attention layers keep them, and this layer streams by itself)."""
        shapes = {"state": (self.value_heads, self.head_dim, self.head_dim),
                  "conv": (self.qkv.out_features, self.conv.kernel_size[0] - 1)}
        return StateCache(batch, max_len, shapes, dtype, device)

    def rolls(self, max_len: int) -> bool:
        """Its state goes on past any length by itself (Attention.rolls)."""
        return True

    @staticmethod
    def stream_refusal(cfg) -> str | None:
        """Sink tokens refused where no layer is attention (Attention.stream_refusal): nothing would keep them."""
        if all(cfg.linear_layers):
            return ("with model.linear_pattern=all: every layer is Gated DeltaNet, whose state runs past any length "
                    "by itself and keeps no positions")
        return None

    def weights(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """What each position reads of each earlier one, for what looks inside the model (insight/): the gate-faded
        q . k, (Gamma_i / Gamma_j) q_i . k_j for j <= i, [B, H_v, T, T] over x's own positions: o would be these
        times the values if the delta rule corrected nothing. Rows need not sum to 1."""
        q, k, _, log_decay, _, _ = self.projections(x)
        return (q @ k.transpose(-1, -2)) * faded(log_decay.cumsum(-1))

    def cached_value_rows(self) -> list[tuple[nn.Linear, slice]]:
        """For each value head, the rows of [W_q; W_k; W_v] that make its values (insight's wiring probe zeroes them)."""
        H_k, D = self.key_heads, self.head_dim
        return [(self.qkv, slice((2 * H_k + j) * D, (2 * H_k + j + 1) * D)) for j in range(self.value_heads)]

    @property
    def output_heads(self) -> int:
        """The value heads, each d_v wide."""
        return self.value_heads

    # -------- its settings
    @classmethod
    def validate(cls, cfg) -> None:
        """The rules of its own settings (model.linear_pattern and SIZES, linear_conv, linear_chunk) and of its
        attention layers' (Attention.validate), and the settings it cannot take: a ConfigError naming the first one
        broken."""
        pattern = cfg.linear_pattern
        if pattern not in ("all", "alternate") and local_run_of(pattern) is None:
            raise ConfigError(f"model.linear_pattern={pattern!r} must be {WINDOW_PATTERNS.replace('local', 'linear')}"
                              f", or null for attention in every layer")
        if pattern != "all" and all(cfg.linear_layers):  # too few layers to reach the pattern's attention layer
            first = 1 if pattern == "alternate" else local_run_of(pattern)
            raise ConfigError(f"model.n_layers={cfg.n_layers} with model.linear_pattern={pattern} makes every layer "
                              f"linear (its first attention layer is layer {first}, counting from 0); use "
                              f"model.n_layers>={first + 1}, or model.linear_pattern=all for an all-linear model")
        if not isinstance(cfg.linear_delta_rule, bool):
            raise ConfigError(f"model.linear_delta_rule={cfg.linear_delta_rule!r} must be true or false")
        for key in (*SIZES, "linear_conv", "linear_chunk"):
            value = getattr(cfg, key)
            if value is not None and not is_whole(value):
                raise ConfigError(f"model.{key}={value!r} must be a positive integer")
        if cfg.n_linear_value_heads % cfg.n_linear_key_heads:
            raise ConfigError(f"model.linear_value_heads={cfg.n_linear_value_heads} must be a multiple of "
                              f"model.linear_key_heads={cfg.n_linear_key_heads}: each key head serves a group of "
                              f"value heads")
        if cfg.linear_conv < 2:
            raise ConfigError(f"model.linear_conv={cfg.linear_conv} must be at least 2: the causal conv mixes each "
                              f"position with the ones before it (Qwen3.5's is 4)")
        Attention.validate(cfg)
        if cfg.window is not None or cfg.sinks:
            setting = f"model.window={cfg.window}" if cfg.window is not None else "model.sinks=true"
            raise ConfigError(f"{setting} with model.linear_pattern={pattern}: the hybrid's attention layers are "
                              f"global here (Qwen3-Next's and Qwen3.5's), and a linear layer has no keys to window")
        if pattern == "all":  # no attention layer: the attention's own switches would change nothing
            changed = [(f"model.{key}={getattr(cfg, key)}", instead) for key, (default, instead)
                       in ATTENTION_SETTINGS.items() if getattr(cfg, key) != default]
            changed += [("model.position=rope", "position=none")] * (cfg.position == "rope")
            if changed:
                setting, instead = changed[0]  # advice that undoes this one, not a setting already in place
                raise ConfigError(f"{setting} with model.linear_pattern=all: no layer is attention, so it would "
                                  f"change nothing (the linear layers read order from their conv and gate, and "
                                  f"L2-normalise q and k themselves); use {instead}, or a hybrid pattern such "
                                  f"as model.linear_pattern=3:1")

    @classmethod
    def refuse_settings(cls, cfg) -> None:
        """Another attention is chosen: each of SIZES is left unset, the delta rule as it is."""
        if cfg.linear_delta_rule is not True:
            raise ConfigError(f"model.linear_delta_rule={cfg.linear_delta_rule!r} is a setting of "
                              f"attention=gated_deltanet, but this model has no linear layer (model.linear_pattern=null)")
        refuse_set(cfg, SIZES, "attention=gated_deltanet", "no linear layer (model.linear_pattern=null)")
