"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): every head's key and value is up-projected from one
low-rank latent per token, and the latent, not K and V, is what the cache holds.

    x: [B, T, d]
    c_kv = RMSNorm(x W_dkv)                    [B, T, d_c]         the latent (model.kv_rank)
    k_R  = RoPE(x W_kr)                        [B, 1, T, d_R]      one RoPE key, shared by every head
    q    = RMSNorm(x W_dq) W_uq  (q_rank)  or  x W_q                -> q_C: [B, H, T, D], q_R = RoPE(.): [B, H, T, d_R]
    k_C  = c_kv W_uk                           [B, H, T, D]        each head's key, without positions
    v    = c_kv W_uv                           [B, H, T, D_v]
    y    = softmax((q_C k_C^T + q_R k_R^T) / sqrt(D + d_R) + causal_mask) v  -> [B, T, H D_v] W_o

D = d / H (head_dim), d_R = model.rope_head_dim, D_v = model.v_head_dim. The cache holds d_c + d_R numbers per
token and layer, whatever H: GQA's holds 2 H_kv D (model/kv_cache.py).

The absorbed form, for decoding against the cache: q_C k_C^T = (q_C W_uk,h^T) c_kv^T and softmax(s) v =
(softmax(s) c_kv) W_uv,h^T, so each head's query moves into the latent space and attends to the cached latents
themselves, as multi-query attention with one K/V "head" (key [c_kv, k_R], value c_kv). No per-head K or V is
made for the cached tokens; decoding costs H (d_c + d_R) per cached token instead of the d_c H (D + D_v) that
up-projecting them would. Training and a prefill have every key new and run the naive form above.

