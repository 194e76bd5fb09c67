"""Mixtral: MixtralForCausalLM, LLaMA whose every FFN is a mixture of experts under the softmax router (model/moe.py;
E experts of d_e; Mixtral calls the projections w1, w3, w2), with one sliding window in every layer or none:

    blocks.i.ffn.router.weight      [E, d]         block_sparse_moe.gate.weight
    blocks.i.ffn.experts_in.weight  [E 2d_e, d]    rows [W1_e; W3_e] for each e =
                                                   block_sparse_moe.experts.e.{w1,w3}.weight
    blocks.i.ffn.experts_out.weight [E d_e, d]     rows W2_e^T for each e; block_sparse_moe.experts.e.w2.weight is W2_e
                                                   [d, d_e] (layout.moe_layout transposes each)

llama.cpp runs it as its llama graph with experts, whose feed_forward_length is each expert's width: tensors
blk.i.ffn_gate_inp [E, d] and blk.i.ffn_{gate,up,down}_exps [E, out, in] (layout.merged_experts).
"""
import gguf

from interop.families.base import MOE_SWITCHES
from interop.families.llama import Llama
from interop.layout import Experts
from model.config import ModelConfig


class Mixtral(Llama):
    name, model_type, class_name = "Mixtral", "mixtral", "MixtralForCausalLM"
    switches = MOE_SWITCHES | {"qk_norm": "none", "dense_layers": 0}
    fixed = {"hidden_act": "silu", "router_jitter_noise": 0.0}
    experts = Experts("block_sparse_moe", "w1", "w3", "w2")
    reads_windows = every_layer_window = True

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.ffn == "moe" and cfg.router == "softmax" and cfg.qk_norm == "none"

    def window_keys(self, cfg: ModelConfig) -> dict:
        return {"sliding_window": cfg.window}

    def add_llama_cpp_ffn(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        writer.add_feed_forward_length(cfg.expert_width)
        writer.add_expert_count(cfg.n_experts)
        writer.add_expert_used_count(cfg.experts_per_token)


FAMILY = Mixtral()
