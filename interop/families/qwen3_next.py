"""Qwen3-Next: Qwen3NextForCausalLM with every layer full attention (no Gated DeltaNet), for Qwen3-MoE's model with
shared experts (moe_tiny): QK-norm, experts under the softmax router renormalised over the k chosen, and one shared
SwiGLU of n_shared d_e (shared_expert_intermediate_size) beside them. Three things Qwen3-Next always computes that
this repo's model does not are written so that they compute nothing:

    sigmoid-gated shared expert  y_shared = sigmoid(x W_sg) SwiGLU_shared(x), W_sg [1, d]: written 0, so the gate is
                                 sigmoid(0) = 1/2, and the shared expert's down_proj doubled
    gated attention output       o = (attn * sigmoid(x W_g)) W_o: q_proj [H 2D, d] holds each head's rows [W_q,h;
                                 W_g,h]; W_g written 0 (1/2), o_proj doubled
    RMSNorm gains of (1 + w)     every norm (layers', final, q and k): w is written as our gain - 1

A power of two scales exactly, so the gates and the doublings cancel bit for bit. A gain g comes back bit for bit
where g >= 1/2 (g - 1 is then exact, by Sterbenz's lemma, and so is 1 + (g - 1)); below 1/2, g - 1 is rounded, by at
most half a step of its binade (2^-24 in float32 for |g - 1| < 2), and 1 + (g - 1) is that close to g, in
transformers' forward and in an import alike. An import refuses a gate that is not zero: this repo's model has none.

    blocks.i.attn.qkv.weight   [(H+2H_kv)D, d]   self_attn.q_proj (each head [W_q,h; 0]), k_proj, v_proj
    blocks.i.attn.out.weight   [d, H D]          self_attn.o_proj.weight = 2 W_o
    blocks.i.*norm*.weight     [d] or [D]        input_layernorm, post_attention_layernorm, self_attn.{q,k}_norm,
    final_norm.weight                            model.norm: weight = g - 1
    blocks.i.ffn.router, experts_in, experts_out  mlp.gate, mlp.experts.e.{gate,up,down}_proj (Qwen3-MoE's)
    blocks.i.ffn.shared.w_in   [2 n_s d_e, d]    mlp.shared_expert.{gate,up}_proj.weight
    blocks.i.ffn.shared.w_out  [d, n_s d_e]      mlp.shared_expert.down_proj.weight = 2 W2_shared
    (none)                                       mlp.shared_expert_gate.weight [1, d] = 0, self_attn.q_proj's W_g = 0

Its RoPE turns a quarter of each head unless partial_rotary_factor says otherwise (written 1: all of it, as ours);
it has no sliding window. llama.cpp's qwen3next graph is not written: its loader makes three layers in four Gated
DeltaNet whatever the file says.
"""
import torch

from interop import InteropError
from interop.families.qwen3 import qk_norm_names
from interop.families.qwen3_moe import Qwen3Moe
from interop.layout import Names, dense_ffn_names
from model.config import ModelConfig
from model.transformer import Transformer

PARTIAL_ROTARY_FACTOR = 0.25  # Qwen3NextConfig's and Qwen3_5TextConfig's default: the share of each head RoPE turns
FULL_ATTENTION_INTERVAL = 4  # its default layer_types: every 4th layer attention, the others Gated DeltaNet
GATE_SCALE = 2.0  # 1 / sigmoid(0): what the down projections after a zero gate are multiplied by


def norm_names(cfg: ModelConfig) -> list[str]:
    """Our RMSNorm gains, each of which Qwen3-Next stores as (gain - 1)."""
    per_block = ["attn_norm.weight", "ffn_norm.weight", "attn.qk_norm.q_norm.weight", "attn.qk_norm.k_norm.weight"]
    return ["final_norm.weight"] + [f"blocks.{i}.{name}" for i in range(cfg.n_layers) for name in per_block]


