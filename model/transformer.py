"""The decoder-only language model: tokens in, next-token logits out.

    tokens: [B, T] -> embed: [B, T, d] (+ absolute positions) -> n_layers x Block
            -> final Norm (Pre-Norm only) -> LM head -> logits: [B, T, vocab]

Two of the speedrun's switches reach into that loop: value embeddings add a table of the tokens to chosen layers'
attention values (model/value_embeddings.py), residual scalars mix the embedding stream back in before each block
(model/residual_scalars.py).

The LM head shares the embedding matrix by default (tie_embeddings), as in the 2017
Transformer and GPT-2: at this size the vocab x d matrix is a fifth of the parameters.

The token signal entering block 0 is m * E[token], model.embedding_scale choosing E's init and m:
    gpt2              E ~ N(0, 0.02^2), m = 1: rms 0.02; beside the sinusoidal table m = sqrt(d), the
                      paper's multiplier, which leaves rms 0.02 sqrt(d) (0.23 at d = 128) against PE's 0.71
    transformer2017   E ~ N(0, 1/d), m = sqrt(d): rms 1, whatever the position kind. The paper gives the
                      multiplier, its TensorFlow implementations the init; the tokens outweigh PE 1.4 to 1
                      and the tied LM head starts with logits of rms ~1.
model.logit_softcap c bounds the logits smoothly, z -> c tanh(z / c): near z for |z| << c, never past +-c (Gemma 2;
modded-nanogpt's records cap at 15 to 30): a head that grows its logits without bound gains nothing from it.

forward(tokens, start, cache): `start` is the absolute position of tokens[:, 0]; with a
KVCache the model reads and extends it in place, so generation reuses the same math. Positions may run
past model.context_length (model/positions.py), except with a learned table.
"""
import math
from dataclasses import replace

import torch
from torch import nn

from model.block import Block, final_norm, rope_dim, validate_kinds
from model.config import ModelConfig
from model.kv_cache import KVCache
from model.moe import MoE
from model.positions import make_positions
from model.residual_scalars import ResidualScalars
from model.value_embeddings import ValueEmbeddings, validate_layers

INIT_STD = 0.02  # GPT-2's, for every weight matrix and (with embedding_scale=gpt2) the embeddings


