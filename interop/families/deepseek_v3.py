"""DeepSeek-V3: DeepseekV3ForCausalLM, llama.cpp's deepseek2 graph. Multi-head latent attention (model.attention=mla,
model/mla.py; q_rank r, latent d_c, RoPE part d_R, values D_v), with a dense SwiGLU at every layer
(first_k_dense_replace = n_layers) or experts under the sigmoid router after model.dense_layers dense blocks:

    blocks.i.attn.q_up.weight   [H(D+d_R), d]   self_attn.q_proj.weight (q_rank null), else
    blocks.i.attn.q_down.weight [r, d]          self_attn.q_a_proj.weight, with q_a_layernorm.weight = q_norm's and
    blocks.i.attn.q_up.weight   [H(D+d_R), r]   self_attn.q_b_proj.weight
    blocks.i.attn.kv_down.weight [d_c+d_R, d]   self_attn.kv_a_proj_with_mqa.weight
    blocks.i.attn.kv_norm.weight [d_c]          self_attn.kv_a_layernorm.weight
    blocks.i.attn.k_up.weight   [H D, d_c]      self_attn.kv_b_proj.weight [H(D+D_v), d_c]: each head's rows
    blocks.i.attn.v_up.weight   [H D_v, d_c]      [W_uk,h; W_uv,h] together (deepseek_layout)
    blocks.i.attn.out.weight    [d, H D_v]      self_attn.o_proj.weight
    blocks.i.ffn.router, experts_in, experts_out   mlp.gate, mlp.experts.e.{gate,up,down}_proj (as Mixtral's)
    blocks.i.ffn.shared.w_in/w_out                 mlp.shared_experts.{gate,up,down}_proj.weight
    blocks.i.ffn.bias               [E]            mlp.gate.e_score_correction_bias (the loss-free balancing bias)

The sigmoid router is DeepSeek's with one group and gates not rescaled (routed_scaling_factor 1); its latents'
norms have eps 1e-6 (model/mla.py). DeepSeek rotates interleaved pairs (x_2i, x_2i+1) (rope_interleave, written true
as DeepSeek's checkpoints have it), this repo half-split ones (x_i, x_i+d_R/2): the rows that make each RoPE part
(q_up's per head, kv_down's last d_R) are reordered at the boundary, so the same pairs rotate by the same frequency
on both sides.

llama.cpp's deepseek2 graph takes DeepseekV3's layout (its RoPE rows already in the adjacent pairs it rotates) and
runs MLA as multi-query attention against the latent (its absorbed form: one K/V head of d_c + d_R, values d_c):
kv_b_proj goes in as attn_k_b, each head's W_uk,h transposed [H, d_c, D], and attn_v_b, each head's W_uv,h
[H, D_v, d_c]; key_length / value_length are the latent's, key_length_mla / value_length_mla a head's. Its MoE blocks
always add shared experts; e_score_correction_bias is blk.i.exp_probs_b.bias. Its graph gives every RMSNorm the one
eps, <arch>.attention.layer_norm_rms_epsilon, where the latents' here is 1e-6: a model with model.norm_eps=1e-6 is
the same model there.
"""
import gguf
import torch

from interop import InteropError
from interop.families.base import LLAMA_SWITCHES, Family, LlamaCppArch
from interop.layout import GATED_PROJECTIONS, Experts, Names, dense_ffn_names, interleaved_pairs
from model.block import rope_dim
from model.config import ModelConfig
from model.mla import LATENT_NORM_EPS
from model.transformer import Transformer

DENSE_SWITCHES = LLAMA_SWITCHES | {"qk_norm": "none"}
SPARSE_SWITCHES = LLAMA_SWITCHES | {"qk_norm": "none", "ffn": "moe", "router": "sigmoid"}
DENSE_FIXED = {"hidden_act": "silu", "attention_bias": False}
SPARSE_FIXED = DENSE_FIXED | {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True}
FIRST_K_DENSE_REPLACE = 3  # DeepseekV3Config's default
# llama.cpp's deepseek2 loader (llama-cpp-python 0.3.36's) takes a full query projection (attn_q, no query latent)
# only at DeepSeek-V2-Lite's depths, which it tells by the layer count; at any other it requires q_lora_rank
FULL_QUERY_DEPTHS = (26, 27)


def rope_rows_in_order(state: dict[str, torch.Tensor], cfg: ModelConfig, order: torch.Tensor) -> dict:
    """An MLA model's weights with each layer's RoPE rows (of every query head, and of the shared key) in `order`."""
    H, D, d_r, d_c = cfg.n_heads, cfg.head_dim, rope_dim(cfg), cfg.kv_rank
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
    order = interleaved_pairs(rope_dim(cfg)) if interleave else torch.arange(rope_dim(cfg))
    out = rope_rows_in_order(state, cfg, order)
    for i in range(cfg.n_layers):
        attn = f"blocks.{i}.attn."
        k_up = out.pop(attn + "k_up.weight").view(cfg.n_heads, cfg.head_dim, cfg.kv_rank)
        v_up = out.pop(attn + "v_up.weight").view(cfg.n_heads, -1, cfg.kv_rank)
        out[attn + "kv_up.weight"] = torch.cat([k_up, v_up], dim=1).flatten(0, 1)
    return out


