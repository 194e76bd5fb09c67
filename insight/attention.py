"""Attention inside a checkpoint: which K/V head each query head reads, what the cache would weigh with more
or fewer K/V heads, and the weights of every layer and head on the prompt.

    weights[l][h][t][s] = softmax_s(q_t . k_s / sqrt(D)) for s <= t       (model.attention.attention_weights)
    entropy[l][h]       = mean over t >= 1 of H(weights[l][h][t]) / ln(t + 1): 1 is uniform over the t + 1
                          visible keys, 0 all weight on one key     (training.diagnostics.normalised_entropy)

Each block's mixer answers for itself (model/interfaces.py's Mixer), called on the input the block gave it: weights
(a linear layer's map is its gate-faded q . k, the reading of each earlier position the delta rule would correct;
its rows need not sum to 1, so its entropy is None), logits (q and k, None where no softmax reads them).

The logits' scale, what QK-norm (model/qk_norm.py) does to it, on windows of tokens:
    as_trained[l] = max over windows, heads and causal pairs s <= t of |q_t . k_s| / sqrt(D), the logits softmax reads
    bypassed[l]   = the same with each head's q and k taken before the norm (the raw projections, then RoPE): the
                    scale the projections alone would give, from the same block inputs
    bound[l]      = sqrt(D) max|g_q| max|g_k|: a normalised head has |q| <= sqrt(D) max|g_q| (and k alike), so by
                    Cauchy-Schwarz no logit of the normalised q and k can exceed it; RoPE turns q and k without
                    changing their norms
"""
import copy

import torch

from model.attention import Attention, attention_scores
from model.block import attention_class
from model.config import ModelConfig, attention_kind
from model.kv_cache import positions_held
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


def layer_qk(model: Transformer, tokens: torch.Tensor, start: int = 0
             ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Each layer's q [B, H, T, D] and k [B, H_kv, T, D], rotated when the model uses RoPE; None for a layer with no
    softmax logits."""
    with torch.no_grad():
        return [block.attn.logits(x, at)
                for block, (x, at) in zip(model.blocks, attention_inputs(model, tokens, start))]


def attention_maps(model: Transformer, tokens: torch.Tensor) -> dict:
    """tokens [1, T] -> weights [layer][head][T][T], entropy [layer][head] (None in a layer without softmax) and
    softmax [layer]: whether the layer's rows are a softmax's."""
    maps = {"weights": [], "entropy": [], "softmax": []}
    with torch.no_grad():
        for block, (x, start) in zip(model.blocks, attention_inputs(model, tokens)):
            weights, softmax = block.attn.weights(x, start)[0], block.attn.logits(x, start) is not None
            maps["weights"].append(weights.tolist())
            maps["softmax"].append(softmax)
            maps["entropy"].append(normalised_entropy(weights, block.attn.window).mean(dim=-1).tolist() if softmax
                                   else [None] * len(weights))
    return maps


def kv_wiring(model: Transformer, tokens: torch.Tensor) -> list[list[int]]:
    """For each query head, the cached heads it reads, measured on block 0: the rows that make each cached head's
    values (the attention's cached_value_rows: a V head's among the stacked [Wq; Wk; Wv], MLA's latent among
    [W_dkv; W_kr]) are zeroed in turn (on a copy), and the query heads whose outputs change, at the output
    projection's input, read it."""
    x, start = attention_inputs(model, tokens)[0]
    probe = copy.deepcopy(model.blocks[0].attn)
    H = probe.output_heads
    outputs = []
    probe.out.register_forward_pre_hook(lambda _out, inputs: outputs.append(inputs[0].unflatten(-1, (H, -1))))
    reads = [[] for _ in range(H)]
    with torch.no_grad():
        probe(x, start)
        for j, (source, rows) in enumerate(probe.cached_value_rows()):
            params = [p for p in (source.weight, source.bias) if p is not None]
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
    of n_heads): MHA at n_heads, MQA at 1, GQA between, each with the model's local layers holding their window;
    and beside them the model's own cache where its attention kind is another (MLA's latent: d_c + d_R)."""
    kind = attention_class(cfg)
    held = positions_held(cfg.n_layers, cfg.context_length, cfg.window, cfg.n_local_layers)
    counts = [n for n in range(cfg.n_heads, 0, -1) if cfg.n_heads % n == 0]
    rows = [{"attention": attention_kind(cfg.n_heads, n).upper(), "kv_heads": n,
             "bytes": Attention.PER_POSITION.elements({"kv_heads": n, "head_dim": cfg.head_dim}) * held
             * bytes_per_element,
             "this_model": kind is Attention and n == cfg.n_kv_heads}
            for n in counts]
    if kind is not Attention:  # each block's cache as its own kind holds it (a hybrid's attention layers: K/V heads)
        rows.append({"attention": kind.PER_POSITION.row.format(**kind.cache_dims(cfg)), "kv_heads": 1,
                     "this_model": True, "bytes": sum(attention_class(cfg, layer).cache_bytes(
                         cfg, layer, cfg.context_length, 1, bytes_per_element) for layer in range(cfg.n_layers))})
    return rows


def max_causal_logit(q: torch.Tensor, k: torch.Tensor) -> float:
    """q [B, H, T, D], k [B, H_kv, T, D] -> max |q_t . k_s| / sqrt(D) over the batch, heads and s <= t: the logits
    the causal mask lets through, the only ones softmax reads."""
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return attention_scores(q, k).abs().masked_fill(future, 0).amax().item()


def logit_bound(model: Transformer) -> list[float | None] | None:
    """Per layer sqrt(D) max|g_q| max|g_k|, the largest |q . k| / sqrt(D) QK-norm allows (None in a layer without
    it); None where no layer has one."""
    bounds = [block.attn.logit_bound() for block in model.blocks]
    return None if all(bound is None for bound in bounds) else bounds


def logit_scale(model: Transformer, windows: torch.Tensor, batch_size: int = 8) -> dict:
    """windows [N, T] of tokens, each read from position 0 -> per layer the max |q . k| / sqrt(D) as trained and,
    with QK-norm, with the norm bypassed, and the bound; without QK-norm there is no norm to bypass (None), and a
    layer without softmax logits (a linear layer) has None in every list."""
    bounds = logit_bound(model)
    as_trained, bypassed = [None] * len(model.blocks), [None] * len(model.blocks)
    for batch in windows.split(batch_size):
        # the block inputs of the model as trained: bypassing a norm must not change what the later layers read
        inputs = attention_inputs(model, batch.to(model.tok_emb.weight.device))
        with torch.no_grad():
            for layer, (block, (x, start)) in enumerate(zip(model.blocks, inputs)):
                qk = block.attn.logits(x, start)
                if qk is None:
                    continue
                as_trained[layer] = max(as_trained[layer] or 0.0, max_causal_logit(*qk))
                if bounds is not None and bounds[layer] is not None:
                    raw = max_causal_logit(*block.attn.logits(x, start, qk_norm=False))
                    bypassed[layer] = max(bypassed[layer] or 0.0, raw)
    return {"qk_norm": model.cfg.qk_norm, "head_dim": model.cfg.head_dim, "as_trained": as_trained,
            "bypassed": bypassed if bounds is not None else None, "bound": bounds}
