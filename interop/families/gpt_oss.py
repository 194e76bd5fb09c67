"""gpt-oss: GptOssForCausalLM. LLaMA's attention with a learned sink logit per head (model.sinks), and experts under
the softmax router (top-k, then a softmax over the k: our renormalised gates) in every block; a dense SwiGLU is one
expert, always chosen. Windows where layer_types says (its config's default: every other layer from the first).

    blocks.i.attn.sinks             [H]            model.layers.i.self_attn.sinks
    blocks.i.ffn.router.weight      [E, d]         mlp.router.weight (a dense SwiGLU: one expert, zeros [1, d])
    experts_in [E 2d_e, d], experts_out [E d_e, d]  mlp.experts.gate_up_proj [E, d, 2d_e] (W1_e's columns at the
    (a dense SwiGLU: w_in, w_out, E = 1)             even places, W3_e's at the odd), down_proj [E, d_e, d]
    (none)                                          mlp.experts.{gate_up,down}_proj_bias, mlp.router.bias (fused_ffn)

Its experts' SwiGLU is (up + 1) * gate * sigmoid(alpha * gate), gate and up clamped at swiglu_limit, with biases:
ours is theirs at alpha 1, a limit no float32 reaches, up's bias -1 and every other bias 0. llama.cpp's graph with
sink logits, gpt-oss's, fixes alpha and the clamp in its code, so there is no GGUF export.
"""
import torch

from interop import InteropError
from interop.families.base import MOE_SWITCHES, Family, local_layer_types
from interop.layout import Names
from model.config import ModelConfig
from model.ffn import FeedForward
from model.moe import MoE
from model.transformer import Transformer

FLOAT32_MAX = torch.finfo(torch.float32).max
DENSE_SWITCHES = Family.switches | {"sinks": True}
SPARSE_SWITCHES = MOE_SWITCHES | {"qk_norm": "none", "sinks": True, "dense_layers": 0}


def swiglu_matrices(ffn: FeedForward | MoE) -> tuple[torch.Tensor, torch.Tensor]:
    """A SwiGLU's or an MoE block's experts' weights, as E experts (E = 1 for a dense SwiGLU): ([E, 2, d_e, d]:
    W1_e^T and W3_e^T, nn.Linear's rows), [E, d_e, d]: W2_e as x W2_e reads it)."""
    if isinstance(ffn, MoE):
        return (ffn.experts_in.weight.view(ffn.n_experts, 2, ffn.expert_d_ff, -1),
                ffn.experts_out.weight.view(ffn.n_experts, ffn.expert_d_ff, -1))
    return ffn.w_in.weight.view(1, 2, ffn.w_out.weight.shape[1], -1), ffn.w_out.weight.t().unsqueeze(0)


def biases(experts: int, width: int, d_model: int) -> dict[str, torch.Tensor]:
    """gpt-oss's FFN biases under which its experts compute ours: up's -1, every other 0."""
    return {"experts.gate_up_proj_bias": torch.stack([torch.zeros(experts, width), -torch.ones(experts, width)],
                                                     dim=-1).flatten(1),  # gate, up, gate, up, ...
            "experts.down_proj_bias": torch.zeros(experts, d_model), "router.bias": torch.zeros(experts)}


def fused_ffn(model: Transformer) -> dict[str, torch.Tensor]:
    """Every block's FFN as gpt-oss holds it, under model.layers.i.mlp.: gate_up_proj [E, d, 2 d_e] (x W: W1_e's
    columns at the even places, W3_e's at the odd ones), down_proj [E, d_e, d] and biases; a dense SwiGLU is one
    expert, its router [1, d] zeros (a softmax over one logit is 1)."""
    out = {}
    for i, block in enumerate(model.blocks):
        theirs = f"model.layers.{i}.mlp."
        gate_up, down = (m.detach().cpu() for m in swiglu_matrices(block.ffn))
        experts, _, width, d = gate_up.shape
        out[theirs + "experts.gate_up_proj"] = gate_up.permute(0, 3, 2, 1).reshape(experts, d, 2 * width).contiguous()
        out[theirs + "experts.down_proj"] = down.contiguous()
        out |= {theirs + name: bias for name, bias in biases(experts, width, d).items()}
        if not isinstance(block.ffn, MoE):
            out[theirs + "router.weight"] = torch.zeros(1, d)
    return out