The latents' RMSNorms have DeepSeek's eps, 1e-6, whatever model.norm_eps (that of the blocks' norms).

RoPE rotates only the d_R dims (model.position=rope; the RoPE scalings of model/rope_scaling.py apply to them).
Without RoPE there is no RoPE part (d_R = 0) and the positions come from the embeddings.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from model.attention import Attention, attention_weights, last_positions_mask, mean_keys_seen
from model.interfaces import Mixer
from model.checks import is_whole, refuse_set
from model.kv_cache import CacheField, FullCache, PerPosition
from model.norms import RMSNorm
from model.positions import Rotary

LATENT_NORM_EPS = 1e-6  # DeepSeek-V2/V3's, fixed in their code and in transformers' DeepseekV3


SETTINGS = ("q_rank", "rope_head_dim", "v_head_dim")  # its settings beside model.kv_rank, which chooses it


class LatentAttention(Mixer):
    # No window and no value embedding (its values come out of the latent): the Mixer's defaults

    def __init__(self, cfg, rotary: Rotary | None):
        super().__init__()
        self.n_heads, self.head_dim, self.value_dim = cfg.n_heads, cfg.head_dim, cfg.value_dim
        self.kv_rank, self.rope_width = cfg.kv_rank, self.rope_dim(cfg)
        H, D, d_c, d_r = self.n_heads, self.head_dim, self.kv_rank, self.rope_width
        # the latent and the RoPE key in one matmul: rows [W_dkv; W_kr] (Muon orthogonalises each on its own)
        self.kv_down = nn.Linear(cfg.d_model, d_c + d_r, bias=cfg.bias)
        self.kv_down.stacked_rows = [d_c, d_r]
        self.kv_norm = RMSNorm(d_c, LATENT_NORM_EPS)
        if cfg.q_rank is None:
            self.q_down = self.q_norm = None
        else:
            self.q_down = nn.Linear(cfg.d_model, cfg.q_rank, bias=cfg.bias)
            self.q_norm = RMSNorm(cfg.q_rank, LATENT_NORM_EPS)
        self.q_up = nn.Linear(cfg.q_rank or cfg.d_model, H * (D + d_r), bias=cfg.bias)
        # No bias on the up-projections, as in DeepSeek's: the absorbed form folds them into the query and output
        self.k_up = nn.Linear(d_c, H * D, bias=False)
        self.v_up = nn.Linear(d_c, H * self.value_dim, bias=False)
        self.out = nn.Linear(H * self.value_dim, cfg.d_model, bias=cfg.bias)
        self.rotary = rotary
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, start: int = 0, cache: FullCache | None = None,
                value_embedding: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q, latent = self.project(x, start)
        if cache is not None:  # the cache's key is the latent; its value is the latent's c_kv part, so 0 dims
            latents, _, _ = cache.update(start, latent, latent[..., :0])
        if cache is not None and start > 0:  # keys the cache holds: the absorbed form
            y = self.absorbed(q, latents, T)
        else:  # every key is new (training, a prefill): the naive form
            k, v = self.expand(latent)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1,
                                               dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))

    def project(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [B, H, T, D + d_R] ([q_C, q_R], q_R rotated) and the cached latent [c_kv, k_R]: [B, 1, T, d_c + d_R]."""
        B, T, _ = x.shape
        c_q = x if self.q_down is None else self.q_norm(self.q_down(x))
        q = self.q_up(c_q).view(B, T, self.n_heads, -1).transpose(1, 2)
        c_kv, k_r = self.kv_down(x).unsqueeze(1).split([self.kv_rank, self.rope_width], dim=-1)
        c_kv = self.kv_norm(c_kv)
        if self.rotary is not None:  # the query heads' RoPE parts and the shared key in one call
            q_c, q_r = q.split([self.head_dim, self.rope_width], dim=-1)
            q_r, k_r = self.rotary(torch.cat([q_r, k_r], dim=1), start).split([self.n_heads, 1], dim=1)
            q = torch.cat([q_c, q_r], dim=-1)
        return q, torch.cat([c_kv, k_r], dim=-1)

    def expand(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The naive form's per-head keys [k_C, k_R]: [B, H, T, D + d_R] and values [B, H, T, D_v] of latents."""
        B, _, T, _ = latent.shape
        c_kv, k_r = latent.squeeze(1).split([self.kv_rank, self.rope_width], dim=-1)
        k_c = self.k_up(c_kv).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_up(c_kv).view(B, T, self.n_heads, self.value_dim).transpose(1, 2)
        return torch.cat([k_c, k_r.unsqueeze(1).expand(B, self.n_heads, T, self.rope_width)], dim=-1), v

    def heads(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The naive form's q, k: [B, H, T, D + d_R] and v: [B, H, T, D_v], as Attention.heads gives them."""
        q, latent = self.project(x, start)
        return q, *self.expand(latent)

    def absorbed(self, q: torch.Tensor, latents: torch.Tensor, n_new: int) -> torch.Tensor:
        """Attention of q: [B, H, T, D + d_R] over the latents [B, 1, S, d_c + d_R] of S positions, the last T
        of them q's, without per-head keys or values: [B, H, T, D_v]. The latents are one K/V "head" for every
        query head, so the H heads go in as H T query rows of that one head: one attention over the cache, where
        sdpa's grouped form would expand the cache to H heads at every step."""
        B, H, T, _ = q.shape
        D, d_c = self.head_dim, self.kv_rank
        q_c, q_r = q.split([D, self.rope_width], dim=-1)
        q_latent = torch.cat([q_c @ self.k_up.weight.view(H, D, d_c), q_r], dim=-1)  # [q_C W_uk,h, q_R]
        S = latents.shape[2]
        # row (h, t) sees the keys up to query t's position S - T + t; one new query sees every key
        visible = None if T == 1 else last_positions_mask(T, S, q.device).repeat(H, 1)
        # the weights applied to the latents themselves, whole (their c_kv part, a strided slice, would be copied
        # at every step), then c_kv's d_c columns kept: [B, 1, H T, d_c + d_R] -> [B, H, T, d_c]
        y_latent = F.scaled_dot_product_attention(q_latent.reshape(B, 1, H * T, -1), latents, latents,
                                                  attn_mask=visible, scale=1 / math.sqrt(D + self.rope_width))
        y_latent = y_latent[..., :d_c].reshape(B, H, T, d_c)
        return y_latent @ self.v_up.weight.view(H, self.value_dim, d_c).transpose(1, 2)  # W_uv,h: [B, H, T, D_v]

    # -------- its answers to the repo (model/interfaces.py's Mixer)
    @classmethod
    def from_config(cls, cfg, layer: int, rotary: Rotary | None) -> "LatentAttention":
        return cls(cfg, rotary)

    @classmethod
    def rope_dim(cls, cfg) -> int:
        """d_R, the dims of each head RoPE rotates: model.rope_head_dim, or half a head (none without RoPE)."""
        if cfg.position != "rope":
            return 0
        return cfg.head_dim // 2 if cfg.rope_head_dim is None else cfg.rope_head_dim

    def residual_weights(self) -> list[nn.Parameter]:
        """The weight this branch writes into the residual stream with: W_o (GPT-2's scaled init)."""
        return [self.out.weight]

    @classmethod
    def flops_per_token(cls, cfg, layer: int, seq_len: int) -> float:
        """Forward FLOPs per token in a causal sequence of seq_len tokens, in the naive form that training and a
        prefill run (2 per multiply-add): W_dkv and W_kr, the query's projections (W_dq and W_uq, or W_q), W_uk, W_uv
        and W_o, then q k^T over D + d_R dims and the weights times v over D_v, for each of mean_keys_seen's keys."""
        H, D, D_v, d, d_c, d_r = cfg.n_heads, cfg.head_dim, cfg.value_dim, cfg.d_model, cfg.kv_rank, cls.rope_dim(cfg)
        query = 2 * d * H * (D + d_r) if cfg.q_rank is None else 2 * d * cfg.q_rank + 2 * cfg.q_rank * H * (D + d_r)
        projections = 2 * d * (d_c + d_r) + query + 2 * d_c * H * (D + D_v) + 2 * H * D_v * d
        return projections + 2 * H * (D + d_r + D_v) * mean_keys_seen(seq_len, None)

    # The cache: one "head" per position, the key [c_kv, k_R], whose c_kv part is also the value (0 value dims)
    PER_POSITION = PerPosition(
        name="latent", label="MLA latent", title="latent cache (MLA)",
        fields=(CacheField("kv_rank", "d_c", "MLA latent d_c", "MLA's latent dims per token and layer (d_c)"),
                CacheField("rope_head_dim", "d_R", "MLA RoPE key d_R", "MLA's shared RoPE key dims (d_R, default 0)",
                           least=0, default=0)),
        terms=((1, ("kv_rank",)), (1, ("rope_head_dim",))), text="({kv_rank} latent + {rope_head_dim} RoPE key)",
        window_refusal="this repo's latent attention has no window", row="MLA ({kv_rank} + {rope_head_dim})")

    @classmethod
    def cache_dims(cls, cfg) -> dict[str, int]:
        """The widths PER_POSITION reads, of a model of these settings."""
        return {"kv_rank": cfg.kv_rank, "rope_head_dim": cls.rope_dim(cfg)}

    @classmethod
    def cache_bytes(cls, cfg, layer: int, positions: int, batch: int, bytes_per_element: int) -> int:
        """What new_cache allocates for `positions`, in any block."""
        return positions * cls.PER_POSITION.elements(cls.cache_dims(cfg)) * batch * bytes_per_element

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device | str,
                  sink_tokens: int | None = None) -> FullCache:
        """This layer's cache of max_len latents (stream_refusal refuses sink tokens)."""
        return FullCache(batch, 1, max_len, self.kv_rank + self.rope_width, 0, dtype=dtype, device=device)

    def rolls(self, max_len: int) -> bool:
        """No window: the cache holds every position (Attention.rolls)."""
        return False

    @staticmethod
    def stream_refusal(cfg) -> str | None:
        """Sink tokens refused (Attention.stream_refusal): the absorbed decode attends to every cached latent."""
        return "with attention=mla: its latent cache has no streaming form here"

    def cached_value_rows(self) -> list[tuple[nn.Linear, slice]]:
        """The one "head" the cache holds, whose c_kv makes every head's keys and values: its rows of [W_dkv; W_kr]."""
        return [(self.kv_down, slice(0, self.kv_rank))]

    @property
    def output_heads(self) -> int:
        """The query heads, each D_v wide."""
        return self.n_heads

    def weights(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Its naive form's softmax over D + d_R dims, as it applies them to v (no window, no sink)."""
        return attention_weights(*self.logits(x, start))

    def logits(self, x: torch.Tensor, start: int = 0, qk_norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The naive form's q and k [B, H, T, D + d_R] (no QK-norm: validate refuses one; no bound either)."""
        return self.heads(x, start)[:2]

    # -------- its settings
    @classmethod
    def validate(cls, cfg) -> None:
        """The rules of the latent's settings (model.kv_rank and SETTINGS), and the settings it cannot take: a
        ConfigError naming the first one broken."""
        for key in ("kv_rank", *SETTINGS):
            value, least = getattr(cfg, key), 0 if key == "rope_head_dim" else 1
            if value is not None and not is_whole(value, least):
                raise ConfigError(f"model.{key}={value!r} must be a {'non-negative' if least == 0 else 'positive'} "
                                  f"integer")
        compressed = cfg.n_heads * (cfg.head_dim + cfg.value_dim)
        if cfg.kv_rank > compressed:
            raise ConfigError(f"model.kv_rank={cfg.kv_rank} must be at most the keys and values it compresses, "
                              f"model.n_heads x (head_dim + v_head_dim) = {compressed}")
        if cfg.n_kv_heads != cfg.n_heads:
            raise ConfigError(f"model.attention=mla up-projects a key and a value for every query head: "
                              f"model.n_kv_heads={cfg.n_kv_heads} must be model.n_heads={cfg.n_heads}")
        if cfg.qk_norm != "none":  # the absorbed decode folds W_uk into the query, which a norm of k would block
            raise ConfigError(f"model.qk_norm={cfg.qk_norm} with attention=mla: MLA's keys are up-projected from "
                              f"an RMS-normed latent, and a norm of each key would not let decoding fold W_uk into "
                              f"the query; use qk_norm=none")
        if cfg.rotary_fraction != 1:
            raise ConfigError(f"model.rotary_fraction={cfg.rotary_fraction} with attention=mla: MLA's RoPE part is "
                              f"its own, model.rope_head_dim")
        rope, d_r = cfg.position == "rope", cfg.rope_head_dim
        if d_r is not None and (d_r % 2 or d_r > cfg.head_dim):
            raise ConfigError(f"model.rope_head_dim={d_r} must be even and at most the head dim, model.d_model / "
                              f"model.n_heads = {cfg.head_dim}")
        if d_r is not None and rope != (d_r > 0):  # without RoPE the decoupled part would be plain key dims
            raise ConfigError(f"model.rope_head_dim={d_r} with model.position={cfg.position}: MLA's RoPE part "
                              + ("carries RoPE's positions; it needs at least 2 dims" if rope else
                                 "is rotated by RoPE; without it use model.rope_head_dim=0 (or null)"))
        Attention.validate(cfg)  # the window's settings well-formed, then refused: none of them here
        if cfg.window is not None or cfg.sinks or cfg.attention_gate:
            setting = f"model.window={cfg.window}" if cfg.window is not None else \
                "model.sinks=true" if cfg.sinks else "model.attention_gate=true"
            raise ConfigError(f"{setting} with attention=mla: the latent attention here has no band mask, sink "
                              f"logit or output gate (its absorbed decode attends to every cached latent); use attention=gqa, mha "
                              f"or mqa")

    @classmethod
    def refuse_settings(cls, cfg) -> None:
        """Another attention is chosen: each of SETTINGS is left unset."""
        refuse_set(cfg, SETTINGS, "attention=mla", "no latent (model.kv_rank=null)")
