"""The one mapping between this repo's LLaMA and transformers' LlamaForCausalLM (Qwen3ForCausalLM with QK-norm,
DeepseekV3ForCausalLM with multi-head latent attention, MixtralForCausalLM and Qwen3MoeForCausalLM with a mixture of
experts, Mistral and Ministral with sliding windows, GptOssForCausalLM with sink logits): config, weights, tokenizer.

model.qk_norm picks the architecture: none is LLaMA; rmsnorm is Qwen3, which is LLaMA plus an RMSNorm over each q and
k head after the projections and before RoPE, with one gain of D dims per layer shared by the heads and eps
rms_norm_eps, as model/qk_norm.py's. Every other switch must be LLaMA's in both (LLAMA_SWITCHES).

Weights (i = layer, d = d_model, H / H_kv = query / K/V heads of D dims, F = d_ff, V = vocab):

    this repo                                  transformers (LlamaForCausalLM, Qwen3ForCausalLM)
    tok_emb.weight            [V, d]           model.embed_tokens.weight
    blocks.i.attn_norm.weight [d]              model.layers.i.input_layernorm.weight
    blocks.i.attn.qkv.weight  [(H+2H_kv)D, d]  rows [Wq; Wk; Wv] = self_attn.{q,k,v}_proj.weight
    blocks.i.attn.qk_norm.q_norm.weight [D]    model.layers.i.self_attn.q_norm.weight (Qwen3 only)
    blocks.i.attn.qk_norm.k_norm.weight [D]    model.layers.i.self_attn.k_norm.weight (Qwen3 only)
    blocks.i.attn.out.weight  [d, H D]         model.layers.i.self_attn.o_proj.weight
    blocks.i.ffn_norm.weight  [d]              model.layers.i.post_attention_layernorm.weight
    blocks.i.ffn.w_in.weight  [2F, d]          rows [W1; W3] = mlp.gate_proj.weight, mlp.up_proj.weight
    blocks.i.ffn.w_out.weight [d, F]           model.layers.i.mlp.down_proj.weight
    final_norm.weight         [d]              model.norm.weight
    lm_head.weight            [V, d]           lm_head.weight (absent when tie_word_embeddings)

Both rotate q and k in the half-split layout (rotate_half), so no row permutation is needed.

model.attention=mla is DeepseekV3 with a dense FFN at every layer (first_k_dense_replace = n_layers); its blocks
are LLaMA's but for the attention (model/mla.py; q_rank r, latent d_c, RoPE part d_R, values D_v):

    blocks.i.attn.q_up.weight   [H(D+d_R), d]   self_attn.q_proj.weight (q_rank null), else
    blocks.i.attn.q_down.weight [r, d]          self_attn.q_a_proj.weight, with q_a_layernorm.weight = q_norm's and
    blocks.i.attn.q_up.weight   [H(D+d_R), r]   self_attn.q_b_proj.weight
    blocks.i.attn.kv_down.weight [d_c+d_R, d]   self_attn.kv_a_proj_with_mqa.weight
    blocks.i.attn.kv_norm.weight [d_c]          self_attn.kv_a_layernorm.weight
    blocks.i.attn.k_up.weight   [H D, d_c]      self_attn.kv_b_proj.weight [H(D+D_v), d_c]: each head's rows
    blocks.i.attn.v_up.weight   [H D_v, d_c]      [W_uk,h; W_uv,h] together (deepseek_layout)
    blocks.i.attn.out.weight    [d, H D_v]      self_attn.o_proj.weight

model.ffn=moe (model/moe.py; E experts of d_e, block i an MoE one) maps its router and experts, and DeepseekV3 its
shared experts and balancing bias (<b> is block_sparse_moe for Mixtral, mlp otherwise; Mixtral calls the
projections w1, w3, w2):

    blocks.i.ffn.router.weight      [E, d]         <b>.gate.weight
    blocks.i.ffn.experts_in.weight  [E 2d_e, d]    rows [W1_e; W3_e] for each e = <b>.experts.e.{gate,up}_proj.weight
    blocks.i.ffn.experts_out.weight [E d_e, d]     rows W2_e^T for each e; <b>.experts.e.down_proj.weight is W2_e
                                                   [d, d_e] (moe_layout transposes each)
    blocks.i.ffn.shared.w_in/w_out                 mlp.shared_experts.{gate,up,down}_proj.weight (DeepseekV3)
    blocks.i.ffn.bias               [E]            mlp.gate.e_score_correction_bias (DeepseekV3)

model.sinks=true is gpt-oss (GPT_OSS: its experts compute ours under fixed settings and biases), dense or MoE:

    blocks.i.attn.sinks             [H]            model.layers.i.self_attn.sinks
    blocks.i.ffn.router.weight      [E, d]         mlp.router.weight (a dense SwiGLU: one expert, zeros [1, d])
    experts_in [E 2d_e, d], experts_out [E d_e, d]  mlp.experts.gate_up_proj [E, d, 2d_e] (W1_e's columns at the
    (a dense SwiGLU: w_in, w_out, E = 1)             even places, W3_e's at the odd), down_proj [E, d_e, d]
    (none)                                          mlp.experts.{gate_up,down}_proj_bias, mlp.router.bias (gpt_oss_ffn)

DeepSeek rotates interleaved pairs (x_2i, x_2i+1) (rope_interleave, written true as DeepSeek's checkpoints have
it), this repo half-split ones (x_i, x_i+d_R/2): the rows that make each RoPE part (q_up's per head, kv_down's
last d_R) are reordered at the boundary, so the same pairs rotate by the same frequency on both sides.
Only the LLaMA choices have a transformers equivalent: RMSNorm, Pre-Norm, RoPE, SwiGLU, no biases (ReLU, GELU and
ReLU² are ungated; LLaMA's and Qwen3's MLPs are gated).
Nothing here imports transformers: export and import read and write its files as plain JSON
and safetensors, so neither needs it installed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from sentencepiece import sentencepiece_model_pb2

from errors import ConfigError, UsageError
from model.config import ModelConfig, window_pattern_of
from model.ffn import FeedForward
from model.moe import MoE
from model.rope_scaling import YARN_BETA_FAST, YARN_BETA_SLOW, ntk_base
from model.transformer import Transformer
from storage.checkpoint import CheckpointError, check_vocab

# The value each switch must have for the model to be a LLaMA; model.qk_norm picks LLaMA or Qwen3 (ARCHITECTURES).
LLAMA_SWITCHES = {"norm": "rmsnorm", "norm_position": "pre", "position": "rope", "ffn": "swiglu", "bias": False,
                  "embedding_scale": "gpt2"}


@dataclass(frozen=True)
class Experts:
    """Where a transformers MoE family keeps a sparse block's weights, under model.layers.i.: <block>.gate.weight is
    the router, <block>.experts.e.<gate|up|down>.weight expert e's W1, W3, W2, and config.json names E, k and d_e."""
    block: str
    gate: str
    up: str
    down: str
    n_experts: str  # config.json's keys
    expert_width: str
    shared: str | None = None  # the shared experts' SwiGLU, <block>.<shared>.{gate,up,down}_proj (DeepseekV3)


