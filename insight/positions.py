"""What the model knows of positions, on the prompt.

The shift check: the same tokens read at positions s .. s + n - 1 instead of 0 .. n - 1 (Transformer.forward's
`start`), and every layer's scores q_m . k_n / sqrt(D) compared, for query m >= key n. With RoPE
    (R_{m+s} q)^T (R_{n+s} k) = q^T R_{n-m} k = (R_m q)^T (R_n k),
and each layer's input is itself free of absolute positions, so the scores differ by rounding alone; it is
measured in float64, on a copy, so that the rounding left is the fp32 rotation tables' (model/positions.py).
Absolute positions add PE[m + s] instead of PE[m] to the embeddings: their scores move. Without positions
nothing in the model depends on s.

The score against distance: the mean of q_m . k_n / sqrt(D) over heads and over the pairs with m - n = distance.
The table's similarity: cos(PE[i], PE[j]) of an absolute position table, sinusoidal or learned.
"""
import copy

import torch
import torch.nn.functional as F

from insight.attention import layer_qk
from model.attention import attention_scores
from model.transformer import Transformer


def shift_check(model: Transformer, tokens: torch.Tensor, n_shifts: int = 4) -> dict:
    """tokens [1, T]: their first n = min(T, context // 2) read at shift 0 and at n_shifts shifts up to
    context - n. Per shift, the largest |score difference| of each layer; per layer, the largest |score|; and
    layer 0's scores at shift 0 and at the largest shift, pair by pair, every head."""
    context = model.cfg.context_length
    tokens = tokens[:, :min(tokens.shape[1], context // 2)]
    n = tokens.shape[1]
    largest = context - n
    shifts = sorted({max(1, round(largest * (i + 1) / n_shifts)) for i in range(n_shifts)})
    model64 = copy.deepcopy(model).double()
    causal = torch.ones(n, n, dtype=torch.bool).tril()

    def scores(start):  # [H, pairs] per layer; None for a layer without softmax logits
        return [None if qk is None else attention_scores(*qk)[0][:, causal] for qk in layer_qk(model64, tokens, start)]

    base = scores(0)
    rows = []
    for shift in shifts:
        moved = scores(shift)
        rows.append({"shift": shift, "max_abs_diff": [None if b is None else (m - b).abs().max().item()
                                                      for m, b in zip(moved, base)]})
    first = next((layer for layer, b in enumerate(base) if b is not None), None)  # the first layer with scores
    layer0 = None if first is None else {"layer": first, "shift": shifts[-1], "at_0": base[first].flatten().tolist(),
                                         "shifted": moved[first].flatten().tolist()}
    return {"tokens": n, "max_abs_score": [None if b is None else b.abs().max().item() for b in base], "shifts": rows,
            "layer0": layer0}


def score_by_distance(model: Transformer, tokens: torch.Tensor) -> list[list[float]]:
    """tokens [1, T] -> [layer][distance 0 .. T - 1]: the mean score of the pairs at that distance (None for a layer
    without softmax logits)."""
    curves = []
    for qk in layer_qk(model, tokens):
        s = None if qk is None else attention_scores(*qk)[0]  # [H, T, T]
        curves.append(None if s is None else [s.diagonal(offset=-d, dim1=-2, dim2=-1).mean().item()
                                              for d in range(s.shape[-1])])
    return curves


def table_similarity(model: Transformer) -> list[list[float]] | None:
    """cos(PE[i], PE[j]) for every pair of positions of the absolute table, or None without one."""
    if model.abs_pos is None:
        return None
    unit = F.normalize(model.abs_pos.table.detach().float(), dim=-1)
    return (unit @ unit.T).tolist()
