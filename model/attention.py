"""Causal self-attention with n_heads query heads and n_kv_heads key/value heads.

    x: [B, T, d]  ->  q: [B, H, T, D],  k, v: [B, H_kv, T, D]    (D = d / H, H_kv divides H)
    attn(q, k, v) = softmax(q k^T / sqrt(D) + causal_mask) v      -> [B, H, T, D] -> [B, T, d] Wo

MHA: H_kv = H.  GQA: 1 < H_kv < H, each K/V head serves a group of H / H_kv query heads.
MQA: H_kv = 1.  Fewer K/V heads mean fewer K/V parameters and a KV cache H / H_kv times smaller.
The K/V heads are shared through scaled_dot_product_attention(enable_gqa=True), which
broadcasts them instead of materialising H copies.

With QK-norm (model/qk_norm.py), each q and k head is RMS-normalised first. With RoPE, q and k are then
rotated by their absolute positions before the dot product. With a KV cache, the new tokens start at absolute
position `start` and attend to the cached ones.

Sliding window (Mistral, Gemma 3, gpt-oss; model.window = W, model.window_pattern picks the local layers): a local
layer's query at position t sees the keys at t - W < s <= t, a band instead of the causal triangle:
    attn = softmax(q k^T / sqrt(D) + band_mask) v        band_mask[t, s] = 0 if t - W < s <= t else -inf
Its cache needs only the last W keys, a rolling buffer (model/kv_cache.py). sdpa takes the band as a bool mask,
so on a CPU its fused kernel still never materialises the weights (it keeps the T x S mask).

Sinks (gpt-oss, model.sinks): a learned logit s_h per query head, one more column of the softmax that takes weight
and gives no value, so a head can attend to "nothing":
    w = softmax([q k^T / sqrt(D) + mask, s_h])[:, :S]    y = w v       (the rows of w sum to less than 1)
sdpa runs it as one more key that every query sees, with logit s_h and value 0: q' = [q, s_h sqrt(D)], the keys
[k, 0], the sink's key [0, ..., 0, 1], at sdpa's scale 1 / sqrt(D) (attend_with_sink).

Output gate (Qwen3-Next, Qwen3.5; model.attention_gate): y = attn(q, k, v) * sigmoid(x W_g), per head and dim,
before W_o: a head can shut its output for a token. Partial RoPE (model.rotary_fraction = f, Qwen3-Next's 0.25): RoPE
turns the first f D dims of each q and k head, the rest carry no position.

sdpa never materialises the attention weights; attention_scores and attention_weights below compute
them from Attention.heads' q and k for what looks inside the model (training/diagnostics.py, insight/).

The class reads: __init__, forward and heads (the formula), then its answers to the repo (model/interfaces.py's
Mixer: build, cost, cache, what insight shows), then the rules of its settings.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from model.interfaces import Mixer
from model.kv_cache import CacheField, FullCache, PerPosition, RollingCache, StreamingCache
from model.checks import is_number, is_whole
from model.config import local_run_of
from model.positions import Rotary
from model.qk_norm import QKNorm


WINDOW_PATTERNS = "all, alternate or N:1 (N local layers to one global, e.g. 5:1)"  # model.window_pattern's forms


class Attention(Mixer):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool, dropout: float,
                 rotary: Rotary | None, qk_norm: QKNorm | None, window: int | None = None, sinks: bool = False,
                 gate: bool = False):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.gate = nn.Linear(d_model, d_model, bias=bias) if gate else None  # W_g, Qwen3-Next's output gate
        self.window = window  # the positions a query sees, its own included; None: all earlier ones
        # gpt-oss's sink logits, one per query head; 0 at init: the sink starts as one more key of logit 0
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None
        # One matmul for Q, K and V: their rows are stacked [Wq; Wk; Wv] (an optimizer that treats each
        # matrix on its own, Muon, reads stacked_rows).
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.qkv.stacked_rows = [n_heads * self.head_dim] + 2 * [n_kv_heads * self.head_dim]
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.qk_norm = qk_norm
        self.rotary = rotary
        self.dropout = dropout

    def forward(self, x: torch.Tensor, start: int = 0, cache: FullCache | None = None,
                value_embedding: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.heads(x, start)
        if value_embedding is not None:  # [B, T, H_kv D] -> the value heads' [B, H_kv, T, D]: model/value_embeddings.py
            v = v + value_embedding.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        key_positions = None  # the keys are the positions up to the last query's, in order
        if cache is not None:
            k, v, key_positions = cache.update(start, k, v)
        mask = visible_keys(start, T, k.shape[2], key_positions, self.window, x.device)
        dropout = self.dropout if self.training else 0.0
        if self.sinks is not None:
            y = attend_with_sink(q, k, v, mask, self.sinks, dropout)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                               dropout_p=dropout, enable_gqa=self.n_kv_heads != self.n_heads)
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.out(y if self.gate is None else y * self.gate(x).sigmoid())

    def heads(self, x: torch.Tensor, start: int = 0, qk_norm: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q: [B, H, T, D], k and v: [B, H_kv, T, D], q and k normalised with QK-norm (unless qk_norm=False: the
        raw projections), then rotated with RoPE."""
        B, T, _ = x.shape
        H, H_kv = self.n_heads, self.n_kv_heads
        # [B, T, (H + 2 H_kv) D] -> [B, H + 2 H_kv, T, D]: the q, k and v heads side by side
        heads = self.qkv(x).view(B, T, H + 2 * H_kv, self.head_dim).transpose(1, 2)
        qk, v = heads.split([H + H_kv, H_kv], dim=1)
        if self.qk_norm is not None and qk_norm:
            qk = torch.cat(self.qk_norm(*qk.split([H, H_kv], dim=1)), dim=1)
        if self.rotary is not None:  # q and k heads in one call: the same rotation per position
            turned = self.rotary.head_dim
            qk = self.rotary(qk, start) if turned == self.head_dim else \
                torch.cat([self.rotary(qk[..., :turned], start), qk[..., turned:]], dim=-1)
        q, k = qk.split([H, H_kv], dim=1)
        return q, k, v

    # -------- its answers to the repo (model/interfaces.py's Mixer)
    @classmethod
    def from_config(cls, cfg, layer: int, rotary: Rotary | None) -> "Attention":
        """Block `layer`'s attention: its K/V heads, its window (model.window_pattern's), its QK-norm, sinks and gate."""
        qk_norm = QKNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm == "rmsnorm" else None
        return cls(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.bias, cfg.dropout, rotary, qk_norm,
                   cfg.layer_windows[layer], cfg.sinks, cfg.attention_gate)

    def residual_weights(self) -> list[nn.Parameter]:
        """W_o (GPT-2's scaled init)."""
        return [self.out.weight]

    @classmethod
    def flops_per_token(cls, cfg, layer: int, seq_len: int) -> float:
        """2 per multiply-add: the projections 2 d (H + 2 H_kv) D + 2 H D d, and q k^T and the weights times v,
        2 H D each per key seen, over mean_keys_seen's span (the window's in a local layer); the output gate's W_g,
        2 d H D. The sink logit multiplies nothing."""
        H, D, d = cfg.n_heads, cfg.head_dim, cfg.d_model
        span = mean_keys_seen(seq_len, cfg.layer_windows[layer])
        gate = 2 * d * H * D if cfg.attention_gate else 0  # W_g
        return 2 * d * (H + 2 * cfg.n_kv_heads) * D + 2 * H * D * d + gate + 2 * 2 * H * D * span

    @staticmethod
    def value_width(cfg) -> int:
        """One position's values, H_kv D wide."""
        return cfg.n_kv_heads * cfg.head_dim

    # The cache: K and V of n_kv_heads heads per position (model/kv_cache.py); a local layer holds its window
    PER_POSITION = PerPosition(
        name="heads", label="K/V heads", title="KV cache",
        fields=(CacheField("kv_heads", "H_kv", "K/V heads H_kv", "K/V heads per layer (H_kv)"),
                CacheField("head_dim", "d_head", "head dim d_head", "each K and V head's dims (d_head)")),
        terms=((2, ("kv_heads", "head_dim")),), text="2 (K, V) x {kv_heads} KV heads x {head_dim} head dim")

    @staticmethod
    def cache_dims(cfg) -> dict[str, int]:
        return {"kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim}

    @classmethod
    def cache_bytes(cls, cfg, layer: int, positions: int, batch: int, bytes_per_element: int) -> int:
        """A local layer holds min(window, positions)."""
        held = min(cfg.layer_windows[layer] or positions, positions)
        return held * cls.PER_POSITION.elements(cls.cache_dims(cfg)) * batch * bytes_per_element

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str,
                  sink_tokens: int | None = None) -> FullCache:
        """A window shorter than max_len rolls through it; otherwise, with sink_tokens S, it streams past max_len
        keeping the first S positions (S = 0: the window alone)."""
        sizes = (batch, self.n_kv_heads, max_len, self.head_dim, self.head_dim)
        if self.rolls(max_len):
            return RollingCache(*sizes, self.window, dtype, device)
        if sink_tokens is not None:
            return StreamingCache(*sizes, sink_tokens, self.rotary, dtype, device)
        return FullCache(*sizes, dtype=dtype, device=device)

    def rolls(self, max_len: int) -> bool:
        """A window shorter than max_len rolls."""
        return self.window is not None and self.window < max_len

    @staticmethod
    def stream_refusal(cfg) -> None:
        """None: its cache streams, as a StreamingCache."""
        return None

    def weights(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The weights forward applies to v (attention_weights: the window's band, the rows short of 1 by the sink's
        share)."""
        q, k, _ = self.heads(x, start)
        return attention_weights(q, k, self.window, self.sinks)

    def logits(self, x: torch.Tensor, start: int = 0, qk_norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Its q and k (qk_norm=False: before the QK-norm, as the raw projections would give them)."""
        return self.heads(x, start, qk_norm)[:2]

    def logit_bound(self) -> float | None:
        """QKNorm.logit_bound; None without QK-norm."""
        return None if self.qk_norm is None else self.qk_norm.logit_bound()

    def cached_value_rows(self) -> list[tuple[nn.Linear, slice]]:
        """V head j's rows among the stacked [Wq; Wk; Wv]."""
        H, H_kv, D = self.n_heads, self.n_kv_heads, self.head_dim
        return [(self.qkv, slice((H + H_kv + j) * D, (H + H_kv + j + 1) * D)) for j in range(H_kv)]

    @property
    def output_heads(self) -> int:
        """The query heads."""
        return self.n_heads

    # -------- its settings
    @classmethod
    def validate(cls, cfg) -> None:
        """Its own settings, the window's and the sinks' (model.window, window_pattern, sinks), the output gate and
        RoPE's share."""
        window, pattern = cfg.window, cfg.window_pattern
        if window is not None and (not is_whole(window) or window >= cfg.context_length):
            raise ConfigError(f"model.window={window!r} must be an integer in [1, model.context_length="
                              f"{cfg.context_length}), or null for full attention")
        if pattern not in ("all", "alternate") and local_run_of(pattern) is None:
            raise ConfigError(f"model.window_pattern={pattern!r} must be {WINDOW_PATTERNS}")
        if window is None and pattern != "all":
            raise ConfigError(f"model.window_pattern={pattern} says which layers are local, but model.window=null "
                              f"makes none; set model.window")
        if not isinstance(cfg.sinks, bool):
            raise ConfigError(f"model.sinks={cfg.sinks!r} must be true or false")
        if not isinstance(cfg.attention_gate, bool):
            raise ConfigError(f"model.attention_gate={cfg.attention_gate!r} must be true or false")
        fraction = cfg.rotary_fraction
        if not (is_number(fraction) and 0 < fraction <= 1):
            raise ConfigError(f"model.rotary_fraction={fraction!r} must be a number in (0, 1]")
        if fraction != 1 and cfg.position != "rope":
            raise ConfigError(f"model.rotary_fraction={fraction} is RoPE's share of each head, but "
                              f"model.position={cfg.position}")
        turned = cfg.head_dim * fraction
        if fraction != 1 and (turned != int(turned) or int(turned) % 2):
            raise ConfigError(f"model.rotary_fraction={fraction} turns {turned:g} of each head's {cfg.head_dim} dims; "
                              f"RoPE needs an even whole number of them")

    @classmethod
    def refuse_settings(cls, cfg) -> None:
        """Another attention is chosen: it checks this one's settings (the window's) itself (model/mla.py)."""


def mean_keys_seen(seq_len: int, window: int | None) -> float:
    """The keys a query sees, on average over the T = seq_len queries of a causal sequence: query t sees min(t + 1, W)
    of them, so (T + 1) / 2 without a window (or W >= T), else (W (W + 1) / 2 + (T - W) W) / T. What the attention's
    FLOPs count (a kernel that computes the whole T x T square and masks it does about twice the work)."""
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2
    return (window * (window + 1) / 2 + (seq_len - window) * window) / seq_len


def visible_keys(start: int, n_queries: int, n_keys: int, key_positions: torch.Tensor | None, window: int | None,
                 device) -> torch.Tensor | None:
    """[T, S] bool, True where query i (at position start + i) sees key j: the key is at or before it, and within
    its window. key_positions: [S], each key's position (a rolling cache's slots), or None for keys that are the
    positions up to the last query's in order (the last T of them the queries'). None where that needs no mask:
    sdpa's own is_causal (T == S) or one query that sees every key."""
    if key_positions is None:
        if window is None or n_keys <= window:  # the window cuts nothing: the causal triangle
            return causal_mask(n_queries, n_keys, device)
        key_positions = torch.arange(start + n_queries - n_keys, start + n_queries, device=device)
    queries = torch.arange(start, start + n_queries, device=device)[:, None]
    visible = key_positions[None, :] <= queries
    return visible if window is None else visible & (key_positions[None, :] > queries - window)


def causal_mask(n_queries: int, n_keys: int, device) -> torch.Tensor | None:
    """last_positions_mask, or None where sdpa's own is_causal (n_queries == n_keys) or no mask at all (one query
    sees every key) is exact."""
    return None if n_queries == 1 or n_queries == n_keys else last_positions_mask(n_queries, n_keys, device)


def last_positions_mask(n_queries: int, n_keys: int, device) -> torch.Tensor:
    """[T, S] bool for queries that are the last T of S positions: query i sees keys 0 .. S - T + i."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


def attend_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     sinks: torch.Tensor, dropout: float = 0.0) -> torch.Tensor:
    """softmax([q k^T / sqrt(D) + mask, s_h]) over the keys and a sink, applied to [v, 0]: [B, H, T, D_v]. The sink
    is one more key, the last, seen by every query: q gets a dimension s_h sqrt(D), the keys a 0 there, the sink's
    key is 1 there and 0 elsewhere, and its value is 0; mask: visible_keys' (None: causal, or one query).
    Sequences of v's width only: the values get a dimension of 0 as well (dropped from the output)."""
    B, H, T, D = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D)
    q = torch.cat([q, (sinks.to(q.dtype) / scale).view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
    k = F.pad(F.pad(k, (0, 1)), (0, 0, 0, 1))  # [k, 0] and a row of zeros for the sink, set to [0, ..., 0, 1]
    k[:, :, -1, -1] = 1
    # the values get a 0 dimension too (dropped from the output): with q, k and v of one width sdpa keeps its fused
    # CPU kernel, where a value narrower than the key sends it to the one that materialises the weights. On CUDA a
    # width of D + 1 may rule out the fused kernels (untested here); each decode step also copies the cache's K/V.
    v = F.pad(v, (0, 1, 0, 1))
    if mask is None and T > 1:  # the causal triangle, made explicit: the sink's column breaks is_causal's alignment
        mask = last_positions_mask(T, S, q.device)
    if mask is not None:
        mask = F.pad(mask, (0, 1), value=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale,
                                          enable_gqa=H_kv != H)[..., :-1]


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q: [B, H, T_q, D], k: [B, H_kv, T_k, D] -> q k^T / sqrt(D): [B, H, T_q, T_k], in q's dtype. Query head h
    reads K/V head h // (H / H_kv), the grouping enable_gqa gives sdpa."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def attention_weights(q: torch.Tensor, k: torch.Tensor, window: int | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) for q and k of the same T positions: [B, H, T, T], row t the weights query t
    gives keys 0 .. t (t - window < s <= t in a local layer), the ones forward's sdpa applies to v. With sinks the
    softmax has their column too, left out here: a row then sums to less than 1."""
    T = q.shape[-2]
    visible = visible_keys(0, T, T, torch.arange(T, device=q.device), window, q.device)
    scores = attention_scores(q, k).masked_fill(~visible, -math.inf)
    if sinks is None:
        return scores.softmax(dim=-1)
    scores = torch.cat([scores, sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)], dim=-1)
    return scores.softmax(dim=-1)[..., :T]
