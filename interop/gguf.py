"""The GGUF file that llama.cpp runs: this repo's model in the llama.cpp graph of its family (families/: llama for
LLaMA and Mixtral, qwen3, qwen3moe, deepseek2 for DeepSeek-V3, qwen35 for the Gated DeltaNet hybrid), its
SentencePiece tokenizer inside (tokenizer.py).

    metadata  <arch>.*           context, embedding and feed-forward lengths, blocks, heads, K/V heads,
                                 RoPE base, dimension count and scaling, RMSNorm eps, vocabulary size; the family
                                 writes its FFN's, attention's and RoPE's keys (add_llama_cpp_*)
              tokenizer.ggml.*   model "llama", every piece with its score and type, bos/eos/unk/pad ids
    tensors   our weights -> transformers' names (hf.hf_state_dict: the one split of our stacked matrices, with the
              family's layouts) -> llama.cpp's names (the gguf package's TensorNameMap for the graph):
                  model.embed_tokens          token_embd    [V, d]
                  layers.i.input_layernorm    blk.i.attn_norm
                  self_attn.{q,k,v,o}_proj    blk.i.attn_q, attn_k, attn_v, attn_output
                  self_attn.{q,k}_norm        blk.i.attn_q_norm, attn_k_norm   [D] (qwen3, qwen3moe)
                  post_attention_layernorm    blk.i.ffn_norm
                  mlp.{gate,up,down}_proj     blk.i.ffn_gate, ffn_up, ffn_down
                  model.norm, lm_head         output_norm, output (absent when tied: llama.cpp reuses token_embd)
                  mlp.gate (block_sparse_moe.gate)        blk.i.ffn_gate_inp    [E, d]
                  experts.e.{gate,up,down}_proj, stacked  blk.i.ffn_{gate,up,down}_exps   [E, out, in] (merged_experts)
                  mlp.shared_experts.*                    blk.i.ffn_{gate,up,down}_shexp
              each stored as torch's [out, in] (GGUF lists dims innermost first; the writer reverses them).

RoPE: this repo and transformers rotate the pairs (i, i + D/2) of each head (half-split); a graph that rotates the
adjacent pairs (2i, 2i + 1) (the family's llama_cpp.adjacent_rope: llama's) gets the rows of attn_q and attn_k
reordered within each head,
    new row 2i + j  <-  old row j * D/2 + i       (i = 0 .. D/2 - 1, j = 0, 1)
which gives llama.cpp the same rotated q and k up to one shared permutation of their dims, so the same q . k.

--dtype: f32 writes every tensor as float32; f16 and q8_0 convert the matrices and keep the 1-D norm weights
float32, as llama.cpp's own converter does (and the tensors a family's graph reads as float32 only, its
llama_cpp_float32: the Gated DeltaNet's conv). q8_0 stores blocks of 32 consecutive weights of a row as 32 int8
and one f16 scale (max |w| / 127): 34 bytes per 32 weights. A matrix whose rows are not whole blocks stays f16.
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from interop import InteropError
from interop.families import family_of
from interop.families.base import Family
from interop.hf import hf_state_dict
from interop.layout import interleaved_pairs, merged_experts
from interop.tokenizer import LLAMA_TOKENIZER, add_gguf_tokenizer, read_tokenizer_proto, settings_unlike
from model.transformer import Transformer
from storage.files import atomic_file, writing

Q = gguf.GGMLQuantizationType
# --dtype -> the matrices' type, and the file type recorded in general.file_type
DTYPES = {"f32": (Q.F32, gguf.LlamaFileType.ALL_F32), "f16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
          "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}


def adjacent_rope_pairs(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q or k rows [n_heads * D, d] in the half-split order -> llama.cpp's adjacent-pair order, head by head."""
    return w.view(n_heads, -1, w.shape[1])[:, interleaved_pairs(w.shape[0] // n_heads)].reshape(w.shape)


def gguf_tensors(model: Transformer, family: Family,
                 dtype: str) -> tuple[list[tuple[str, np.ndarray, Q]], list[str]]:
    """(llama.cpp name, the data as stored, its type) per tensor, and a note for each matrix kept wider than dtype."""
    cfg, target = model.cfg, family.llama_cpp
    names = gguf.get_tensor_name_map(target.arch, cfg.n_layers)
    rope_heads = ({gguf.MODEL_TENSOR.ATTN_Q: cfg.n_heads, gguf.MODEL_TENSOR.ATTN_K: cfg.n_kv_heads}
                  if target.adjacent_rope else {})
    tensors, notes = [], []
    for hf_name, w in merged_experts(family.llama_cpp_tensors(hf_state_dict(model), cfg)).items():
        kind, name = family.llama_cpp_name(names, hf_name)
        if kind in rope_heads:
            w = adjacent_rope_pairs(w, rope_heads[kind])
        qtype = Q.F32 if w.dim() == 1 or kind in family.llama_cpp_float32 else DTYPES[dtype][0]
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if w.shape[-1] % block:
            notes.append(f"{name} stays f16: its rows of {w.shape[-1]} are not whole {qtype.name} blocks of {block}")
            qtype = Q.F16
        tensors.append((name, gguf.quantize(w.float().numpy(), qtype), qtype))
    return tensors, notes


def write_gguf(model: Transformer, tokenizer_file: Path, path: Path, dtype: str = "f32") -> list[str]:
    """Writes the GGUF file atomically; refuses a model whose family llama.cpp has no graph for, or that its graph
    cannot run. Returns notes for the user."""
    cfg = model.cfg
    family = family_of(cfg)
    if family.llama_cpp is None:  # first: check would name the family's switches, which would not make it exportable
        raise InteropError(family.no_llama_cpp)
    family.check(cfg, "llama.cpp")
    if cfg.window is not None:
        raise InteropError(f"model.window={cfg.window} has no llama.cpp export here: its llama, qwen3 and qwen3moe "
                           f"graphs attend to every earlier position")
    family.check_llama_cpp(cfg)
    tensors, notes = gguf_tensors(model, family, dtype)
    notes += family.llama_cpp_notes(cfg)
    proto = read_tokenizer_proto(tokenizer_file)
    if unlike := settings_unlike(proto, LLAMA_TOKENIZER):
        notes.append(f"tokenizer.model has {', '.join(unlike)}: llama.cpp's tokenizer may split text differently")
    with writing(path), atomic_file(path) as tmp:  # a full disk: one error line naming the file
        writer = gguf.GGUFWriter(tmp, family.llama_cpp.name)  # the prefix of the model keys below: llama.*, ...
        try:
            writer.add_name("nanollama")
            writer.add_file_type(DTYPES[dtype][1])
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            writer.add_vocab_size(cfg.vocab_size)
            writer.add_context_length(cfg.context_length)
            writer.add_embedding_length(cfg.d_model)
            writer.add_block_count(cfg.n_layers)
            family.add_llama_cpp_ffn(writer, cfg)
            family.add_llama_cpp_attention(writer, cfg)
            family.add_llama_cpp_rope(writer, cfg)
            writer.add_layer_norm_rms_eps(cfg.norm_eps)
            add_gguf_tokenizer(writer, proto)
            for name, data, qtype in tensors:
                writer.add_tensor(name, data, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return notes