def fused_ffn_back(model: Transformer, hf_state: dict[str, torch.Tensor],
                   expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fused_ffn's inverse: each block's FFN weights under this repo's names, from transformers' tensors (every name
    of expected, fused_ffn(model), present: hf.load_hf_state_dict checked); an InteropError for a shape other than
    expected's, or for biases other than biases' (a gpt-oss trained elsewhere)."""
    for name, tensor in expected.items():
        if hf_state[name].shape != tensor.shape:
            raise InteropError(f"weights do not match config.json: {name} is {list(hf_state[name].shape)}, the config "
                               f"implies {list(tensor.shape)}")
    state = {}
    for i, block in enumerate(model.blocks):
        theirs, ours = f"model.layers.{i}.mlp.", f"blocks.{i}.ffn."
        gate_up, down = swiglu_matrices(block.ffn)
        experts, _, width, d = gate_up.shape
        for name, bias in biases(experts, width, d).items():
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


class GptOss(Family):
    name, model_type, class_name = "gpt-oss", "gpt_oss", "GptOssForCausalLM"
    fixed = {"hidden_act": "silu", "attention_bias": False, "swiglu_alpha": 1.0, "swiglu_limit": FLOAT32_MAX}
    default_head_dim = 64
    # what GptOssConfig reads for a key config.json leaves out, where it is not what this repo's readers assume (its
    # head_dim, 64, is default_head_dim's): OpenAI's settings, which an import then refuses or reads as they are
    defaults = {"attention_bias": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "num_local_experts": 128,
                "num_experts_per_tok": 4, "sliding_window": 128, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
                "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096}}
    reads_windows = True
    no_llama_cpp = ("model.sinks=true has no llama.cpp export here: llama.cpp's graph with sink logits, gpt-oss's, "
                    "clamps its experts' SwiGLU at 7 with alpha 1.702 fixed in its code, which this repo's SwiGLU "
                    "cannot be written into exactly (the transformers export writes gpt-oss)")

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.sinks

    def sparse(self, cfg: ModelConfig) -> bool:
        return cfg.ffn == "moe"

    def switches_for(self, sparse: bool) -> dict:
        return SPARSE_SWITCHES if sparse else DENSE_SWITCHES

    def expert_keys(self, cfg: ModelConfig) -> dict:
        """intermediate_size is an expert's width; a dense SwiGLU is one expert."""
        sparse = self.sparse(cfg)
        return {"num_local_experts": cfg.n_experts if sparse else 1,
                "num_experts_per_tok": cfg.experts_per_token if sparse else 1,
                "intermediate_size": cfg.expert_width if sparse else cfg.ffn_width,
                "router_aux_loss_coef": cfg.router_aux_coef if sparse else 0.0, "output_router_logits": False}

    def window_keys(self, cfg: ModelConfig) -> dict:
        if cfg.window is None:  # its config's default alternates 128-token windows; its forward builds the sliding
            # mask whatever the layers' types, so a window the context never passes: none is used
            return {"sliding_window": cfg.context_length, "layer_types": cfg.n_layers * ["full_attention"]}
        return {"sliding_window": cfg.window, "layer_types": local_layer_types(cfg)}

    def attention_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        return super().attention_names(attn, cfg, ours, theirs) | {ours + "sinks": [(theirs + "sinks", cfg.n_heads)]}

    def ffn_names(self, ffn: torch.nn.Module, sparse: bool, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        """The router only: the fused experts are extra_tensors'."""
        return {ours + "router.weight": [(theirs + "mlp.router.weight", cfg.n_experts)]} if sparse else {}

    def extra_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        return fused_ffn(model)

    def from_hf(self, state: dict[str, torch.Tensor], model: Transformer, hf_state: dict[str, torch.Tensor],
                config: dict, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state | fused_ffn_back(model, hf_state, extra)

    def sparse_config(self, hf: dict) -> bool:
        return hf["num_local_experts"] > 1

    def default_layer_types(self, hf: dict, window: int | None, n_layers: int) -> list[str]:
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]


FAMILY = GptOss()