@dataclass(frozen=True)
class Architecture:
    """A transformers architecture, and the switches that make this repo's model one."""
    name: str  # for messages
    model_type: str  # config.json's model_type
    class_name: str  # config.json's architectures
    switches: dict  # every switch this repo's model must have to be it
    fixed: dict  # config.json keys with the one value this repo's model has: written on export, checked on import
    default_head_dim: int | None  # transformers' head dim when config.json has none (None: hidden / heads)
    experts: Experts | None = None  # an MoE family's (ffn=moe)


LLAMA = Architecture("LLaMA", "llama", "LlamaForCausalLM", LLAMA_SWITCHES | {"qk_norm": "none"},
                     {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}, None)
# LLaMA with a sliding window (model.window, hf_windows): Mistral's in every layer, Ministral's where layer_types says
MISTRAL = Architecture("Mistral", "mistral", "MistralForCausalLM", LLAMA_SWITCHES | {"qk_norm": "none"},
                       {"hidden_act": "silu"}, None)
MINISTRAL = Architecture("Ministral", "ministral", "MinistralForCausalLM", LLAMA_SWITCHES | {"qk_norm": "none"},
                         {"hidden_act": "silu"}, None)
# Qwen3Config's head_dim defaults to 128 whatever the width; its MLP has no bias switch; its sliding windows are
# use_sliding_window, sliding_window and layer_types (hf_windows)
QWEN3 = Architecture("Qwen3", "qwen3", "Qwen3ForCausalLM", LLAMA_SWITCHES | {"qk_norm": "rmsnorm"},
                     {"hidden_act": "silu", "attention_bias": False}, 128)
# multi-head latent attention with a dense SwiGLU at every layer; its latents' norms have eps 1e-6 (model/mla.py)
DEEPSEEK_V3 = Architecture("DeepseekV3", "deepseek_v3", "DeepseekV3ForCausalLM", LLAMA_SWITCHES | {"qk_norm": "none"},
                           {"hidden_act": "silu", "attention_bias": False}, None)
# ffn=moe (model/moe.py): the softmax router's families have no shared experts and no balancing bias; Mixtral's
# blocks are all sparse, Qwen3-MoE's first ones may be dense (mlp_only_layers); DeepseekV3's router is the sigmoid one
MOE_SWITCHES = LLAMA_SWITCHES | {"ffn": "moe", "router": "softmax", "n_shared_experts": 0, "router_bias_rate": 0.0}
GATED_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
MIXTRAL = Architecture("Mixtral", "mixtral", "MixtralForCausalLM", MOE_SWITCHES | {"qk_norm": "none", "dense_layers": 0},
                       {"hidden_act": "silu", "router_jitter_noise": 0.0}, None,
                       Experts("block_sparse_moe", "w1", "w3", "w2", "num_local_experts", "intermediate_size"))
QWEN3_MOE = Architecture("Qwen3-MoE", "qwen3_moe", "Qwen3MoeForCausalLM", MOE_SWITCHES | {"qk_norm": "rmsnorm"},
                         {"hidden_act": "silu", "attention_bias": False, "norm_topk_prob": True,
                          "decoder_sparse_step": 1}, 128,
                         Experts("mlp", *GATED_PROJECTIONS, "num_experts", "moe_intermediate_size"))
# DeepseekV3's MoE: the sigmoid router, its bias (e_score_correction_bias), one group, gates not rescaled
DEEPSEEK_V3_MOE = Architecture("DeepseekV3", "deepseek_v3", "DeepseekV3ForCausalLM",
                               LLAMA_SWITCHES | {"qk_norm": "none", "ffn": "moe", "router": "sigmoid"},
                               {"hidden_act": "silu", "attention_bias": False, "n_group": 1, "topk_group": 1,
                                "routed_scaling_factor": 1.0, "norm_topk_prob": True}, None,
                               Experts("mlp", *GATED_PROJECTIONS, "n_routed_experts", "moe_intermediate_size",
                                       "shared_experts"))
