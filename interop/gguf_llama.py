"""The GGUF file that llama.cpp runs: this repo's LLaMA in llama.cpp's LLaMA layout (with QK-norm: its Qwen3 layout;
with multi-head latent attention: its deepseek2 layout; with experts: llama's, qwen3moe's or deepseek2's MoE
layout), its SentencePiece tokenizer inside.

    metadata  <arch>.*           context, embedding and feed-forward lengths, blocks, heads, K/V heads,
                                 RoPE base, dimension count and scaling (add_rope), RMSNorm eps, vocabulary size;
                                 <arch> is llama, or qwen3 for model.qk_norm=rmsnorm (LLAMA_CPP_ARCHS)
              tokenizer.ggml.*   model "llama", every piece with its score and type, bos/eos/unk/pad ids
    tensors   our weights -> transformers' names (hf_llama.hf_state_dict: the one split of our stacked
              matrices) -> llama.cpp's names (the gguf package's TensorNameMap for the architecture):
                  model.embed_tokens          token_embd    [V, d]
                  layers.i.input_layernorm    blk.i.attn_norm
                  self_attn.{q,k,v,o}_proj    blk.i.attn_q, attn_k, attn_v, attn_output
                  self_attn.{q,k}_norm        blk.i.attn_q_norm, attn_k_norm   [D] (qwen3 only)
                  post_attention_layernorm    blk.i.ffn_norm
                  mlp.{gate,up,down}_proj     blk.i.ffn_gate, ffn_up, ffn_down
                  model.norm, lm_head         output_norm, output (absent when tied: llama.cpp reuses token_embd)
              each stored as torch's [out, in] (GGUF lists dims innermost first; the writer reverses them).

RoPE: this repo and transformers rotate the pairs (i, i + D/2) of each head (half-split); llama.cpp's llama
graph rotates the adjacent pairs (2i, 2i + 1). Reordering the rows of attn_q and attn_k within each head,
    new row 2i + j  <-  old row j * D/2 + i       (i = 0 .. D/2 - 1, j = 0, 1)
gives llama.cpp the same rotated q and k up to one shared permutation of their dims, so the same q . k.
llama.cpp's qwen3 graph rotates the half-split pairs itself (its "NEOX" RoPE), so there the rows stay as they are,
and so do the q/k norm gains, which a reordering of q's and k's dims would have to follow.

deepseek2 (model.attention=mla) starts from transformers' DeepseekV3 layout (hf_llama.deepseek_layout), whose RoPE
rows are already in adjacent pairs, the pairs llama.cpp's deepseek2 graph rotates. llama.cpp runs MLA as
multi-query attention against the latent (its absorbed form: one K/V head of d_c + d_R, values d_c): kv_b_proj
goes in as attn_k_b, each head's W_uk,h transposed [H, d_c, D], and attn_v_b, each head's W_uv,h [H, D_v, d_c];
key_length / value_length are the latent's, key_length_mla / value_length_mla a head's. Every block is dense
(leading_dense_block_count = blocks). llama.cpp's graph gives every RMSNorm the one eps,
<arch>.attention.layer_norm_rms_epsilon, where the latents' here is 1e-6: a model with model.norm_eps=1e-6 is
the same model there.

ffn=moe: Mixtral (the softmax router, qk_norm=none) is llama.cpp's llama graph with experts, whose
feed_forward_length is each expert's width; Qwen3-MoE (with QK-norm) its qwen3moe graph, experts in every block;
DeepseekV3 (MLA, the sigmoid router) its deepseek2 graph with experts after leading_dense_block_count, shared
experts (which that graph always adds), sigmoid gating renormalised and not rescaled, one group. Tensors:
                  mlp.gate (block_sparse_moe.gate)        blk.i.ffn_gate_inp    [E, d]
                  experts.e.{gate,up,down}_proj, stacked  blk.i.ffn_{gate,up,down}_exps   [E, out, in] (merged_experts)
                  mlp.shared_experts.*                    blk.i.ffn_{gate,up,down}_shexp
                  mlp.gate.e_score_correction_bias        blk.i.exp_probs_b.bias   [E]  (the loss-free bias)

--dtype: f32 writes every tensor as float32; f16 and q8_0 convert the matrices and keep the 1-D norm weights
float32, as llama.cpp's own converter does. q8_0 stores blocks of 32 consecutive weights of a row as 32 int8
and one f16 scale (max |w| / 127): 34 bytes per 32 weights. A matrix whose rows are not whole blocks stays f16.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from sentencepiece import sentencepiece_model_pb2

from interop.hf_llama import (LLAMA_TOKENIZER, InteropError, check_exportable, hf_state_dict, interleaved_pairs,
                               read_tokenizer_proto, settings_unlike)
from model.config import ModelConfig
from model.mla import LATENT_NORM_EPS
from model.rope_scaling import YARN_BETA_FAST, YARN_BETA_SLOW, ntk_base
from model.transformer import Transformer
from storage.files import atomic_file, writing


@dataclass(frozen=True)
class LlamaCppArch:
    """One of llama.cpp's architectures, and how its graph rotates q and k."""
    arch: gguf.MODEL_ARCH
    adjacent_rope: bool  # its graph rotates the dims (2i, 2i + 1) of a head, where ours rotates (i, i + D/2)

    @property
    def name(self) -> str:  # general.architecture, and the prefix of the model's keys
        return gguf.MODEL_ARCH_NAMES[self.arch]