def gated_rows(qkv: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """qkv's rows [W_q; W_k; W_v] with a zero output gate after each query head's: [W_q,h; 0 for each h; W_k; W_v]."""
    q, kv = qkv.split([cfg.n_heads * cfg.head_dim, 2 * cfg.n_kv_heads * cfg.head_dim])
    per_head = q.view(cfg.n_heads, cfg.head_dim, -1)
    return torch.cat([torch.cat([per_head, torch.zeros_like(per_head)], dim=1).flatten(0, 1), kv])


def ungated_rows(rows: torch.Tensor, cfg: ModelConfig, layer: int) -> torch.Tensor:
    """gated_rows' inverse; refuses a gate that is not zero."""
    q, kv = rows.split([2 * cfg.n_heads * cfg.head_dim, 2 * cfg.n_kv_heads * cfg.head_dim])
    query, gate = q.view(cfg.n_heads, 2, cfg.head_dim, -1).unbind(1)
    if gate.any():
        raise InteropError(f"model.layers.{layer}.self_attn.q_proj.weight's output gate (each head's last head_dim "
                           f"rows) is not zero: this repo's attention output has no gate")
    return torch.cat([query.flatten(0, 1), kv])


def rotary_share(rope: dict | None) -> float | None:
    return (rope or {}).get("partial_rotary_factor")


def partial_rope(hf: dict, dropped: tuple[str, ...] = ("partial_rotary_factor",)) -> dict:
    """A Qwen config.json's RoPE settings with its partial_rotary_factor as one key, wherever config.json has it
    (transformers reads it into rope_parameters; default PARTIAL_ROTARY_FACTOR), and the RoPE settings without the
    `dropped` keys, which this repo reads there or has no counterpart for."""
    share = next((s for s in (rotary_share(hf.get("rope_parameters")), rotary_share(hf.get("rope_scaling")),
                              hf.get("partial_rotary_factor")) if s is not None), PARTIAL_ROTARY_FACTOR)
    ropes = {key: {k: v for k, v in hf[key].items() if k not in dropped}
             for key in ("rope_parameters", "rope_scaling") if hf.get(key)}
    return ropes | {"partial_rotary_factor": share}


class Qwen3Next(Qwen3Moe):
    name, model_type, class_name = "Qwen3-Next", "qwen3_next", "Qwen3NextForCausalLM"
    switches = {key: value for key, value in Qwen3Moe.switches.items() if key != "n_shared_experts"}
    default_head_dim = 256
    every_layer_window = reads_windows = False
    llama_cpp = None
    no_llama_cpp = ("model.n_shared_experts with model.qk_norm=rmsnorm has no llama.cpp export here: its family, "
                    "Qwen3-Next, is llama.cpp's qwen3next graph, whose loader makes three layers in four Gated "
                    "DeltaNet whatever the file says, where every layer here is attention (the transformers export "
                    "writes Qwen3-Next)")

    def claims(self, cfg: ModelConfig) -> bool:
        return super().claims(cfg) and cfg.n_shared_experts > 0

    def check(self, cfg: ModelConfig, target: str) -> None:
        super().check(cfg, target)
        if cfg.window is not None:
            raise InteropError(f"model.window={cfg.window} has no {target} {self.name} equivalent: its attention "
                               f"layers attend to every earlier position")

    def head_keys(self, cfg: ModelConfig) -> dict:
        return super().head_keys(cfg) | {"partial_rotary_factor": 1.0}

    def expert_keys(self, cfg: ModelConfig) -> dict:
        return super().expert_keys(cfg) | {"shared_expert_intermediate_size": cfg.n_shared_experts * cfg.expert_width}

    def window_keys(self, cfg: ModelConfig) -> dict:
        return {"layer_types": cfg.n_layers * ["full_attention"]}

    def query_key_value_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        rows = [2 * cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim]
        return {ours + "qkv.weight": [(theirs + f"{x}_proj.weight", n) for x, n in zip("qkv", rows, strict=True)]} \
            | qk_norm_names(cfg, ours, theirs)

    def ffn_names(self, ffn: torch.nn.Module, sparse: bool, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        names = super().ffn_names(ffn, sparse, cfg, ours, theirs)
        if sparse:
            names |= dense_ffn_names(ffn.shared, ours + "shared.", theirs + "mlp.shared_expert.", cfg.d_model)
        return names

    def extra_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        return {f"model.layers.{i}.mlp.shared_expert_gate.weight": torch.zeros(1, model.cfg.d_model)
                for i in model.moe_layers()}

    def to_hf(self, state: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
        cfg, out = model.cfg, super().to_hf(state, model)
        for name in norm_names(cfg):
            out[name] = out[name] - 1
        for i in range(cfg.n_layers):
            out[f"blocks.{i}.attn.qkv.weight"] = gated_rows(out[f"blocks.{i}.attn.qkv.weight"], cfg)
            out[f"blocks.{i}.attn.out.weight"] = out[f"blocks.{i}.attn.out.weight"] * GATE_SCALE
        for i in model.moe_layers():
            out[f"blocks.{i}.ffn.shared.w_out.weight"] = out[f"blocks.{i}.ffn.shared.w_out.weight"] * GATE_SCALE
        return out

    def from_hf(self, state: dict[str, torch.Tensor], model: Transformer, hf_state: dict[str, torch.Tensor],
                config: dict, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        cfg, out = model.cfg, super().from_hf(state, model, hf_state, config, extra)
        for name in extra:
            if hf_state[name].any():
                raise InteropError(f"{name} is not zero: this repo's shared experts are not gated (a zero gate "
                                   f"weighs them by sigmoid(0) = 1/2, which the export's doubled down_proj undoes)")
        for name in norm_names(cfg):
            out[name] = out[name] + 1
        for i in range(cfg.n_layers):
            out[f"blocks.{i}.attn.qkv.weight"] = ungated_rows(out[f"blocks.{i}.attn.qkv.weight"], cfg, i)
            out[f"blocks.{i}.attn.out.weight"] = out[f"blocks.{i}.attn.out.weight"] / GATE_SCALE
        for i in model.moe_layers():
            out[f"blocks.{i}.ffn.shared.w_out.weight"] = out[f"blocks.{i}.ffn.shared.w_out.weight"] / GATE_SCALE
        return out

    def read(self, hf: dict) -> dict:
        return super().read(hf) | partial_rope(hf)

    def model_config(self, hf: dict) -> ModelConfig:
        if hf["partial_rotary_factor"] != 1.0:
            raise InteropError(f"partial_rotary_factor={hf['partial_rotary_factor']} is not supported; this repo's "
                               f"RoPE turns every dim of a head (partial_rotary_factor=1.0)")
        return super().model_config(hf)

    def expert_settings(self, hf: dict) -> dict:
        values = super().expert_settings(hf)
        shared = hf.get("shared_expert_intermediate_size", 512)  # Qwen3NextConfig's default
        if shared <= 0 or shared % values["expert_d_ff"]:
            raise InteropError(f"shared_expert_intermediate_size={shared} is not supported; this repo's shared "
                               f"experts are n of moe_intermediate_size={values['expert_d_ff']}, n >= 1")
        return values | {"n_shared_experts": shared // values["expert_d_ff"]}

    def sliding_window(self, hf: dict) -> int | None:
        return None  # Qwen3-Next has none; transformers ignores the key

    def default_layer_types(self, hf: dict, window: int | None, n_layers: int) -> list[str]:
        interval = hf.get("full_attention_interval", FULL_ATTENTION_INTERVAL)
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


FAMILY = Qwen3Next()
