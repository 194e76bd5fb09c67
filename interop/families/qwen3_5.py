"""Qwen3.5: Qwen3_5ForCausalLM (model_type qwen3_5_text), the hybrid of Gated DeltaNet layers and gated attention
layers (model=qwen35_tiny): model.linear_pattern N:1 (or alternate), every attention layer with its output gate
(model.attention_gate) and QK-norm, RoPE on model.rotary_fraction of each head (partial_rotary_factor), SwiGLU.

    a linear layer: blocks.i.attn.                 model.layers.i.linear_attn.
        qkv.weight    [(2 H_k + H_v) D, d]         in_proj_qkv.weight (q, k, v: the same order)
        conv.weight   [C, 1, K]                    conv1d.weight
        decay_proj.weight, beta_proj.weight [H_v, d]   in_proj_a.weight, in_proj_b.weight
        gate.weight   [H_v D, d]                   in_proj_z.weight
        A_log, dt_bias [H_v]                       A_log, dt_bias
        norm.weight   [D]                          norm.weight (its gated RMSNorm's gain is plain)
        out.weight    [d, H_v D]                   out_proj.weight
    an attention layer: blocks.i.attn.             model.layers.i.self_attn.
        qkv.weight, gate.weight                    q_proj.weight [H 2D, d], each head's rows [W_q,h; W_g,h]; k_proj,
                                                   v_proj
        qk_norm.{q,k}_norm.weight [D]              q_norm.weight, k_norm.weight: gain - 1
        out.weight                                 o_proj.weight
    blocks.i.{attn,ffn}_norm.weight, final_norm    input_layernorm, post_attention_layernorm, model.norm: gain - 1

Its RMSNorms (not the linear layers' gated one) multiply by (1 + w): a gain g is stored as g - 1, exact for g >= 1/2
and to half a step of its binade below (Qwen3-Next's, interop/families/qwen3_next.py). Its rotary embedding is
multimodal (three position ids per token), which for text, the three alike, is RoPE. transformers runs the delta
rule and the gated norm in float32 whatever the model's dtype.

llama.cpp's qwen35 graph reads the transformers tensors as its own converter writes them:
    every (1 + w) gain      stored whole again (w + 1); the linear layers' gated norm (ssm_norm) as it is
    A_log                   ssm_a = -exp(A_log): the decay's rate, negated
    dt_bias                 ssm_dt.bias
    conv1d.weight [C, 1, K] ssm_conv1d [C, K], kept float32 whatever --dtype
    the value heads         tiled, where there are more value heads than key heads (H_v = r H_k): transformers's
                            value head j reads key head j // r (grouped), llama.cpp's j % H_k (ggml's repeat), so
                            value head k r + v is written at v H_k + k, in every tensor with a row or column per value
                            head (in_proj_qkv's value rows, in_proj_z, in_proj_a, in_proj_b, A_log, dt_bias, conv1d's
                            value channels, out_proj's columns)
and the layers' kinds as qwen35.full_attention_interval (N + 1 for N:1, 2 for alternate). Its RoPE is the
interleaved multimodal one, whose three sections of pairs all turn by the text position: sections that share the
rotated pairs out among them make it RoPE on the first rotary_fraction of each head, as ours.
"""
import gguf
import torch

from interop import InteropError
from interop.families.base import LLAMA_SWITCHES, Family, LlamaCppArch
from interop.families.qwen3_next import attention_layers, gated_query_key_value_names, gated_rows, hybrid_layer_types, \
    hybrid_settings, linear_attention_names, linear_keys, norm_names, partial_rope, refuse_all_linear, ungated_rows
from interop.layout import Names
from model.block import rope_dim
from model.config import ModelConfig
from model.gated_deltanet import L2_EPS, GatedDeltaNet
from model.transformer import Transformer