# model.qk_norm -> llama.cpp's architecture: its llama graph has no q/k norms, its qwen3 graph is llama's with them
LLAMA_CPP_ARCHS = {"none": LlamaCppArch(gguf.MODEL_ARCH.LLAMA, adjacent_rope=True),
                   "rmsnorm": LlamaCppArch(gguf.MODEL_ARCH.QWEN3, adjacent_rope=False)}
# adjacent pairs too, but hf_state_dict's DeepseekV3 layout already has them so: nothing to reorder here
DEEPSEEK2 = LlamaCppArch(gguf.MODEL_ARCH.DEEPSEEK2, adjacent_rope=False)
# ffn=moe with QK-norm (Qwen3-MoE): its qwen3moe graph, qwen3's with experts in every block. Without QK-norm
# (Mixtral) it is the llama graph with experts; with MLA (DeepseekV3) the deepseek2 graph with experts.
QWEN3MOE = LlamaCppArch(gguf.MODEL_ARCH.QWEN3MOE, adjacent_rope=False)


def llama_cpp_arch(cfg: ModelConfig) -> LlamaCppArch:
    if cfg.attention == "mla":
        return DEEPSEEK2
    return QWEN3MOE if cfg.ffn == "moe" and cfg.qk_norm == "rmsnorm" else LLAMA_CPP_ARCHS[cfg.qk_norm]
