"""A mixture of experts inside a checkpoint (model/moe.py): how evenly each block's router spreads the tokens, and
which tokens each expert takes.

    load[b][e]       = the fraction of block b's N·k choices that went to expert e (1/E each when balanced)
    max_vio[b]       = max_e load[b][e] / mean_e load[b][e] - 1         (Wang et al. 2024's MaxVio; 0: balanced)
    top_tokens[b][e] = the TOP_TOKENS tokens expert e is chosen for most often in block b, each with its count and
                       the share of that token's occurrences that chose e (1: every time; k/E by chance)

The choices are each MoE block's own, as its forward keeps them (model/moe.py's MoE.last_routing).
"""
import torch

from model.moe import max_violation
from model.transformer import Transformer

TOP_TOKENS = 5


def routing(model: Transformer, tokens: torch.Tensor, pieces: list[str]) -> dict | None:
    """tokens [B, T] -> each MoE block's loads, MaxVio and its experts' most frequent tokens (as pieces); None for a
    model without experts."""
    layers = model.moe_layers()
    if not layers:
        return None
    with torch.no_grad():
        model(tokens)
    ids, vocab = tokens.flatten(), model.cfg.vocab_size
    occurrences = ids.bincount(minlength=vocab)
    blocks = []
    for block, moe in layers.items():
        last = moe.last_routing()  # each block's own router's, from that forward
        picks, load = last["chosen"], last["load"]
        experts = []
        for e in range(len(load)):
            counts = ids[(picks == e).any(dim=-1)].bincount(minlength=vocab)  # each token picks an expert once
            top = counts.topk(min(TOP_TOKENS, int((counts > 0).sum()))).indices.tolist()
            experts.append([{"token": pieces[t], "count": int(counts[t]), "share": counts[t].item() / occurrences[t].item()}
                            for t in top])
        blocks.append({"block": block, "load": load.tolist(), "max_vio": max_violation(load),
                       "top_tokens": experts})
    return {"n_experts": model.cfg.n_experts, "k": model.cfg.experts_per_token, "router": model.cfg.router,
            "tokens": ids.numel(), "blocks": blocks}