def repo_layout(state: dict[str, torch.Tensor], cfg: ModelConfig, interleave: bool = True) -> dict:
    """deepseek_layout's inverse: DeepseekV3's weights (under this repo's names) as this repo's model holds them."""
    order = interleaved_pairs(rope_dim(cfg)).argsort() if interleave else torch.arange(rope_dim(cfg))
    out = rope_rows_in_order(state, cfg, order)
    for i in range(cfg.n_layers):
        attn = f"blocks.{i}.attn."
        kv_up = out.pop(attn + "kv_up.weight").view(cfg.n_heads, cfg.head_dim + cfg.value_dim, cfg.kv_rank)
        out[attn + "k_up.weight"] = kv_up[:, :cfg.head_dim].flatten(0, 1)
        out[attn + "v_up.weight"] = kv_up[:, cfg.head_dim:].flatten(0, 1)
    return out


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


class DeepseekV3(Family):
    name, model_type, class_name = "DeepseekV3", "deepseek_v3", "DeepseekV3ForCausalLM"
    experts = Experts("mlp", *GATED_PROJECTIONS)
    n_experts_key, expert_width_key = "n_routed_experts", "moe_intermediate_size"
    llama_cpp = LlamaCppArch(gguf.MODEL_ARCH.DEEPSEEK2, adjacent_rope=False)  # deepseek_layout pairs them already

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.attention == "mla" or cfg.ffn == "moe" and cfg.router == "sigmoid"

    def sparse(self, cfg: ModelConfig) -> bool:
        return cfg.ffn == "moe"

    def switches_for(self, sparse: bool) -> dict:
        return SPARSE_SWITCHES if sparse else DENSE_SWITCHES

    def fixed_for(self, sparse: bool) -> dict:
        return SPARSE_FIXED if sparse else DENSE_FIXED

    def check(self, cfg: ModelConfig, target: str) -> None:
        super().check(cfg, target)
        if cfg.attention != "mla":
            raise InteropError(f"no {target} equivalent for model.router=sigmoid with model.attention={cfg.attention}: "
                               f"the sigmoid router's family, DeepseekV3, has multi-head latent attention "
                               f"(attention=mla)")

    def head_keys(self, cfg: ModelConfig) -> dict:
        return {"num_key_value_heads": cfg.n_heads, "kv_lora_rank": cfg.kv_rank, "q_lora_rank": cfg.q_rank,
                "qk_nope_head_dim": cfg.head_dim, "qk_rope_head_dim": rope_dim(cfg), "v_head_dim": cfg.value_dim,
                "rope_interleave": True, "first_k_dense_replace": cfg.n_layers}  # every FFN dense, unless experts

    def expert_keys(self, cfg: ModelConfig) -> dict:
        if not self.sparse(cfg):
            return {}
        return super().expert_keys(cfg) | {"first_k_dense_replace": cfg.dense_layers,
                                           "n_shared_experts": cfg.n_shared_experts}

    def query_key_value_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        """One MLA layer's names, in deepseek_layout's terms (its kv_up is k_up and v_up, head by head)."""
        query_rows = cfg.n_heads * (cfg.head_dim + rope_dim(cfg))
        if cfg.q_rank is None:
            names = {ours + "q_up.weight": [(theirs + "q_proj.weight", query_rows)]}
        else:
            names = {ours + "q_down.weight": [(theirs + "q_a_proj.weight", cfg.q_rank)],
                     ours + "q_norm.weight": [(theirs + "q_a_layernorm.weight", cfg.q_rank)],
                     ours + "q_up.weight": [(theirs + "q_b_proj.weight", query_rows)]}
        return names | {
            ours + "kv_down.weight": [(theirs + "kv_a_proj_with_mqa.weight", cfg.kv_rank + rope_dim(cfg))],
            ours + "kv_norm.weight": [(theirs + "kv_a_layernorm.weight", cfg.kv_rank)],
            ours + "kv_up.weight": [(theirs + "kv_b_proj.weight", cfg.n_heads * (cfg.head_dim + cfg.value_dim))]}

    def ffn_names(self, ffn: torch.nn.Module, sparse: bool, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        """Mixtral's layout under mlp., with the balancing bias and the shared experts if any."""
        names = super().ffn_names(ffn, sparse, cfg, ours, theirs)
        if sparse:
            names[ours + "bias"] = [(theirs + "mlp.gate.e_score_correction_bias", ffn.n_experts)]
            if ffn.shared is not None:
                names |= dense_ffn_names(ffn.shared, ours + "shared.", theirs + "mlp.shared_experts.", cfg.d_model)
        return names

    def to_hf(self, state: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
        return deepseek_layout(super().to_hf(state, model), model.cfg)

    def from_hf(self, state: dict[str, torch.Tensor], model: Transformer, hf_state: dict[str, torch.Tensor],
                config: dict, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = repo_layout(state, model.cfg, config.get("rope_interleave", True))
        return super().from_hf(state, model, hf_state, config, extra)

    def sparse_config(self, hf: dict) -> bool:
        return hf.get("first_k_dense_replace", FIRST_K_DENSE_REPLACE) < hf.get("num_hidden_layers", 0)

    def attention_settings(self, hf: dict) -> dict:
        """model.kv_rank, q_rank, rope_head_dim and v_head_dim (and the head dim, qk_nope_head_dim)."""
        try:
            head_dim, value_dim = hf["qk_nope_head_dim"], hf["v_head_dim"]
            return {"kv_rank": hf["kv_lora_rank"], "q_rank": hf.get("q_lora_rank"), "head_dim": head_dim,
                    "rope_head_dim": hf["qk_rope_head_dim"], "v_head_dim": None if value_dim == head_dim else value_dim,
                    "n_kv_heads": hf["num_attention_heads"]}
        except KeyError as e:
            raise InteropError(f"config.json has no {e.args[0]}") from None

    def expert_settings(self, hf: dict) -> dict:
        return super().expert_settings(hf) | {
            "dense_layers": hf.get("first_k_dense_replace", FIRST_K_DENSE_REPLACE),
            "n_shared_experts": hf.get("n_shared_experts", 1)}

    def check_llama_cpp(self, cfg: ModelConfig) -> None:
        if cfg.ffn == "moe" and not cfg.n_shared_experts:
            raise InteropError("model.n_shared_experts=0 has no llama.cpp deepseek2 equivalent: its MoE blocks always "
                               "add shared experts")
        if cfg.q_rank is None and cfg.n_layers not in FULL_QUERY_DEPTHS:
            raise InteropError(f"model.q_rank=null with model.n_layers={cfg.n_layers} has no llama.cpp deepseek2 "
                               f"equivalent: llama.cpp reads a full query projection only at DeepSeek-V2-Lite's "
                               f"{' or '.join(map(str, FULL_QUERY_DEPTHS))} layers; give MLA a query latent "
                               f"(model.q_rank)")
        if cfg.rope_scaling in ("linear", "yarn"):  # ntk is only a larger base: it maps
            raise InteropError(f"model.rope_scaling={cfg.rope_scaling} with attention=mla has no llama.cpp deepseek2 "
                               f"equivalent here: its graph moves the RoPE part's scale into the attention's "
                               f"(DeepSeek's mscale), where model/positions.py scales the rotated dims")
        super().check_llama_cpp(cfg)

    def llama_cpp_notes(self, cfg: ModelConfig) -> list[str]:
        if cfg.norm_eps == LATENT_NORM_EPS:
            return []
        return [f"model.norm_eps={cfg.norm_eps}: llama.cpp gives the latents' RMSNorms that eps too, where this "
                f"model's have {LATENT_NORM_EPS}; its logits differ from ours by that"]

    def llama_cpp_tensors(self, hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        return latent_up_projections(hf_state, cfg)

    def llama_cpp_name(self, names: gguf.TensorNameMap, hf_name: str) -> tuple[gguf.MODEL_TENSOR, str]:
        if hf_name.endswith(".gate.e_score_correction_bias"):  # llama.cpp's exp_probs_b, stored as a .bias
            return gguf.MODEL_TENSOR.FFN_EXP_PROBS_B, names.get_name(hf_name.removesuffix("_bias")) + ".bias"
        return super().llama_cpp_name(names, hf_name)

    def add_llama_cpp_ffn(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        """A dense deepseek2 is every block dense, with no shared experts; its loader reads the experts' width even
        then. Experts: E and k, sigmoid gates renormalised and not rescaled, one group."""
        moe = cfg.ffn == "moe"
        writer.add_feed_forward_length(cfg.ffn_width)
        if moe:
            writer.add_expert_count(cfg.n_experts)
            writer.add_expert_used_count(cfg.experts_per_token)
        writer.add_expert_feed_forward_length(cfg.expert_width if moe else cfg.ffn_width)
        writer.add_leading_dense_block_count(cfg.dense_layers if moe else cfg.n_layers)
        writer.add_expert_shared_count(cfg.n_shared_experts if moe else 0)
        if moe:
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
            writer.add_expert_weights_norm(True)
            writer.add_expert_weights_scale(1.0)
            writer.add_expert_group_count(1)
            writer.add_expert_group_used_count(1)

    def add_llama_cpp_attention(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        """MLA as llama.cpp runs it: one K/V head of the latent (d_c + d_R keys, d_c values), a head's sizes as
        *_mla."""
        writer.add_head_count(cfg.n_heads)
        writer.add_head_count_kv(1)
        writer.add_rope_dimension_count(rope_dim(cfg))
        if cfg.q_rank is not None:
            writer.add_q_lora_rank(cfg.q_rank)
        writer.add_kv_lora_rank(cfg.kv_rank)
        writer.add_key_length(cfg.kv_rank + rope_dim(cfg))
        writer.add_value_length(cfg.kv_rank)
        writer.add_key_length_mla(cfg.head_dim + rope_dim(cfg))
        writer.add_value_length_mla(cfg.value_dim)


FAMILY = DeepseekV3()
