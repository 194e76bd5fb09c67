"""Attention inside a checkpoint: which K/V head each query head reads, what the cache would weigh with more
or fewer K/V heads, and the weights of every layer and head on the prompt.

    weights[l][h][t][s] = softmax_s(q_t . k_s / sqrt(D)) for s <= t       (model.attention.attention_weights)
    entropy[l][h]       = mean over t >= 1 of H(weights[l][h][t]) / ln(t + 1): 1 is uniform over the t + 1
                          visible keys, 0 all weight on one key     (training.diagnostics.normalised_entropy)

q and k come from each block's own Attention.heads, called by a forward hook on the input the block gave it.
"""
import copy

import torch

from model.attention import attention_weights
from model.config import ModelConfig, attention_kind
from model.kv_cache import kv_cache_bytes
from model.transformer import Transformer
from training.diagnostics import normalised_entropy


def attention_inputs(model: Transformer, tokens: torch.Tensor, start: int = 0) -> list[tuple[torch.Tensor, int]]:
    """(x, start) that each block's attention is called with when the model reads tokens [B, T] at positions
    start .. start + T - 1."""
    found = []
    hooks = [block.attn.register_forward_hook(lambda _attn, inputs, _out: found.append(inputs[:2]))
             for block in model.blocks]
    try:
        with torch.no_grad():
            model(tokens, start)
    finally:
        for hook in hooks:
            hook.remove()
    return found


def layer_qk(model: Transformer, tokens: torch.Tensor, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's q [B, H, T, D] and k [B, H_kv, T, D], rotated when the model uses RoPE."""
    with torch.no_grad():
        return [block.attn.heads(x, at)[:2] for block, (x, at) in zip(model.blocks, attention_inputs(model, tokens, start))]


def attention_maps(model: Transformer, tokens: torch.Tensor) -> dict:
    """tokens [1, T] -> weights [layer][head][T][T] and entropy [layer][head]."""
    weights = [attention_weights(q, k)[0] for q, k in layer_qk(model, tokens)]
    return {"weights": [w.tolist() for w in weights],
            "entropy": [normalised_entropy(w).mean(dim=-1).tolist() for w in weights]}


def kv_wiring(model: Transformer, tokens: torch.Tensor) -> list[list[int]]:
    """For each query head, the K/V heads it reads, measured on block 0: each K/V head's value projection is
    zeroed in turn (on a copy) and the query heads whose outputs change, at the output projection's input, read it."""
    cfg = model.cfg
    H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x, start = attention_inputs(model, tokens)[0]
    probe = copy.deepcopy(model.blocks[0].attn)
    outputs = []
    probe.out.register_forward_pre_hook(lambda _out, inputs: outputs.append(inputs[0].unflatten(-1, (H, D))))
    reads = [[] for _ in range(H)]
    with torch.no_grad():
        probe(x, start)
        for j in range(H_kv):
            rows = slice((H + H_kv + j) * D, (H + H_kv + j + 1) * D)  # V head j among the stacked [Wq; Wk; Wv] rows
            params = [p for p in (probe.qkv.weight, probe.qkv.bias) if p is not None]
            saved = [p[rows].clone() for p in params]
            for p in params:
                p[rows] = 0
            probe(x, start)
            changed = (outputs[-1] - outputs[0]).abs().amax(dim=(0, 1, 3)) > 0
            for p, kept in zip(params, saved):
                p[rows] = kept
            for h in changed.nonzero().flatten().tolist():
                reads[h].append(j)
    return reads


def cache_by_kv_heads(cfg: ModelConfig, bytes_per_element: int = 4) -> list[dict]:
    """One sequence's cache at the full context for every K/V head count the model's width allows (the divisors
    of n_heads): MHA at n_heads, MQA at 1, GQA between."""
    counts = [n for n in range(cfg.n_heads, 0, -1) if cfg.n_heads % n == 0]
    return [{"attention": attention_kind(cfg.n_heads, n).upper(), "kv_heads": n,
             "bytes": kv_cache_bytes(cfg.n_layers, n, cfg.head_dim, cfg.context_length, 1, bytes_per_element),
             "this_model": n == cfg.n_kv_heads}
            for n in counts]