Q = gguf.GGMLQuantizationType
# --dtype -> the matrices' type, and the file type recorded in general.file_type
DTYPES = {"f32": (Q.F32, gguf.LlamaFileType.ALL_F32), "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
          "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}


def adjacent_rope_pairs(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q or k rows [n_heads * D, d] in the half-split order -> llama.cpp's adjacent-pair order, head by head."""
    return w.view(n_heads, -1, w.shape[1])[:, interleaved_pairs(w.shape[0] // n_heads)].reshape(w.shape)


def gguf_tensors(model: Transformer, target: LlamaCppArch,
                 dtype: str) -> tuple[list[tuple[str, np.ndarray, Q]], list[str]]:
    """(llama.cpp name, the data as stored, its type) per tensor, and a note for each matrix kept wider than dtype."""
    cfg = model.cfg
    names = gguf.get_tensor_name_map(target.arch, cfg.n_layers)
    rope_heads = ({gguf.MODEL_TENSOR.ATTN_Q: cfg.n_heads, gguf.MODEL_TENSOR.ATTN_K: cfg.n_kv_heads}
                  if target.adjacent_rope else {})
    tensors, notes = [], []
    for hf_name, w in merged_experts(latent_up_projections(hf_state_dict(model), cfg)).items():
        if hf_name.endswith(".gate.e_score_correction_bias"):  # llama.cpp's exp_probs_b, stored as a .bias
            kind, name = gguf.MODEL_TENSOR.FFN_EXP_PROBS_B, names.get_name(hf_name.removesuffix("_bias")) + ".bias"
        else:
            kind, name = names.get_type_and_name(hf_name, try_suffixes=(".weight",))
        if kind in rope_heads:
            w = adjacent_rope_pairs(w, rope_heads[kind])
        qtype = Q.F32 if w.dim() == 1 else DTYPES[dtype][0]
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if w.shape[-1] % block:
            notes.append(f"{name} stays f16: its rows of {w.shape[-1]} are not whole {qtype.name} blocks of {block}")
            qtype = Q.F16
        tensors.append((name, gguf.quantize(w.float().numpy(), qtype), qtype))
    return tensors, notes


def latent_up_projections(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """DeepseekV3's kv_b_proj [H (D + D_v), d_c] of each layer as llama.cpp's deepseek2 reads it: k_b_proj, each head's
    W_uk,h transposed [H, d_c, D], and v_b_proj, each head's W_uv,h [H, D_v, d_c]. Other weights as they are."""
    out = {}
    for name, w in hf_state.items():
        if name.endswith("kv_b_proj.weight"):
            per_head = w.view(cfg.n_heads, cfg.head_dim + cfg.value_dim, cfg.kv_rank)
            out[name.replace("kv_b_proj", "k_b_proj")] = per_head[:, :cfg.head_dim].transpose(1, 2).contiguous()
            out[name.replace("kv_b_proj", "v_b_proj")] = per_head[:, cfg.head_dim:].contiguous()
        else:
            out[name] = w
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


def check_experts(cfg: ModelConfig, target: LlamaCppArch) -> None:
    """The MoE graphs' limits: qwen3moe has experts in every block, deepseek2's MoE blocks always add shared ones."""
    if cfg.ffn != "moe":
        return
    if target == QWEN3MOE and cfg.dense_layers:
        raise InteropError(f"model.dense_layers={cfg.dense_layers} has no llama.cpp qwen3moe equivalent: its graph "
                           f"has experts in every block")
    if target == DEEPSEEK2 and not cfg.n_shared_experts:
        raise InteropError("model.n_shared_experts=0 has no llama.cpp deepseek2 equivalent: its MoE blocks always "
                           "add shared experts")


def add_experts(writer: gguf.GGUFWriter, cfg: ModelConfig, target: LlamaCppArch) -> None:
    """The FFN's keys: feed_forward_length (llama's MoE graph reads it as each expert's width), and for an MoE its E
    and k, the experts' width, and deepseek2's dense blocks, shared experts and sigmoid gates renormalised and not
    rescaled. A dense deepseek2 is every block dense, with no shared experts."""
    moe = cfg.ffn == "moe"
    writer.add_feed_forward_length(cfg.expert_width if moe and target.arch == gguf.MODEL_ARCH.LLAMA else cfg.ffn_width)
    if moe:
        writer.add_expert_count(cfg.n_experts)
        writer.add_expert_used_count(cfg.experts_per_token)
    if target == QWEN3MOE or target == DEEPSEEK2:
        # read by llama.cpp's deepseek2 loader even when no block has experts
        writer.add_expert_feed_forward_length(cfg.expert_width if moe else cfg.ffn_width)
    if target == DEEPSEEK2:
        writer.add_leading_dense_block_count(cfg.dense_layers if moe else cfg.n_layers)
        writer.add_expert_shared_count(cfg.n_shared_experts if moe else 0)
    if target == DEEPSEEK2 and moe:
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        writer.add_expert_weights_norm(True)
        writer.add_expert_weights_scale(1.0)
        writer.add_expert_group_count(1)
        writer.add_expert_group_used_count(1)


def add_attention(writer: gguf.GGUFWriter, cfg: ModelConfig, target: LlamaCppArch) -> None:
    """The heads' keys: K/V heads of head_dim for llama and qwen3 (qwen3moe with the head dim written out, which
    transformers' GGUF loader reads there); for deepseek2, MLA as llama.cpp runs it, one K/V head of the latent
    (d_c + d_R keys, d_c values), the per-head sizes as *_mla."""
    writer.add_head_count(cfg.n_heads)
    if cfg.attention != "mla":
        writer.add_head_count_kv(cfg.n_kv_heads)
        writer.add_rope_dimension_count(cfg.head_dim)
        if target == QWEN3MOE:
            writer.add_key_length(cfg.head_dim)
            writer.add_value_length(cfg.head_dim)
        return
    writer.add_head_count_kv(1)
    writer.add_rope_dimension_count(cfg.rope_dim)
    if cfg.q_rank is not None:
        writer.add_q_lora_rank(cfg.q_rank)
    writer.add_kv_lora_rank(cfg.kv_rank)
    writer.add_key_length(cfg.kv_rank + cfg.rope_dim)
    writer.add_value_length(cfg.kv_rank)
    writer.add_key_length_mla(cfg.head_dim + cfg.rope_dim)
    writer.add_value_length_mla(cfg.value_dim)


def add_tokenizer(writer: gguf.GGUFWriter, proto: sentencepiece_model_pb2.ModelProto) -> None:
    """The SentencePiece model as llama.cpp's "llama" tokenizer: pieces, scores and types as they are in it."""
    piece_type = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([p.piece.encode() for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([gguf.TokenType[piece_type.Name(p.type)] for p in proto.pieces])  # the same six names
    trainer = proto.trainer_spec
    for add_id, i in ((writer.add_bos_token_id, trainer.bos_id), (writer.add_eos_token_id, trainer.eos_id),
                      (writer.add_unk_token_id, trainer.unk_id), (writer.add_pad_token_id, trainer.pad_id)):
        if i >= 0:  # SentencePiece's -1: the tokenizer has no such piece
            add_id(i)
    # training joins documents as BOS text EOS, so a prompt starts with BOS (generate.py's too)
    writer.add_add_bos_token(trainer.bos_id >= 0)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)


# llama.cpp's deepseek2 loader (llama-cpp-python 0.3.36's) takes a full query projection (attn_q, no query latent)
# only at DeepSeek-V2-Lite's depths, which it tells by the layer count; at any other it requires q_lora_rank
FULL_QUERY_DEPTHS = (26, 27)


def check_latent_query(cfg: ModelConfig) -> None:
    if cfg.attention == "mla" and cfg.q_rank is None and cfg.n_layers not in FULL_QUERY_DEPTHS:
        raise InteropError(f"model.q_rank=null with model.n_layers={cfg.n_layers} has no llama.cpp deepseek2 "
                           f"equivalent: llama.cpp reads a full query projection only at DeepSeek-V2-Lite's "
                           f"{' or '.join(map(str, FULL_QUERY_DEPTHS))} layers; give MLA a query latent (model.q_rank)")


def check_rope_scaling(cfg: ModelConfig, target: LlamaCppArch) -> None:
    if target == DEEPSEEK2 and cfg.rope_scaling in ("linear", "yarn"):  # ntk is only a larger base: it maps
        raise InteropError(f"model.rope_scaling={cfg.rope_scaling} with attention=mla has no llama.cpp deepseek2 "
                           f"equivalent here: its graph moves the RoPE part's scale into the attention's (DeepSeek's "
                           f"mscale), where model/positions.py scales the rotated dims")
    if cfg.rope_scaling == "dynamic":
        raise InteropError(f"model.rope_scaling=dynamic has no GGUF counterpart: {target.name}.rope.scaling.type is "
                           f"none, linear, yarn or longrope, each with fixed frequencies")


def add_rope(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """RoPE's base and scaling as llama.cpp reads them: ntk is a larger <arch>.rope.freq_base, linear and yarn are
    <arch>.rope.scaling.* (yarn with its original context and betas; llama.cpp derives the attention factor
    0.1 ln s + 1 itself); finetuned says whether the weights were trained under the scaling."""
    ntk = cfg.rope_scaling == "ntk"
    writer.add_rope_freq_base(ntk_base(cfg.rope_base, cfg.rope_factor, cfg.rope_dim) if ntk else cfg.rope_base)
    if cfg.rope_scaling not in ("linear", "yarn"):
        return
    writer.add_rope_scaling_type(gguf.RopeScalingType(cfg.rope_scaling))
    writer.add_rope_scaling_factor(cfg.rope_factor)
    writer.add_rope_scaling_orig_ctx_len(cfg.original_context)
    writer.add_rope_scaling_finetuned(cfg.context_length > cfg.original_context)
    if cfg.rope_scaling == "yarn":
        writer.add_rope_scaling_yarn_beta_fast(YARN_BETA_FAST)
        writer.add_rope_scaling_yarn_beta_slow(YARN_BETA_SLOW)


def write_gguf(model: Transformer, tokenizer_file: Path, path: Path, dtype: str = "f32") -> list[str]:
    """Writes the GGUF file atomically; refuses a model that is not a LLaMA, a Qwen3 or a DeepSeek-V3, or a Mixtral,
    Qwen3-MoE or DeepSeek-V3 with experts, that llama.cpp runs. Returns notes for the user."""
    cfg = model.cfg
    if cfg.sinks:  # first: check_exportable would name gpt-oss's switches, which would not make it exportable here
        raise InteropError("model.sinks=true has no llama.cpp export here: llama.cpp's graph with sink logits, "
                           "gpt-oss's, clamps its experts' SwiGLU at 7 with alpha 1.702 fixed in its code, which this "
                           "repo's SwiGLU cannot be written into exactly (the transformers export writes gpt-oss)")
    check_exportable(cfg, "llama.cpp")
    if cfg.window is not None:
        raise InteropError(f"model.window={cfg.window} has no llama.cpp export here: its llama, qwen3 and qwen3moe "
                           f"graphs attend to every earlier position")
    target = llama_cpp_arch(cfg)
    check_experts(cfg, target)
    check_latent_query(cfg)
    check_rope_scaling(cfg, target)
    tensors, notes = gguf_tensors(model, target, dtype)
    if target == DEEPSEEK2 and cfg.norm_eps != LATENT_NORM_EPS:  # llama.cpp has one eps for every RMSNorm
        notes.append(f"model.norm_eps={cfg.norm_eps}: llama.cpp gives the latents' RMSNorms that eps too, where "
                     f"this model's have {LATENT_NORM_EPS}; its logits differ from ours by that")
    proto = read_tokenizer_proto(tokenizer_file)
    if unlike := settings_unlike(proto, LLAMA_TOKENIZER):
        notes.append(f"tokenizer.model has {', '.join(unlike)}: llama.cpp's tokenizer may split text differently")
    with writing(path), atomic_file(path) as tmp:  # a full disk: one error line naming the file
        writer = gguf.GGUFWriter(tmp, target.name)  # the prefix of the model keys below: llama.*, qwen3.*, ...
        try:
            writer.add_name("nanollama")
            writer.add_file_type(DTYPES[dtype][1])
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            writer.add_vocab_size(cfg.vocab_size)
            writer.add_context_length(cfg.context_length)
            writer.add_embedding_length(cfg.d_model)
            writer.add_block_count(cfg.n_layers)
            add_experts(writer, cfg, target)
            add_attention(writer, cfg, target)
            add_rope(writer, cfg)
            writer.add_layer_norm_rms_eps(cfg.norm_eps)
            add_tokenizer(writer, proto)
            for name, data, qtype in tensors:
                writer.add_tensor(name, data, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return notes
