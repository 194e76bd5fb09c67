"""The tensor bookkeeping every family shares: which transformers tensors one of this repo's stacked matrices holds,
and the reshuffles between the two sides' layouts. Nothing here knows a family; the families (families/) say which
of these their tensors need.

A name map is {our parameter: [(transformers tensor, its rows), ...]}: our stacked matrix is those tensors' rows
one after the other (the stacked_rows of model/attention.py, model/ffn.py, model/moe.py), so export splits it at
those row counts and import concatenates them back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from model.ffn import FeedForward
from model.moe import MoE
from model.transformer import Transformer

Names = dict[str, list[tuple[str, int]]]


@dataclass(frozen=True)
class Experts:
    """Where a transformers MoE family keeps a sparse block's weights, under model.layers.i.: <block>.gate.weight is
    the router, <block>.experts.e.<gate|up|down>.weight expert e's W1, W3, W2."""
    block: str
    gate: str
    up: str
    down: str


GATED_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def dense_ffn_names(ffn: FeedForward, ours: str, theirs: str, d_model: int) -> Names:
    """A SwiGLU's names: the rows [W1; W3] of w_in (its stacked_rows) are gate_proj and up_proj, w_out down_proj."""
    return {ours + "w_in.weight": list(zip([theirs + "gate_proj.weight", theirs + "up_proj.weight"],
                                           ffn.w_in.stacked_rows, strict=True)),
            ours + "w_out.weight": [(theirs + "down_proj.weight", d_model)]}


def expert_names(moe: MoE, experts: Experts, ours: str, theirs: str, d_model: int) -> Names:
    """An MoE block's router and experts, in moe_layout's terms (its experts_out rows are each expert's W2, [d, d_e]):
    the rows [W1_e; W3_e] of experts_in (its stacked_rows) are each expert's gate and up projections."""
    E, block = moe.n_experts, theirs + experts.block + "."
    projections = [f"{block}experts.{e}.{part}.weight" for e in range(E) for part in (experts.gate, experts.up)]
    return {ours + "router.weight": [(block + "gate.weight", E)],
            ours + "experts_in.weight": list(zip(projections, moe.experts_in.stacked_rows, strict=True)),
            ours + "experts_out.weight": [(f"{block}experts.{e}.{experts.down}.weight", d_model) for e in range(E)]}


def moe_layout(state: dict[str, torch.Tensor], model: Transformer, to_hf: bool = True) -> dict:
    """An MoE model's weights with each block's experts_out as transformers holds W2: this repo stores expert e's
    rows as W2_e^T [d_e, d] (so that Muon's stacked_rows split it), transformers W2_e [d, d_e]. to_hf=False
    is the inverse. A dense model's weights as they are."""
    out, d = dict(state), model.cfg.d_model
    for i, moe in model.moe_layers().items():
        name = f"blocks.{i}.ffn.experts_out.weight"
        shape = (moe.n_experts, moe.expert_d_ff, d) if to_hf else (moe.n_experts, d, moe.expert_d_ff)
        out[name] = state[name].view(shape).transpose(1, 2).flatten(0, 1)
    return out


def merged_experts(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each MoE block's per-expert projections (<block>.experts.<e>.<proj>.weight, [out, in]) as llama.cpp reads
    them, one [E, out, in] tensor per projection (<block>.experts.<proj>.weight); other weights as they are."""
    out, experts = {}, {}
    for name, w in hf_state.items():
        head, sep, tail = name.partition(".experts.")
        if not sep:
            out[name] = w
            continue
        e, projection = tail.split(".", 1)
        experts.setdefault(f"{head}.experts.{projection}", {})[int(e)] = w
    return out | {name: torch.stack([by_expert[e] for e in range(len(by_expert))])
                  for name, by_expert in experts.items()}


def interleaved_pairs(rows: int) -> torch.Tensor:
    """The row order that takes a RoPE part's half-split pairs (i, i + rows/2), this repo's, to interleaved pairs
    (2i, 2i + 1), DeepSeek's and llama.cpp's llama graph's: row 2i is row i, row 2i + 1 is row i + rows/2."""
    return torch.arange(rows).view(2, rows // 2).t().flatten()