def validate(cfg: ModelConfig) -> None:
    """The checks that ask the kinds, after ModelConfig's own: each kind's rules for its settings, then the layers
    the value embeddings choose. The model runs them, and so does a config composed for training (before its data)."""
    validate_kinds(cfg)
    validate_layers(cfg)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        validate(cfg)
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        embed_std = cfg.d_model ** -0.5 if cfg.embedding_scale == "transformer2017" else INIT_STD
        sqrt_d = cfg.embedding_scale == "transformer2017" or cfg.position == "sinusoidal"
        self.embed_multiplier = math.sqrt(cfg.d_model) if sqrt_d else 1.0
        rotary, self.abs_pos = make_positions(cfg, rope_dim(cfg), token_rms=embed_std * self.embed_multiplier)
        self.rotary = rotary  # one table, shared by every layer's attention
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg, i, rotary) for i in range(cfg.n_layers))
        self.value_embeddings = ValueEmbeddings(cfg) if cfg.value_embeddings is not None else None
        self.residual_scalars = ResidualScalars(cfg.n_layers) if cfg.residual_scalars else None
        self.final_norm = final_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        if cfg.embedding_scale == "transformer2017":
            nn.init.normal_(self.tok_emb.weight, std=embed_std)
        # GPT-2's scaled init: the weights each residual branch writes into the stream with (each block's own
        # declaration, block by block) by 1/sqrt(2 * n_layers), so the stream's variance does not grow with depth.
        for block in self.blocks:
            for weight in block.residual_weights():
                nn.init.normal_(weight, std=INIT_STD / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=INIT_STD)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # a tied matrix is counted once

    def active_params(self) -> int:
        """The parameters a token uses: each MoE block's k of E experts counted, the rest whole (model/moe.py)."""
        idle = sum((m.n_experts - m.k) * 3 * m.expert_d_ff * self.cfg.d_model for m in self.moe_layers().values())
        return self.num_params() - idle

    def flops_per_token(self, seq_len: int, training: bool = True) -> float:
        """FLOPs per token of a causal sequence of seq_len tokens, each position a query as in training (2 per
        multiply-add; element-wise ops, norms and softmax not counted): every block's attention and FFN as its kind
        counts what runs (a MoE's k routed and shared experts and its router, MLA's projections, a local layer's
        window, the keys each query sees on average: model/attention.py's mean_keys_seen), and the LM head, 2 d V.
        training: the forward and the backward, which costs twice the forward's (the gradients of the inputs and of
        the weights): 3x."""
        cfg = self.cfg
        forward = sum(block.attn.flops_per_token(cfg, layer, seq_len) + block.ffn.flops_per_token(cfg, layer, seq_len)
                      for layer, block in enumerate(self.blocks)) + 2 * cfg.d_model * cfg.vocab_size
        return 3 * forward if training else forward

    def moe_layers(self) -> dict[int, MoE]:
        """The blocks whose FFN is a mixture of experts, by index (model.dense_layers keeps the first ones dense)."""
        return {i: block.ffn for i, block in enumerate(self.blocks) if isinstance(block.ffn, MoE)}

    def aux_losses(self) -> dict[str, torch.Tensor]:
        """The auxiliary losses of the last forward with gradients, by the name each is logged under, taken once from
        the components that have them (take_aux_losses: an MoE's router_aux and router_z, model/moe.py), each the
        mean over the blocks that give it, so that its weight means the same at any depth; {} where none has any."""
        by_name = {}
        for block in self.blocks:
            for name, value in block.ffn.take_aux_losses().items():
                by_name.setdefault(name, []).append(value)
        return {name: sum(values) / len(values) for name, values in by_name.items()}

    def aux_loss(self, losses: dict[str, torch.Tensor]) -> torch.Tensor | float:
        """What aux_losses add to the language-model loss: each by the weight its component gives it (aux_weights:
        an MoE's model.router_aux_coef and model.router_z_coef), 0 where there are none."""
        weights = {name: weight for block in self.blocks for name, weight in block.ffn.aux_weights.items()}
        return sum((weights[name] * value for name, value in losses.items()), 0.0)

    @torch.no_grad()
    def after_optimizer_step(self, reduce) -> None:
        """What the components update after each optimizer step, outside the gradient, in block order (an MoE's
        loss-free bias from that step's expert choices, model/moe.py); reduce(tensor) gives a tensor's sum over the
        processes (identity in one process)."""
        for block in self.blocks:
            block.ffn.after_optimizer_step(reduce)

    def kv_cache_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        """What one more position costs the cache, over every layer: a second position's bytes less the first's, so
        that a linear layer's fixed state (model/gated_deltanet.py) counts nothing here (a local layer of a window of
        one position would not either; its one slot is then as fixed)."""
        return self.kv_cache_bytes(2, dtype=dtype) - self.kv_cache_bytes(1, dtype=dtype)

    def kv_cache_bytes(self, positions: int, batch: int = 1, dtype: torch.dtype = torch.float32) -> int:
        """The bytes new_kv_cache(batch, positions) allocates: each layer's, as its attention counts them."""
        size = torch.tensor([], dtype=dtype).element_size()
        return sum(block.attn.cache_bytes(self.cfg, layer, positions, batch, size)
                   for layer, block in enumerate(self.blocks))

    def new_kv_cache(self, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                     sink_tokens: int | None = None) -> KVCache:
        """A cache of max_len positions (default: the context), each layer's built by its attention: local layers
        roll through their window; with sink_tokens S the full layers stream past max_len (StreamingLLM), keeping
        their first S positions (S = 0: the window alone)."""
        param = self.tok_emb.weight
        return KVCache([block.attn.new_cache(batch, max_len or self.cfg.context_length, dtype or param.dtype,
                                             param.device, sink_tokens) for block in self.blocks])

    def rolls(self, context: int) -> bool:
        """Whether a cached generation goes on past `context` positions in its layers' own caches, with no sink
        tokens, each position written once: every layer's cache rolls at that length, and the positions run on at
        any length (not a learned table, which ends, nor dynamic NTK's, which change with it)."""
        return (all(block.attn.rolls(context) for block in self.blocks) and self.stream_refusal(None) is None
                and not (self.abs_pos is not None and self.abs_pos.learned))

    def stream_refusal(self, sink_tokens: int | None) -> str | None:
        """Why this model's cache cannot stream past its length with StreamingLLM's sink_tokens S, keeping the first
        S positions and giving the cached tokens positions within the cache (None: it can). None for sink_tokens
        asks of the rolling caches alone, whose positions run on: only what the positions refuse then."""
        position_tables = [table for table in (self.rotary, self.abs_pos) if table is not None]
        refusals = [table.stream_refusal(sink_tokens) for table in position_tables]
        if sink_tokens is not None:
            refusals += [block.attn.stream_refusal(self.cfg) for block in self.blocks]
            if all(block.attn.window is not None for block in self.blocks):
                refusals.append(f"with every layer local (model.window={self.cfg.window}): their rolling caches "
                                f"stream already, and no full layer would keep sink tokens")
        return next((reason for reason in refusals if reason is not None), None)

    def with_rope_scaling(self, scaling: str, factor: float) -> "Transformer":
        """These weights read under another RoPE scaling (model/rope_scaling.py), the original context kept: a new
        model in this one's mode, dtype and device. ConfigError for a scaling the model cannot take."""
        cfg = replace(self.cfg, rope_scaling=scaling, rope_factor=factor)
        param = self.tok_emb.weight
        model = Transformer(cfg).to(device=param.device, dtype=param.dtype)
        model.load_state_dict(self.state_dict())
        return model.train(self.training)

    def fit_positions(self, length: int) -> None:
        """Position tables for a sequence of `length` positions, past model.context_length too: RoPE's and the
        sinusoidal table grow, a learned table raises PositionsError. With a KV cache, `length` is the cache's, so
        that dynamic NTK scales every key and query of a generation alike (model/rope_scaling.py)."""
        for table in (self.rotary, self.abs_pos):
            if table is not None:
                table.fit(length)

    def token_signal(self, tokens: torch.Tensor) -> torch.Tensor:
        """m * E[token]: the embedding stream's token part, [B, T, d] (without positions)."""
        x = self.tok_emb(tokens)
        return x * self.embed_multiplier if self.embed_multiplier != 1.0 else x

    def forward(self, tokens: torch.Tensor, start: int = 0, cache: KVCache | None = None,
                last_only: bool = False) -> torch.Tensor:
        """last_only: logits of the last position only, [B, 1, V]: all that generation needs, and the
        LM head over every position is a fifth of a short prompt's FLOPs."""
        self.fit_positions(max(start + tokens.shape[1], cache.max_len if cache is not None else 0))
        layer_caches = cache.layers if cache is not None else [None] * len(self.blocks)
        x = self.token_signal(tokens)
        if self.abs_pos is not None:
            x = self.abs_pos(x, start)
        x0 = x = self.dropout(x)
        values = self.value_embeddings(tokens) if self.value_embeddings is not None else [None] * len(self.blocks)
        for layer, (block, layer_cache, value_embedding) in enumerate(zip(self.blocks, layer_caches, values)):
            if self.residual_scalars is not None:
                x = self.residual_scalars(x, x0, layer)
            x = block(x, start, layer_cache, value_embedding)
        if last_only:
            x = x[:, -1:]
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.lm_head(x)
        cap = self.cfg.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)