class Qwen3_5(Family):
    name, model_type, class_name = "Qwen3.5", "qwen3_5_text", "Qwen3_5ForCausalLM"
    # the hybrid's switches: linear layers (any pattern), gated and QK-normed attention, RoPE on any share of a head
    switches = {key: value for key, value in LLAMA_SWITCHES.items() if key not in ("linear_pattern", "rotary_fraction")
                } | {"qk_norm": "rmsnorm", "attention_gate": True, "linear_delta_rule": True}
    fixed = {"hidden_act": "silu", "attention_bias": False}
    default_head_dim = 256
    llama_cpp = LlamaCppArch(gguf.MODEL_ARCH.QWEN35, adjacent_rope=False)
    llama_cpp_float32 = {gguf.MODEL_TENSOR.SSM_CONV1D}  # as llama.cpp's converter keeps it

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.linear_pattern is not None  # with experts, Qwen3-Next's (qwen3_next.py) where it claims them

    def check(self, cfg: ModelConfig, target: str) -> None:
        refuse_all_linear(cfg, target)
        super().check(cfg, target)

    def head_keys(self, cfg: ModelConfig) -> dict:
        return {"num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim} | linear_keys(cfg)

    def window_keys(self, cfg: ModelConfig) -> dict:
        return hybrid_layer_types(cfg)

    def rope_keys(self, cfg: ModelConfig) -> dict:
        return {"partial_rotary_factor": cfg.rotary_fraction}

    def attention_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        if not isinstance(attn, GatedDeltaNet):
            return super().attention_names(attn, cfg, ours, theirs)
        H_v, D = attn.value_heads, attn.head_dim
        return linear_attention_names(attn, cfg, ours, theirs, [
            ("qkv.weight", "in_proj_qkv.weight", attn.qkv.out_features), ("decay_proj.weight", "in_proj_a.weight", H_v),
            ("beta_proj.weight", "in_proj_b.weight", H_v), ("gate.weight", "in_proj_z.weight", H_v * D)])

    def query_key_value_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        return gated_query_key_value_names(cfg, ours, theirs)

    def to_hf(self, state: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
        cfg, out = model.cfg, dict(state)
        for name in norm_names(out, cfg):
            out[name] = out[name] - 1
        for i in attention_layers(model):
            ours = f"blocks.{i}.attn."
            out[ours + "qkv.weight"] = gated_rows(out[ours + "qkv.weight"], out.pop(ours + "gate.weight"), cfg)
        return out

    def from_hf(self, state: dict[str, torch.Tensor], model: Transformer, hf_state: dict[str, torch.Tensor],
                config: dict, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg, out = model.cfg, dict(state)
        for name in norm_names(out, cfg):
            out[name] = out[name] + 1
        for i in attention_layers(model):
            ours = f"blocks.{i}.attn."
            out[ours + "qkv.weight"], out[ours + "gate.weight"] = ungated_rows(out[ours + "qkv.weight"], cfg)
        return out

    def read(self, hf: dict) -> dict:
        """partial_rope's reading; the multimodal RoPE's sections, which text's positions make plain RoPE, dropped."""
        return super().read(hf) | partial_rope(hf, ("partial_rotary_factor", "mrope_section", "mrope_interleaved"))

    def window_settings(self, hf: dict, n_layers: int, context: int) -> dict:
        return {}  # Qwen3.5 has no sliding window; its layer_types are read by attention_settings

    def attention_settings(self, hf: dict) -> dict:
        """The linear layers (layer_types, or every fourth layer attention) and their sizes, the RoPE share."""
        linear = hybrid_settings(hf)
        if not linear:
            raise InteropError(f"layer_types={hf.get('layer_types')} is not supported for {self.name}: this repo "
                               f"reads it as a hybrid, with linear_attention layers")
        return linear | {"rotary_fraction": float(hf["partial_rotary_factor"])}

    # ------------------------------------------------------------ llama.cpp

    def llama_cpp_notes(self, cfg: ModelConfig) -> list[str]:
        if cfg.norm_eps == L2_EPS:
            return []
        return [f"model.norm_eps={cfg.norm_eps}: llama.cpp gives the linear layers' L2 norms of q and k that eps too, "
                f"where this model's have {L2_EPS}; its logits differ from ours by that"]

    def add_llama_cpp_attention(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        writer.add_head_count(cfg.n_heads)
        writer.add_head_count_kv(cfg.n_kv_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_dimension_count(rope_dim(cfg))
        pairs = rope_dim(cfg) // 2  # each section's share: the pairs p with p % 3 == its index
        writer.add_rope_dimension_sections([len(range(section, pairs, 3)) for section in range(3)] + [0])
        writer.add_full_attention_interval(full_attention_interval(cfg))
        writer.add_ssm_conv_kernel(cfg.linear_conv)
        writer.add_ssm_state_size(cfg.linear_dim)
        writer.add_ssm_group_count(cfg.n_linear_key_heads)
        writer.add_ssm_time_step_rank(cfg.n_linear_value_heads)
        writer.add_ssm_inner_size(cfg.n_linear_value_heads * cfg.linear_dim)

    def llama_cpp_tensors(self, hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        H_k, H_v, D = cfg.n_linear_key_heads, cfg.n_linear_value_heads, cfg.linear_dim
        out = {}
        for name, w in hf_state.items():
            if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                w = w + 1
            elif ".linear_attn." in name:
                w = -w.exp() if name.endswith(".A_log") else w.squeeze(1) if name.endswith(".conv1d.weight") else w
                w = value_heads_tiled(name, w, H_k, H_v, D)
            out[name] = w
        return out

    def llama_cpp_name(self, names: gguf.TensorNameMap, hf_name: str) -> tuple[gguf.MODEL_TENSOR, str]:
        if hf_name.endswith(".dt_bias"):  # llama.cpp's ssm_dt, stored as a .bias
            return gguf.MODEL_TENSOR.SSM_DT, names.get_name(hf_name.removesuffix("dt_bias") + "dt_proj") + ".bias"
        return super().llama_cpp_name(names, hf_name)


def full_attention_interval(cfg: ModelConfig) -> int:
    """qwen35.full_attention_interval: llama.cpp's graph makes every interval-th layer attention, the others linear,
    as N:1 (N + 1) and alternate (2) do. Each has an attention layer (ModelConfig refuses one too short to reach it),
    and an all-linear model is refused before (refuse_all_linear)."""
    return cfg.linear_layers.index(False) + 1


def value_heads_tiled(name: str, w: torch.Tensor, H_k: int, H_v: int, D: int) -> torch.Tensor:
    """A linear layer's tensor (transformers' name, llama.cpp's shape) with its value heads from transformers' grouped
    order to llama.cpp's tiled one (the module's docstring); the others as they are."""
    r = H_v // H_k
    if r == 1:
        return w

    def tiled(x: torch.Tensor, dim: int, width: int) -> torch.Tensor:
        grouped = x.unflatten(dim, (H_k, r, width))
        return grouped.transpose(dim, dim + 1).flatten(dim, dim + 2)

    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        qk, v = w.split([2 * H_k * D, H_v * D])
        return torch.cat([qk, tiled(v, 0, D)])
    if name.endswith("in_proj_z.weight"):
        return tiled(w, 0, D)
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", ".A_log", ".dt_bias")):
        return tiled(w, 0, 1)
    if name.endswith("out_proj.weight"):
        return tiled(w, 1, D)
    return w


FAMILY = Qwen3_5()