# gpt-oss (model.sinks): LLaMA's attention with a sink logit per head, and experts under the softmax router (top-k,
# then a softmax over the k: our renormalised gates) in every block; a dense SwiGLU is one expert, always chosen.
# Its experts' SwiGLU is (up + 1) * gate * sigmoid(alpha * gate), gate and up clamped at swiglu_limit, with biases:
# ours is theirs at alpha 1, a limit no float32 reaches, up's bias -1 and every other bias 0 (gpt_oss_ffn).
FLOAT32_MAX = torch.finfo(torch.float32).max
GPT_OSS_FIXED = {"hidden_act": "silu", "attention_bias": False, "swiglu_alpha": 1.0, "swiglu_limit": FLOAT32_MAX}
# what GptOssConfig reads for a key config.json leaves out, where it is not what this repo's readers assume (its
# head_dim, 64, is default_head_dim's): OpenAI's settings, which an import then refuses or reads as they are
GPT_OSS_DEFAULTS = {"attention_bias": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "num_local_experts": 128,
                    "num_experts_per_tok": 4, "sliding_window": 128, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
                    "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                        "truncate": False, "original_max_position_embeddings": 4096}}
GPT_OSS = Architecture("gpt-oss", "gpt_oss", "GptOssForCausalLM", LLAMA_SWITCHES | {"qk_norm": "none", "sinks": True},
                       GPT_OSS_FIXED, 64)
GPT_OSS_MOE = Architecture("gpt-oss", "gpt_oss", "GptOssForCausalLM",
                           MOE_SWITCHES | {"qk_norm": "none", "sinks": True, "dense_layers": 0}, GPT_OSS_FIXED, 64)
# model.qk_norm -> its architecture, dense and with experts
ARCHITECTURES = {arch.switches["qk_norm"]: arch for arch in (LLAMA, QWEN3)}
MOE_ARCHITECTURES = {arch.switches["qk_norm"]: arch for arch in (MIXTRAL, QWEN3_MOE)}
# config.json's model_type -> its architecture (DeepseekV3's with experts where first_k_dense_replace < layers,
# gpt-oss's where a block has more than one expert)
BY_MODEL_TYPE = {arch.model_type: arch for arch in (LLAMA, MISTRAL, MINISTRAL, QWEN3, DEEPSEEK_V3, MIXTRAL, QWEN3_MOE,
                                                    GPT_OSS)}
# the families whose config.json says which layers are local (layer_types), and those with a window in every layer
LAYER_TYPES = (MINISTRAL, QWEN3, GPT_OSS, GPT_OSS_MOE)
EVERY_LAYER_WINDOW = (MISTRAL, MIXTRAL, QWEN3_MOE)
USE_SLIDING_WINDOW = (QWEN3, QWEN3_MOE)  # theirs is off unless use_sliding_window says so (hf_layer_types)


def architecture_of(cfg: ModelConfig) -> Architecture:
    """The transformers architecture a model's attention, FFN, router and QK-norm make it, if its other switches are
    LLaMA's: gpt-oss for sink logits, DeepseekV3 for MLA (with the sigmoid router's experts or dense), else the
    softmax router's families for an MoE, else LLaMA or Qwen3."""
    if cfg.sinks:
        return GPT_OSS_MOE if cfg.ffn == "moe" else GPT_OSS
    if cfg.attention == "mla" or cfg.ffn == "moe" and cfg.router == "sigmoid":
        return DEEPSEEK_V3_MOE if cfg.ffn == "moe" else DEEPSEEK_V3
    arch = (MOE_ARCHITECTURES if cfg.ffn == "moe" and cfg.router == "softmax" else ARCHITECTURES)[cfg.qk_norm]
    if arch is LLAMA and cfg.window is not None:  # LLaMA has no window; Mistral has one everywhere, Ministral per layer
        return MISTRAL if cfg.window_pattern == "all" else MINISTRAL
    return arch


def hf_head_dim(hf: dict) -> int:
    """A transformers config.json's head dim as transformers reads it: its head_dim, else its architecture's
    default (Qwen3's 128), else hidden_size / num_attention_heads. KeyError where those are missing."""
    arch = BY_MODEL_TYPE.get(hf.get("model_type"))
    return hf.get("head_dim") or (arch and arch.default_head_dim) or hf["hidden_size"] // hf["num_attention_heads"]


class InteropError(UsageError):
    """A model, config or tokenizer that has no faithful counterpart on the other side; one line."""


def switches_unlike(cfg: ModelConfig, arch: Architecture) -> list[str]:
    """The switches set to another option than the architecture's, as 'model.key=value'."""
    return [f"model.{key}={getattr(cfg, key)}" for key, value in arch.switches.items() if getattr(cfg, key) != value]


def _weight_names(model: Transformer) -> dict[str, list[tuple[str, int]]]:
    """Our parameter name -> the transformers names whose rows it stacks, with their row counts (a stacked
    layer's stacked_rows: model/attention.py, model/ffn.py)."""
    cfg = model.cfg
    D = cfg.head_dim
    names = {"tok_emb.weight": [("model.embed_tokens.weight", cfg.vocab_size)],
             "final_norm.weight": [("model.norm.weight", cfg.d_model)]}
    for i, block in enumerate(model.blocks):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        names[ours + "attn_norm.weight"] = [(theirs + "input_layernorm.weight", cfg.d_model)]
        if cfg.attention == "mla":
            names |= _latent_attention_names(cfg, ours + "attn.", theirs + "self_attn.")
        else:
            names[ours + "attn.qkv.weight"] = list(zip([theirs + f"self_attn.{x}_proj.weight" for x in "qkv"],
                                                       block.attn.qkv.stacked_rows, strict=True))
        if cfg.qk_norm == "rmsnorm":
            names[ours + "attn.qk_norm.q_norm.weight"] = [(theirs + "self_attn.q_norm.weight", D)]
            names[ours + "attn.qk_norm.k_norm.weight"] = [(theirs + "self_attn.k_norm.weight", D)]
        names[ours + "attn.out.weight"] = [(theirs + "self_attn.o_proj.weight", cfg.d_model)]
        if cfg.sinks:
            names[ours + "attn.sinks"] = [(theirs + "self_attn.sinks", cfg.n_heads)]
        names[ours + "ffn_norm.weight"] = [(theirs + "post_attention_layernorm.weight", cfg.d_model)]
        if cfg.sinks:  # gpt-oss: its fused experts are gpt_oss_ffn's; the router is a plain matrix
            if i in model.moe_layers():
                names[ours + "ffn.router.weight"] = [(theirs + "mlp.router.weight", cfg.n_experts)]
        elif i in model.moe_layers():
            names |= _expert_names(block.ffn, architecture_of(cfg).experts, ours + "ffn.", theirs, cfg.d_model)
        else:
            names |= _dense_ffn_names(block.ffn, ours + "ffn.", theirs + "mlp.", cfg.d_model)
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = [("lm_head.weight", cfg.vocab_size)]
    return names


def _dense_ffn_names(ffn: FeedForward, ours: str, theirs: str, d_model: int) -> dict:
    """A SwiGLU's names: the rows [W1; W3] of w_in (its stacked_rows) are gate_proj and up_proj, w_out down_proj."""
    return {ours + "w_in.weight": list(zip([theirs + "gate_proj.weight", theirs + "up_proj.weight"],
                                           ffn.w_in.stacked_rows, strict=True)),
            ours + "w_out.weight": [(theirs + "down_proj.weight", d_model)]}


def _expert_names(moe: MoE, experts: Experts, ours: str, theirs: str, d_model: int) -> dict:
    """An MoE block's names, in moe_layout's terms (its experts_out rows are each expert's W2, [d, d_e]): the rows
    [W1_e; W3_e] of experts_in (its stacked_rows) are each expert's gate and up projections."""
    E, block = moe.n_experts, theirs + experts.block + "."
    projections = [f"{block}experts.{e}.{part}.weight" for e in range(E) for part in (experts.gate, experts.up)]
    names = {ours + "router.weight": [(block + "gate.weight", E)],
             ours + "experts_in.weight": list(zip(projections, moe.experts_in.stacked_rows, strict=True)),
             ours + "experts_out.weight": [(f"{block}experts.{e}.{experts.down}.weight", d_model) for e in range(E)]}
    if experts.shared:  # DeepseekV3's balancing bias, and its shared experts if any
        names[ours + "bias"] = [(block + "gate.e_score_correction_bias", E)]
        if moe.shared is not None:
            names |= _dense_ffn_names(moe.shared, ours + "shared.", f"{block}{experts.shared}.", d_model)
    return names


def swiglu_matrices(ffn: FeedForward | MoE) -> tuple[torch.Tensor, torch.Tensor]:
    """A SwiGLU's or an MoE block's experts' weights, as E experts (E = 1 for a dense SwiGLU): ([E, 2, d_e, d]:
    W1_e^T and W3_e^T, nn.Linear's rows), [E, d_e, d]: W2_e as x W2_e reads it)."""
    if isinstance(ffn, MoE):
        return (ffn.experts_in.weight.view(ffn.n_experts, 2, ffn.expert_d_ff, -1),
                ffn.experts_out.weight.view(ffn.n_experts, ffn.expert_d_ff, -1))
    return ffn.w_in.weight.view(1, 2, ffn.w_out.weight.shape[1], -1), ffn.w_out.weight.t().unsqueeze(0)


def gpt_oss_biases(experts: int, width: int, d_model: int) -> dict[str, torch.Tensor]:
    """gpt-oss's FFN biases under which its experts compute ours (GPT_OSS_FIXED): up's -1, every other 0."""
    return {"experts.gate_up_proj_bias": torch.stack([torch.zeros(experts, width), -torch.ones(experts, width)],
                                                     dim=-1).flatten(1),  # gate, up, gate, up, ...
            "experts.down_proj_bias": torch.zeros(experts, d_model), "router.bias": torch.zeros(experts)}


def gpt_oss_ffn(model: Transformer) -> dict[str, torch.Tensor]:
    """Every block's FFN as gpt-oss holds it, under model.layers.i.mlp.: gate_up_proj [E, d, 2 d_e] (x W: W1_e's
    columns at the even places, W3_e's at the odd ones), down_proj [E, d_e, d] and gpt_oss_biases; a dense SwiGLU
    is one expert, its router [1, d] zeros (a softmax over one logit is 1)."""
    out = {}
    for i, block in enumerate(model.blocks):
        theirs = f"model.layers.{i}.mlp."
        gate_up, down = (m.detach().cpu() for m in swiglu_matrices(block.ffn))
        experts, _, width, d = gate_up.shape
        out[theirs + "experts.gate_up_proj"] = gate_up.permute(0, 3, 2, 1).reshape(experts, d, 2 * width).contiguous()
        out[theirs + "experts.down_proj"] = down.contiguous()
        out |= {theirs + name: bias for name, bias in gpt_oss_biases(experts, width, d).items()}
        if not isinstance(block.ffn, MoE):
            out[theirs + "router.weight"] = torch.zeros(1, d)
    return out


def gpt_oss_ffn_back(model: Transformer, hf_state: dict[str, torch.Tensor],
                     expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """gpt_oss_ffn's inverse: each block's FFN weights under this repo's names, from transformers' tensors (every
    name of expected, gpt_oss_ffn(model), present: load_hf_state_dict checked); an InteropError for a shape other
    than expected's, or for biases other than gpt_oss_biases' (a gpt-oss trained elsewhere)."""
    for name, tensor in expected.items():
        if hf_state[name].shape != tensor.shape:
            raise InteropError(f"weights do not match config.json: {name} is {list(hf_state[name].shape)}, the config "
                               f"implies {list(tensor.shape)}")
    state = {}
    for i, block in enumerate(model.blocks):
        theirs, ours = f"model.layers.{i}.mlp.", f"blocks.{i}.ffn."
        gate_up, down = swiglu_matrices(block.ffn)
        experts, _, width, d = gate_up.shape
        for name, bias in gpt_oss_biases(experts, width, d).items():
            if not torch.equal(hf_state[theirs + name].to(bias.dtype), bias):
                raise InteropError(f"{theirs + name} is not supported: this repo's experts and router have no biases "
                                   f"(the ones it exports: 0, and -1 on up, which the SwiGLU's (up + 1) cancels)")
        rows = hf_state[theirs + "experts.gate_up_proj"].view(experts, d, width, 2).permute(0, 3, 2, 1)
        if isinstance(block.ffn, MoE):
            state[ours + "experts_in.weight"] = rows.reshape(-1, d)
            state[ours + "experts_out.weight"] = hf_state[theirs + "experts.down_proj"].reshape(-1, d)
        else:
            state[ours + "w_in.weight"] = rows.reshape(-1, d)
            state[ours + "w_out.weight"] = hf_state[theirs + "experts.down_proj"][0].t()
    return state


def moe_layout(state: dict[str, torch.Tensor], model: Transformer, to_hf: bool = True) -> dict:
    """An MoE model's weights with each block's experts_out as transformers holds W2: this repo stores expert e's
    rows as W2_e^T [d_e, d] (so that Muon's stacked_rows split it), transformers W2_e [d, d_e]. to_hf=False
    is the inverse."""
    out, d = dict(state), model.cfg.d_model
    for i, moe in model.moe_layers().items():
        name = f"blocks.{i}.ffn.experts_out.weight"
        shape = (moe.n_experts, moe.expert_d_ff, d) if to_hf else (moe.n_experts, d, moe.expert_d_ff)
        out[name] = state[name].view(shape).transpose(1, 2).flatten(0, 1)
    return out


def _latent_attention_names(cfg: ModelConfig, ours: str, theirs: str) -> dict[str, list[tuple[str, int]]]:
    """One MLA layer's names, in deepseek_layout's terms (its kv_up is k_up and v_up, head by head)."""
    query_rows = cfg.n_heads * (cfg.head_dim + cfg.rope_dim)
    if cfg.q_rank is None:
        names = {ours + "q_up.weight": [(theirs + "q_proj.weight", query_rows)]}
    else:
        names = {ours + "q_down.weight": [(theirs + "q_a_proj.weight", cfg.q_rank)],
                 ours + "q_norm.weight": [(theirs + "q_a_layernorm.weight", cfg.q_rank)],
                 ours + "q_up.weight": [(theirs + "q_b_proj.weight", query_rows)]}
    return names | {
        ours + "kv_down.weight": [(theirs + "kv_a_proj_with_mqa.weight", cfg.kv_rank + cfg.rope_dim)],
        ours + "kv_norm.weight": [(theirs + "kv_a_layernorm.weight", cfg.kv_rank)],
        ours + "kv_up.weight": [(theirs + "kv_b_proj.weight", cfg.n_heads * (cfg.head_dim + cfg.value_dim))]}


def interleaved_pairs(rows: int) -> torch.Tensor:
    """The row order that takes a RoPE part's half-split pairs (i, i + rows/2), this repo's, to interleaved pairs
    (2i, 2i + 1), DeepSeek's: row 2i is row i, row 2i + 1 is row i + rows/2."""
    return torch.arange(rows).view(2, rows // 2).t().flatten()


def rope_rows_in_order(state: dict[str, torch.Tensor], cfg: ModelConfig, order: torch.Tensor) -> dict:
    """An MLA model's weights with each layer's RoPE rows (of every query head, and of the shared key) in `order`."""
    H, D, d_r, d_c = cfg.n_heads, cfg.head_dim, cfg.rope_dim, cfg.kv_rank
    out = dict(state)
    for i in range(cfg.n_layers):
        attn = f"blocks.{i}.attn."
        q_up = state[attn + "q_up.weight"].view(H, D + d_r, -1)
        out[attn + "q_up.weight"] = torch.cat([q_up[:, :D], q_up[:, D:][:, order]], dim=1).flatten(0, 1)
        kv_down = state[attn + "kv_down.weight"]
        out[attn + "kv_down.weight"] = torch.cat([kv_down[:d_c], kv_down[d_c:][order]])
    return out


def deepseek_layout(state: dict[str, torch.Tensor], cfg: ModelConfig, interleave: bool = True) -> dict:
    """An MLA model's weights as DeepseekV3 lays them out: each RoPE part's rows in interleaved pairs (unless
    rope_interleave is false) and each layer's k_up and v_up as one kv_up whose rows are [W_uk,h; W_uv,h] per head.
    repo_layout is its inverse."""
    order = interleaved_pairs(cfg.rope_dim) if interleave else torch.arange(cfg.rope_dim)
    out = rope_rows_in_order(state, cfg, order)
    for i in range(cfg.n_layers):
        attn = f"blocks.{i}.attn."
        k_up = out.pop(attn + "k_up.weight").view(cfg.n_heads, cfg.head_dim, cfg.kv_rank)
        v_up = out.pop(attn + "v_up.weight").view(cfg.n_heads, -1, cfg.kv_rank)
        out[attn + "kv_up.weight"] = torch.cat([k_up, v_up], dim=1).flatten(0, 1)
    return out


def repo_layout(state: dict[str, torch.Tensor], cfg: ModelConfig, interleave: bool = True) -> dict:
    """deepseek_layout's inverse: DeepseekV3's weights (under this repo's names) as this repo's model holds them."""
    order = interleaved_pairs(cfg.rope_dim).argsort() if interleave else torch.arange(cfg.rope_dim)
    out = rope_rows_in_order(state, cfg, order)
    for i in range(cfg.n_layers):
        attn = f"blocks.{i}.attn."
        kv_up = out.pop(attn + "kv_up.weight").view(cfg.n_heads, cfg.head_dim + cfg.value_dim, cfg.kv_rank)
        out[attn + "k_up.weight"] = kv_up[:, :cfg.head_dim].flatten(0, 1)
        out[attn + "v_up.weight"] = kv_up[:, cfg.head_dim:].flatten(0, 1)
    return out


# ---------------------------------------------------------------- export: this repo -> transformers

def check_exportable(cfg: ModelConfig, target: str) -> Architecture:
    """The model's architecture (LLaMA, Qwen3 with QK-norm, DeepseekV3 with MLA); refuses a model with any other
    switch, naming every offending one; target: whose architecture, for the message."""
    arch = architecture_of(cfg)
    refused = switches_unlike(cfg, arch)
    if refused:
        raise InteropError(f"no {target} {arch.name} equivalent for {', '.join(refused)} "
                           f"({arch.name} is {', '.join(f'model.{k}={v}' for k, v in arch.switches.items())})")
    if cfg.window is not None and arch in EVERY_LAYER_WINDOW and cfg.window_pattern != "all":
        raise InteropError(f"model.window={cfg.window} with model.window_pattern={cfg.window_pattern} has no {target} "
                           f"{arch.name} equivalent: its window is in every layer (model.window_pattern=all)")
    if cfg.ffn == "moe" and cfg.experts_per_token == 1:  # model/moe.py: a top-1 gate is p, not renormalised
        raise InteropError(f"model.experts_per_token=1 has no {target} {arch.name} equivalent: its gates are "
                           f"renormalised over the k chosen, 1 for a single expert, where this repo's top-1 gate is "
                           f"the router's probability (Switch)")
    if arch is DEEPSEEK_V3_MOE and cfg.attention != "mla":
        raise InteropError(f"no {target} equivalent for model.router=sigmoid with model.attention={cfg.attention}: "
                           f"the sigmoid router's family, DeepseekV3, has multi-head latent attention "
                           f"(attention=mla)")
    return arch


def hf_rope(cfg: ModelConfig) -> tuple[dict, int]:
    """(rope_parameters, max_position_embeddings) for the model's RoPE scaling, in transformers' terms
    (model/rope_scaling.py): ntk is its default type with the NTK-aware base; dynamic reads its original context
    from max_position_embeddings, yarn from original_max_position_embeddings."""
    if cfg.rope_scaling == "none":
        return {"rope_type": "default", "rope_theta": cfg.rope_base}, cfg.context_length
    if cfg.rope_scaling == "ntk":
        return {"rope_type": "default", "rope_theta": ntk_base(cfg.rope_base, cfg.rope_factor, cfg.rope_dim)}, \
            cfg.context_length
    rope = {"rope_type": cfg.rope_scaling, "rope_theta": cfg.rope_base, "factor": float(cfg.rope_factor)}
    if cfg.rope_scaling == "dynamic":
        return rope, cfg.original_context
    if cfg.rope_scaling == "yarn":
        rope |= {"original_max_position_embeddings": cfg.original_context, "beta_fast": YARN_BETA_FAST,
                 "beta_slow": YARN_BETA_SLOW, "truncate": True}
    return rope, cfg.context_length


def hf_config(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """transformers' config.json for a LLaMA-, Qwen3- or DeepseekV3-configured model; refuses any other with every
    offending switch."""
    arch = check_exportable(cfg, "transformers")
    rope, max_positions = hf_rope(cfg)
    scaled = ({"rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}}
              if rope["rope_type"] != "default" else {})
    heads = ({"num_key_value_heads": cfg.n_heads, "kv_lora_rank": cfg.kv_rank, "q_lora_rank": cfg.q_rank,
              "qk_nope_head_dim": cfg.head_dim, "qk_rope_head_dim": cfg.rope_dim, "v_head_dim": cfg.value_dim,
              "rope_interleave": True, "first_k_dense_replace": cfg.n_layers}  # every FFN dense, unless experts
             if arch.model_type == "deepseek_v3" else {"num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim})
    return {
        "architectures": [arch.class_name],
        "model_type": arch.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_width,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        **heads,
        "max_position_embeddings": max_positions,
        **hf_experts(cfg, arch),
        **hf_windows(cfg, arch),
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope,
        # transformers 4.x reads rope_theta, rope_scaling and torch_dtype; 5.x reads rope_parameters and dtype
        # (and rope_scaling before rope_parameters: the two are the same scaling).
        "rope_theta": rope["rope_theta"],
        **scaled,
        "torch_dtype": "float32",
        "dtype": "float32",
        **arch.fixed,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def hf_windows(cfg: ModelConfig, arch: Architecture) -> dict:
    """config.json's sliding-window keys: the window (Mistral's and Mixtral's in every layer), each layer's type where
    the family lists them, and Qwen3's use_sliding_window (off without a window)."""
    keys = {}
    if arch in USE_SLIDING_WINDOW:
        keys["use_sliding_window"] = cfg.window is not None
    if cfg.window is None:
        if arch in (GPT_OSS, GPT_OSS_MOE):  # its config's default alternates 128-token windows; its forward builds
            # the sliding mask whatever the layers' types, so a window the context never passes: none is used
            return {"sliding_window": cfg.context_length, "layer_types": cfg.n_layers * ["full_attention"]}
        return keys | ({"sliding_window": None} if arch in (MIXTRAL, *USE_SLIDING_WINDOW) else {})
    keys["sliding_window"] = cfg.window
    if arch in LAYER_TYPES:
        keys["layer_types"] = ["sliding_attention" if window else "full_attention"
                               for window in cfg.layer_windows]
    return keys


def hf_experts(cfg: ModelConfig, arch: Architecture) -> dict:
    """config.json's MoE keys (none for a dense model): E, k and d_e under the family's names, and which blocks
    are dense (Mixtral has none: its switches hold dense_layers at 0)."""
    if arch in (GPT_OSS, GPT_OSS_MOE):  # intermediate_size is an expert's width; a dense SwiGLU is one expert
        sparse = arch is GPT_OSS_MOE
        return {"num_local_experts": cfg.n_experts if sparse else 1,
                "num_experts_per_tok": cfg.experts_per_token if sparse else 1,
                "intermediate_size": cfg.expert_width if sparse else cfg.ffn_width,
                "router_aux_loss_coef": cfg.router_aux_coef if sparse else 0.0, "output_router_logits": False}
    experts = arch.experts
    if experts is None:
        return {}
    keys = {experts.n_experts: cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token,
            experts.expert_width: cfg.expert_width, "router_aux_loss_coef": cfg.router_aux_coef,
            "output_router_logits": False}
    if arch is QWEN3_MOE:
        keys["mlp_only_layers"] = list(range(cfg.dense_layers))
    if arch is DEEPSEEK_V3_MOE:
        keys |= {"first_k_dense_replace": cfg.dense_layers, "n_shared_experts": cfg.n_shared_experts}
    return keys


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, split into their separate matrices."""
    ours = moe_layout(model.state_dict(), model)
    if model.cfg.attention == "mla":
        ours = deepseek_layout(ours, model.cfg)
    out = {}
    for name, parts in _weight_names(model).items():
        pieces = ours[name].split([rows for _, rows in parts], dim=0)
        out.update({hf_name: piece.detach().contiguous().cpu() for (hf_name, _), piece in zip(parts, pieces)})
    return out | (gpt_oss_ffn(model) if model.cfg.sinks else {})


# ---------------------------------------------------------------- import: transformers -> this repo

def model_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig for a transformers LLaMA, Qwen3 or DeepseekV3 config.json; refuses features this repo does not
    have."""
    hf = read_as_transformers(hf)
    arch = BY_MODEL_TYPE.get(hf.get("model_type"))
    if arch is DEEPSEEK_V3 and hf.get("first_k_dense_replace", 3) < hf.get("num_hidden_layers", 0):
        arch = DEEPSEEK_V3_MOE  # its later blocks have experts (3: DeepseekV3Config's default)
    if arch is GPT_OSS and hf["num_local_experts"] > 1:
        arch = GPT_OSS_MOE
    if arch is None:
        raise InteropError(f"model_type={hf.get('model_type')!r} is not supported; only model_type="
                           f"{' or '.join(repr(t) for t in BY_MODEL_TYPE)} is")
    for key, supported in arch.fixed.items():
        if hf.get(key, supported) != supported:
            raise InteropError(f"{key}={hf[key]!r} is not supported; this repo's {arch.name} has {key}={supported!r}")
    try:
        d, n_heads = hf["hidden_size"], hf["num_attention_heads"]
        ffn_width = hf["intermediate_size"]
        values = dict(vocab_size=hf["vocab_size"], d_model=d, n_layers=hf["num_hidden_layers"], n_heads=n_heads,
                      n_kv_heads=hf.get("num_key_value_heads") or n_heads,
                      context_length=hf["max_position_embeddings"])
    except KeyError as e:
        raise InteropError(f"config.json has no {e.args[0]}") from None
    values |= rope_settings(hf, values["context_length"])
    values |= window_settings(hf, values["n_layers"], values["context_length"])
    if arch.model_type == "deepseek_v3":
        values |= latent_attention_settings(hf)
    if arch.experts or arch is GPT_OSS_MOE:
        values |= expert_settings(hf, arch)
    head_dim = values.pop("head_dim", None) or hf_head_dim(hf)
    if head_dim * n_heads != d:
        raise InteropError(f"head_dim={head_dim} is not supported; this repo's head dim is "
                           f"hidden_size / num_attention_heads = {d} / {n_heads}")
    return ModelConfig(**values, d_ff=ffn_width,
                       norm_eps=hf.get("rms_norm_eps", 1e-6),
                       tie_embeddings=hf.get("tie_word_embeddings", False), **arch.switches)


QWEN_WINDOWS = ("qwen2", "qwen3", "qwen3_moe")  # model_types whose window is off unless use_sliding_window is true


def read_as_transformers(hf: dict) -> dict:
    """A config.json with the defaults transformers reads for the keys it leaves out, where this repo's readers
    would assume others (gpt-oss's: GPT_OSS_DEFAULTS)."""
    return GPT_OSS_DEFAULTS | hf if hf.get("model_type") == "gpt_oss" else hf


def hf_layer_types(hf: dict, n_layers: int) -> tuple[int | None, list[str]]:
    """(the sliding window, each layer's attention) as transformers reads a config.json: layer_types where given;
    else sliding_attention in every layer with a window (Mistral, Mixtral, Qwen3-MoE), or from max_window_layers on
    (Qwen2, Qwen3), or in every other layer from the first (gpt-oss); the Qwen families' window only with
    use_sliding_window true (their default is false)."""
    hf = read_as_transformers(hf)
    model_type = hf.get("model_type")
    window = hf.get("sliding_window")
    if model_type in QWEN_WINDOWS and not hf.get("use_sliding_window", False):
        window = None
    types = hf.get("layer_types")
    if types is None and model_type == "gpt_oss":  # its config's default: local first, then every other layer
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    if types is None:
        first = hf.get("max_window_layers", 28) if model_type in ("qwen2", "qwen3") else 0  # their configs' default
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(n_layers)]
    return window, types


def window_settings(hf: dict, n_layers: int, context: int) -> dict:
    """model.window and model.window_pattern of a config.json (hf_layer_types): hf_windows' inverse. A window no
    shorter than the context cuts nothing: full attention. Layers whose types no model.window_pattern makes (a full
    one first, say) are refused in one line."""
    window, types = hf_layer_types(hf, n_layers)
    for layer, kind in enumerate(types):
        if kind not in ("full_attention", "sliding_attention"):
            raise InteropError(f"layer_types[{layer}]={kind!r} is not supported; this repo's layers are "
                               f"full_attention or sliding_attention")
    local = [kind == "sliding_attention" for kind in types]
    if window is None or window >= context or not any(local):
        return {}
    if BY_MODEL_TYPE[hf["model_type"]] not in (*LAYER_TYPES, *EVERY_LAYER_WINDOW):
        raise InteropError(f"sliding_window={window} is not supported; this repo's "
                           f"{BY_MODEL_TYPE[hf['model_type']].name} attends to every earlier position")
    pattern = window_pattern_of(local)
    if pattern is None:
        raise InteropError(f"layer_types={types} is not supported; this repo's local layers are all of them, every "
                           f"other one from the first (alternate), or N local to one full (N:1)")
    return {"window": window, "window_pattern": pattern}


def expert_settings(hf: dict, arch: Architecture) -> dict:
    """model.n_experts, experts_per_token, expert_d_ff, router_aux_coef and the dense blocks (and DeepseekV3's
    shared experts) of an MoE family's config.json: hf_experts' inverse."""
    n_experts, expert_width = ((arch.experts.n_experts, arch.experts.expert_width) if arch.experts else
                               ("num_local_experts", "intermediate_size"))  # gpt-oss's
    try:
        values = {"n_experts": hf[n_experts], "experts_per_token": hf["num_experts_per_tok"],
                  "expert_d_ff": hf[expert_width], "router_aux_coef": float(hf.get("router_aux_loss_coef", 0))}
    except KeyError as e:
        raise InteropError(f"config.json has no {e.args[0]}") from None
    if values["experts_per_token"] == 1:  # as check_exportable refuses it
        raise InteropError(f"num_experts_per_tok=1 is not supported for {arch.name}: its one gate is renormalised to "
                           f"1, where this repo's top-1 gate is the router's probability (Switch)")
    if arch is QWEN3_MOE:
        dense = hf.get("mlp_only_layers") or []
        if dense != list(range(len(dense))):  # this repo's dense blocks are the first ones (model.dense_layers)
            raise InteropError(f"mlp_only_layers={dense} is not supported; this repo's dense blocks are the first "
                               f"model.dense_layers ones, e.g. mlp_only_layers={list(range(len(dense)))}")
        values["dense_layers"] = len(dense)
    if arch is DEEPSEEK_V3_MOE:
        values |= {"dense_layers": hf.get("first_k_dense_replace", 3), "n_shared_experts": hf.get("n_shared_experts", 1)}
    return values


def latent_attention_settings(hf: dict) -> dict:
    """model.kv_rank, q_rank, rope_head_dim and v_head_dim (and the head dim, qk_nope_head_dim) of a DeepseekV3
    config.json."""
    try:
        head_dim, value_dim = hf["qk_nope_head_dim"], hf["v_head_dim"]
        return {"kv_rank": hf["kv_lora_rank"], "q_rank": hf.get("q_lora_rank"), "head_dim": head_dim,
                "rope_head_dim": hf["qk_rope_head_dim"], "v_head_dim": None if value_dim == head_dim else value_dim,
                "n_kv_heads": hf["num_attention_heads"]}
    except KeyError as e:
        raise InteropError(f"config.json has no {e.args[0]}") from None


def rope_settings(hf: dict, max_positions: int) -> dict:
    """model.rope_* (and, for yarn, the longer context) for a config.json's RoPE: hf_rope's inverse. A scaling
    whose settings differ from the ones model/rope_scaling.py computes is refused."""
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}  # 4.x name, then 5.x (5.x reads them so)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    base = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return {"rope_base": base}
    if rope_type not in ("linear", "dynamic", "yarn"):
        raise InteropError(f"rope_parameters.rope_type={rope_type!r} is not supported; this repo has default, "
                           f"linear, dynamic and yarn (model/rope_scaling.py)")
    fixed = {"beta_fast": YARN_BETA_FAST, "beta_slow": YARN_BETA_SLOW, "truncate": True} if rope_type == "yarn" else {}
    free = {"rope_type", "type", "rope_theta", "factor"} | ({"original_max_position_embeddings"} if fixed else set())
    for key, value in rope.items():
        if key not in free and (key not in fixed or value != fixed[key]):
            raise InteropError(f"rope_parameters.{key}={value!r} is not supported for rope_type={rope_type!r}")
    settings = {"rope_base": base, "rope_scaling": rope_type, "rope_factor": float(rope.get("factor", 1.0))}
    if rope_type == "yarn":  # L0 below the context it may run at (transformers does not cap positions)
        original = int(rope.get("original_max_position_embeddings") or max_positions)
        settings |= {"rope_original_context": original if original < max_positions else None,
                     "context_length": max(max_positions, original)}
    return settings


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or every shard that model.safetensors.index.json lists."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError) as e:
            raise InteropError(f"corrupt {index}: {e!r}") from None
    elif (hf_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise InteropError(f"{hf_dir} has no model.safetensors or model.safetensors.index.json")
    state = {}
    for file in files:
        try:
            state.update(load_file(hf_dir / file))
        except Exception as e:  # safetensors raises its own error types for missing, truncated or foreign files
            raise InteropError(f"cannot read weights {hf_dir / file}: {e}") from None
    return state


def load_hf_state_dict(model: Transformer, hf_state: dict[str, torch.Tensor], rope_interleave: bool = True) -> None:
    """Copy transformers-named weights into the model, checking that every name and shape matches; rope_interleave:
    DeepseekV3's RoPE pairs are interleaved (deepseek_layout)."""
    names = _weight_names(model)
    # Older transformers saved the RoPE frequencies; ours are recomputed from rope_base. A tied
    # checkpoint may still store lm_head.weight: transformers ignores it, and so do we.
    gpt_oss = gpt_oss_ffn(model) if model.cfg.sinks else {}  # its fused FFN tensors, laid out once
    expected = {hf_name for parts in names.values() for hf_name, _ in parts} | set(gpt_oss)
    # DeepseekV3 without shared experts still holds their [0, d] projections: empty, as ours are absent
    ignored = {n for n in hf_state if n.endswith("rotary_emb.inv_freq") or n == "lm_head.weight"
               or hf_state[n].numel() == 0}
    missing, unexpected = sorted(expected - set(hf_state)), sorted(set(hf_state) - expected - ignored)
    if missing or unexpected:
        raise InteropError(f"weights do not match config.json: missing {missing[:3]}, unexpected {unexpected[:3]}")
    ours = moe_layout(model.state_dict(), model)
    if model.cfg.attention == "mla":
        ours = deepseek_layout(ours, model.cfg)
    state = {}
    for name, parts in names.items():
        state[name] = torch.cat([hf_state[hf_name] for hf_name, _ in parts], dim=0)
        if state[name].shape != ours[name].shape:
            raise InteropError(f"weights do not match config.json: {' + '.join(n for n, _ in parts)} make "
                               f"{list(state[name].shape)}, the config implies {list(ours[name].shape)}")
    if model.cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    if model.cfg.attention == "mla":
        state = repo_layout(state, model.cfg, rope_interleave)
    if model.cfg.sinks:  # gpt-oss's experts are fused tensors of their own
        state |= gpt_oss_ffn_back(model, hf_state, gpt_oss)
    else:
        state = moe_layout(state, model, to_hf=False)
    for i in model.moe_layers():  # the bias of a family that has none (Mixtral, Qwen3-MoE): zeros, as it routes
        state.setdefault(f"blocks.{i}.ffn.bias", torch.zeros(model.cfg.n_experts))
    model.load_state_dict(state)


def load_transformers_dir(hf_dir: Path, config: dict, device: str | torch.device = "cpu") -> Transformer:
    """The model (in eval mode) of a transformers LLaMA, Qwen3 or DeepseekV3 directory whose config.json is `config`:
    model.safetensors or its shards, and tokenizer.model, checked against the vocab size."""
    if not (hf_dir / "tokenizer.model").is_file():
        raise CheckpointError(f"transformers directory {hf_dir} has no tokenizer.model (the SentencePiece model)")
    try:
        cfg = model_config_from_hf(config)
        check_vocab(cfg, hf_dir / "tokenizer.model")
        model = Transformer(cfg)
        load_hf_state_dict(model, read_hf_weights(hf_dir), config.get("rope_interleave", True))
    except (InteropError, ConfigError, CheckpointError) as e:
        raise CheckpointError(f"transformers directory {hf_dir}: {e}") from None
    return model.to(device).eval()


# ---------------------------------------------------------------- tokenizer

# The SentencePiece settings under which a LLaMA tokenizer (transformers' LlamaTokenizer, llama.cpp's "llama"
# tokenizer: BPE merges by score, byte fallback, spaces as U+2581, nothing normalised) encodes as SentencePiece does.
LLAMA_TOKENIZER = {"model_type": "BPE", "byte_fallback": True, "normalization_rule_name": "identity",
                   "remove_extra_whitespaces": False}


def read_tokenizer_proto(tokenizer_file: Path) -> sentencepiece_model_pb2.ModelProto:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(tokenizer_file).read_bytes())
    return proto


def settings_unlike(proto: sentencepiece_model_pb2.ModelProto, wanted: dict) -> list[str]:
    """The tokenizer's settings that differ from `wanted`, as 'name=value'."""
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    settings = {"model_type": sentencepiece_model_pb2.TrainerSpec.ModelType.Name(trainer.model_type),
                "byte_fallback": trainer.byte_fallback, "normalization_rule_name": normalizer.name,
                "remove_extra_whitespaces": normalizer.remove_extra_whitespaces,
                "add_dummy_prefix": normalizer.add_dummy_prefix}
    return [f"{name}={settings[name]!r}" for name, value in wanted.items() if settings[name] != value]


def hf_tokenizer_config(tokenizer_file: Path, context_length: int) -> tuple[dict | None, str]:
    """(tokenizer_config.json, '') when transformers' LlamaTokenizer reproduces this SentencePiece
    model's ids exactly, else (None, why not).

    transformers rebuilds LlamaTokenizer from tokenizer.model as a byte-fallback BPE with no
    normalisation and a fixed whitespace rule, so only a model trained that way, without a dummy
    prefix (add_prefix_space=False), encodes the same: leading spaces otherwise differ.
    """
    proto = read_tokenizer_proto(tokenizer_file)
    trainer = proto.trainer_spec
    unfaithful = settings_unlike(proto, LLAMA_TOKENIZER | {"add_dummy_prefix": False})
    if unfaithful:
        return None, (f"tokenizer.model has {', '.join(unfaithful)}, which transformers' LlamaTokenizer does not "
                      f"reproduce; load it with sentencepiece.SentencePieceProcessor(model_file=...)")
    special = {f"{kind}_token": proto.pieces[i].piece
               for kind, i in (("bos", trainer.bos_id), ("eos", trainer.eos_id), ("unk", trainer.unk_id),
                               ("pad", trainer.pad_id)) if i >= 0}
    return {"tokenizer_class": "LlamaTokenizer", **special,
            # training joins documents as BOS text EOS, so a prompt starts with BOS
            "add_bos_token": trainer.bos_id >= 0, "add_eos_token": False,
            "add_prefix_space": False, "legacy": False, "clean_up_tokenization_spaces": False,
            "model_max_length": context_length}, ""
