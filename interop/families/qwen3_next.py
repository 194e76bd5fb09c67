"""Qwen3-Next: Qwen3NextForCausalLM, Qwen3-MoE's model with shared experts (moe_tiny): QK-norm, experts under the
softmax router renormalised over the k chosen, and one shared SwiGLU of n_shared d_e (shared_expert_intermediate_size)
beside them; with every layer attention, or as the hybrid of Gated DeltaNet layers and gated attention layers that
Qwen3-Next is (model.linear_pattern N:1 or alternate with model.attention_gate, as Qwen3.5's, qwen3_5.py, with
experts). What Qwen3-Next always computes and this repo's model may not have is written so that it computes nothing:

    sigmoid-gated shared expert  y_shared = sigmoid(x W_sg) SwiGLU_shared(x), W_sg [1, d]: written 0, so the gate is
                                 sigmoid(0) = 1/2, and the shared expert's down_proj doubled
    gated attention output       o = (attn * sigmoid(x W_g)) W_o: q_proj [H 2D, d] holds each head's rows [W_q,h;
                                 W_g,h]; without model.attention_gate (all attention only) W_g written 0 (1/2), o_proj
                                 doubled
    RMSNorm gains of (1 + w)     every norm (layers', final, q and k): w is written as our gain - 1

A power of two scales exactly, so the gates and the doublings cancel bit for bit. A gain g comes back bit for bit
where g >= 1/2 (g - 1 is then exact, by Sterbenz's lemma, and so is 1 + (g - 1)); below 1/2, g - 1 is rounded, by at
most half a step of its binade (2^-24 in float32 for |g - 1| < 2), and 1 + (g - 1) is that close to g, in
transformers' forward and in an import alike. An import reads an all-attention Qwen3-Next as gate-less (refusing a
gate that is not zero) and a hybrid as gated; this repo's shared experts have no gate, so a nonzero one is refused.

    blocks.i.attn.qkv.weight   [(H+2H_kv)D, d]   self_attn.q_proj (each head [W_q,h; W_g,h]), k_proj, v_proj
    blocks.i.attn.out.weight   [d, H D]          self_attn.o_proj.weight (2 W_o without a gate)
    blocks.i.*norm*.weight     [d] or [D]        input_layernorm, post_attention_layernorm, self_attn.{q,k}_norm,
    final_norm.weight                            model.norm: weight = g - 1
    blocks.i.ffn.router, experts_in, experts_out  mlp.gate, mlp.experts.e.{gate,up,down}_proj (Qwen3-MoE's)
    blocks.i.ffn.shared.w_in   [2 n_s d_e, d]    mlp.shared_expert.{gate,up}_proj.weight
    blocks.i.ffn.shared.w_out  [d, n_s d_e]      mlp.shared_expert.down_proj.weight = 2 W2_shared
    (none)                                       mlp.shared_expert_gate.weight [1, d] = 0
  a linear layer (model/gated_deltanet.py), under model.layers.i.linear_attn., as Qwen3.5's but for two fused
  projections, grouped by key head g (each serving value heads g r .. g r + r - 1, r = H_v / H_k):
    blocks.i.attn.qkv, gate    [(2 H_k + H_v) D, d], [H_v D, d]    in_proj_qkvz: for each g, [q_g; k_g; v_g's r heads;
                                                                    z_g's r heads]
    blocks.i.attn.beta_proj, decay_proj   [H_v, d] each             in_proj_ba: for each g, [b_g's r; a_g's r]
    conv, A_log, dt_bias, norm, out                                 conv1d, A_log, dt_bias, norm, out_proj (Qwen3.5's)

Its RoPE turns partial_rotary_factor of each head (model.rotary_fraction; its default 1/4); it has no sliding window.
llama.cpp's qwen3next graph is not written: its loader makes three layers in four Gated DeltaNet whatever the file
says, so an all-attention model has no GGUF for it, and its fused linear-layer tensors are not written here (a dense
hybrid's GGUF is qwen35's, qwen3_5.py).
"""
import torch

from interop import InteropError
from interop.families.base import check_layer_count
from interop.families.qwen3 import qk_norm_names
from interop.families.qwen3_moe import Qwen3Moe
from interop.layout import Names, dense_ffn_names
from model.config import ModelConfig, window_pattern_of
from model.gated_deltanet import GatedDeltaNet
from model.transformer import Transformer

PARTIAL_ROTARY_FACTOR = 0.25  # Qwen3NextConfig's and Qwen3_5TextConfig's default: the share of each head RoPE turns
FULL_ATTENTION_INTERVAL = 4  # their default layer_types: every 4th layer attention, the others Gated DeltaNet
GATE_SCALE = 2.0  # 1 / sigmoid(0): what the down projections after a zero gate are multiplied by


def norm_names(state: dict[str, torch.Tensor], cfg: ModelConfig) -> list[str]:
    """Our RMSNorm gains that Qwen3-Next and Qwen3.5 store as (gain - 1): every block's two, the final one and the
    attention layers' q and k norms (a linear layer has none; its gated norm's gain is stored as it is)."""
    per_block = ["attn_norm.weight", "ffn_norm.weight", "attn.qk_norm.q_norm.weight", "attn.qk_norm.k_norm.weight"]
    names = ["final_norm.weight"] + [f"blocks.{i}.{name}" for i in range(cfg.n_layers) for name in per_block]
    return [name for name in names if name in state]


def attention_layers(model: Transformer) -> list[int]:
    return [i for i, block in enumerate(model.blocks) if not isinstance(block.attn, GatedDeltaNet)]


def linear_layers(model: Transformer) -> list[int]:
    return [i for i, block in enumerate(model.blocks) if isinstance(block.attn, GatedDeltaNet)]


def gated_rows(qkv: torch.Tensor, gate: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """qkv's rows [W_q; W_k; W_v] with each query head's output-gate rows after its own: [W_q,h; W_g,h for each h;
    W_k; W_v], q_proj's layout then k_proj's and v_proj's."""
    H, D = cfg.n_heads, cfg.head_dim
    q, kv = qkv.split([H * D, 2 * cfg.n_kv_heads * D])
    per_head = torch.stack([q.view(H, D, -1), gate.view(H, D, -1)], dim=1)  # [H, (q, gate), D, d]
    return torch.cat([per_head.flatten(0, 2), kv])


def ungated_rows(rows: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """gated_rows' inverse: (qkv's rows, the gate's)."""
    H, D = cfg.n_heads, cfg.head_dim
    q, kv = rows.split([2 * H * D, 2 * cfg.n_kv_heads * D])
    query, gate = q.view(H, 2, D, -1).unbind(1)
    return torch.cat([query.flatten(0, 1), kv]), gate.flatten(0, 1)


def gated_query_key_value_names(cfg: ModelConfig, ours: str, theirs: str) -> Names:
    """An attention layer's q_proj (each head's query rows, then its gate's: gated_rows), k_proj and v_proj, and its
    q and k norms: Qwen3-Next's and Qwen3.5's."""
    rows = [2 * cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim]
    return {ours + "qkv.weight": [(theirs + f"{x}_proj.weight", n) for x, n in zip("qkv", rows, strict=True)]} \
        | qk_norm_names(cfg, ours, theirs)


def by_key_head(parts: list[torch.Tensor], key_heads: int) -> torch.Tensor:
    """Rows of several tensors, each a whole number of rows per key head, regrouped by key head: for each key head,
    each part's rows of it in turn (Qwen3-Next's in_proj_qkvz and in_proj_ba)."""
    return torch.cat([part.view(key_heads, -1, part.shape[-1]) for part in parts], dim=1).flatten(0, 1)


def from_key_heads(rows: torch.Tensor, widths: list[int], key_heads: int) -> list[torch.Tensor]:
    """by_key_head's inverse: widths are each part's rows per key head."""
    return [part.flatten(0, 1) for part in rows.view(key_heads, sum(widths), -1).split(widths, dim=1)]


def linear_attention_names(attn: GatedDeltaNet, cfg: ModelConfig, ours: str, theirs: str,
                           projections: list[tuple[str, str, int]]) -> Names:
    """A Gated DeltaNet layer's names under model.layers.i.linear_attn.: the family's input projections (ours, its
    name, rows), then the conv, the decay's A_log and dt_bias, the gated norm and the output projection, which
    Qwen3-Next and Qwen3.5 name alike."""
    theirs = theirs.removesuffix("self_attn.") + "linear_attn."
    H_v = attn.value_heads
    shared = [("conv.weight", "conv1d.weight", attn.qkv.out_features), ("A_log", "A_log", H_v),
              ("dt_bias", "dt_bias", H_v), ("norm.weight", "norm.weight", attn.head_dim),
              ("out.weight", "out_proj.weight", cfg.d_model)]
    return {ours + name: [(theirs + hf_name, rows)] for name, hf_name, rows in projections + shared}


def linear_keys(cfg: ModelConfig) -> dict:
    """config.json's sizes of the linear layers."""
    return {"linear_num_key_heads": cfg.n_linear_key_heads, "linear_num_value_heads": cfg.n_linear_value_heads,
            "linear_key_head_dim": cfg.linear_dim, "linear_value_head_dim": cfg.linear_dim,
            "linear_conv_kernel_dim": cfg.linear_conv}


def hybrid_layer_types(cfg: ModelConfig) -> dict:
    """config.json's layer_types: each layer linear_attention or full_attention."""
    return {"layer_types": ["linear_attention" if linear else "full_attention" for linear in cfg.linear_layers]}


def refuse_all_linear(cfg: ModelConfig, target: str) -> None:
    """An all-linear model, named by its pattern: the switches check would name its attention settings instead, which
    it sets as it must (ModelConfig refuses the families' on a model without an attention layer)."""
    if all(cfg.linear_layers):
        raise InteropError(f"model.linear_pattern={cfg.linear_pattern} has no {target} equivalent here: the families "
                           f"with linear layers, Qwen3.5 and Qwen3-Next, have gated, QK-normed, rotated attention "
                           f"layers (model.attention_gate=true, qk_norm=rmsnorm, position=rope), which a model with "
                           f"no attention layer refuses; a hybrid such as model.linear_pattern=3:1 exports")


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


def hybrid_settings(hf: dict) -> dict:
    """model.linear_pattern and the linear layers' sizes of a Qwen3-Next or Qwen3.5 config.json (read): its
    layer_types, or every full_attention_interval-th layer attention; {} where every layer is attention. Patterns
    this repo cannot make, and all linear layers (these families' attention layers always have their gate, QK-norm
    and RoPE), are refused in one line."""
    n_layers = hf["num_hidden_layers"]
    if hf.get("layer_types"):
        check_layer_count(hf["layer_types"], n_layers)
    types = hf.get("layer_types") or ["full_attention" if (i + 1) % hf.get("full_attention_interval",
                                                                          FULL_ATTENTION_INTERVAL) == 0
                                      else "linear_attention" for i in range(n_layers)]
    unknown = sorted(set(types) - {"linear_attention", "full_attention"})
    linear = [kind == "linear_attention" for kind in types]
    if not unknown and not any(linear):
        return {}
    pattern = window_pattern_of(linear)
    if unknown or pattern is None or pattern == "all":
        raise InteropError(f"layer_types={types} is not supported; this repo's linear layers are every other one "
                           f"from the first (alternate) or N linear to one attention (N:1)")
    key_dim, value_dim = (hf.get(key, 128) for key in ("linear_key_head_dim", "linear_value_head_dim"))
    if key_dim != value_dim:
        raise InteropError(f"linear_value_head_dim={value_dim} is not supported; this repo's linear heads have "
                           f"one width, linear_key_head_dim={key_dim}")
    return {"linear_pattern": pattern, "linear_key_heads": hf.get("linear_num_key_heads", 16),
            "linear_value_heads": hf.get("linear_num_value_heads", 32), "linear_head_dim": key_dim,
            "linear_conv": hf.get("linear_conv_kernel_dim", 4)}


class Qwen3Next(Qwen3Moe):
    name, model_type, class_name = "Qwen3-Next", "qwen3_next", "Qwen3NextForCausalLM"
    # Qwen3-MoE's switches with a shared expert of any width, linear layers in any pattern and RoPE on any share
    switches = {key: value for key, value in Qwen3Moe.switches.items()
                if key not in ("n_shared_experts", "linear_pattern", "attention_gate", "rotary_fraction")} | {
        "linear_delta_rule": True}
    default_head_dim = 256
    every_layer_window = reads_windows = False
    llama_cpp = None
    no_llama_cpp = ("model.n_shared_experts with model.qk_norm=rmsnorm has no llama.cpp export here: its family, "
                    "Qwen3-Next, is llama.cpp's qwen3next graph, whose loader makes three layers in four Gated "
                    "DeltaNet whatever the file says, and whose fused linear-layer tensors this repo does not write "
                    "(the transformers export writes Qwen3-Next; a hybrid without experts exports to qwen35)")

    def claims(self, cfg: ModelConfig) -> bool:
        return super().claims(cfg) and (cfg.n_shared_experts > 0 or cfg.linear_pattern is not None)

    def check(self, cfg: ModelConfig, target: str) -> None:
        refuse_all_linear(cfg, target)
        super().check(cfg, target)
        if cfg.window is not None:
            raise InteropError(f"model.window={cfg.window} has no {target} {self.name} equivalent: its attention "
                               f"layers attend to every earlier position")
        if cfg.n_shared_experts == 0:
            raise InteropError(f"model.n_shared_experts=0 has no {target} {self.name} equivalent: its sparse blocks "
                               f"always have a shared expert (shared_expert_intermediate_size)")
        hybrid = cfg.linear_pattern is not None
        if cfg.attention_gate != hybrid:
            raise InteropError(f"model.attention_gate={cfg.attention_gate} with model.linear_pattern="
                               f"{cfg.linear_pattern} has no {target} {self.name} equivalent here: an import reads "
                               f"a hybrid's attention as gated and an all-attention model's as gate-less (its gates "
                               f"zero), so the export writes those two")

    def head_keys(self, cfg: ModelConfig) -> dict:
        keys = super().head_keys(cfg) | {"partial_rotary_factor": cfg.rotary_fraction}
        return keys | (linear_keys(cfg) if cfg.linear_pattern is not None else {})

    def expert_keys(self, cfg: ModelConfig) -> dict:
        return super().expert_keys(cfg) | {"shared_expert_intermediate_size": cfg.n_shared_experts * cfg.expert_width}

    def window_keys(self, cfg: ModelConfig) -> dict:
        return hybrid_layer_types(cfg)  # every layer full_attention where there is no linear one

    def attention_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        if isinstance(attn, GatedDeltaNet):  # to_hf has fused gate into qkv and decay_proj into beta_proj
            H_v, D = attn.value_heads, attn.head_dim
            return linear_attention_names(attn, cfg, ours, theirs, [
                ("qkv.weight", "in_proj_qkvz.weight", attn.qkv.out_features + H_v * D),
                ("beta_proj.weight", "in_proj_ba.weight", 2 * H_v)])
        return super().attention_names(attn, cfg, ours, theirs)

    def query_key_value_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        return gated_query_key_value_names(cfg, ours, theirs)

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
        for name in norm_names(out, cfg):
            out[name] = out[name] - 1
        for i in attention_layers(model):
            ours = f"blocks.{i}.attn."
            if cfg.attention_gate:
                gate = out.pop(ours + "gate.weight")
            else:  # a zero gate, 1/2 everywhere, undone by a doubled o_proj
                gate = torch.zeros(cfg.n_heads * cfg.head_dim, cfg.d_model, dtype=out[ours + "qkv.weight"].dtype)
                out[ours + "out.weight"] = out[ours + "out.weight"] * GATE_SCALE
            out[ours + "qkv.weight"] = gated_rows(out[ours + "qkv.weight"], gate, cfg)
        for i in linear_layers(model):
            ours, H_k = f"blocks.{i}.attn.", cfg.n_linear_key_heads
            q, k, v = out[ours + "qkv.weight"].split([H_k * cfg.linear_dim, H_k * cfg.linear_dim,
                                                      cfg.n_linear_value_heads * cfg.linear_dim])
            out[ours + "qkv.weight"] = by_key_head([q, k, v, out.pop(ours + "gate.weight")], H_k)
            out[ours + "beta_proj.weight"] = by_key_head([out[ours + "beta_proj.weight"],
                                                          out.pop(ours + "decay_proj.weight")], H_k)
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
        for name in norm_names(out, cfg):
            out[name] = out[name] + 1
        for i in attention_layers(model):
            ours = f"blocks.{i}.attn."
            out[ours + "qkv.weight"], gate = ungated_rows(out[ours + "qkv.weight"], cfg)
            if cfg.attention_gate:
                out[ours + "gate.weight"] = gate
            elif gate.any():
                raise InteropError(f"model.layers.{i}.self_attn.q_proj.weight's output gate (each head's last "
                                   f"head_dim rows) is not zero: this repo reads an all-attention {self.name}'s "
                                   f"attention as gate-less")
            else:
                out[ours + "out.weight"] = out[ours + "out.weight"] / GATE_SCALE
        for i in linear_layers(model):
            ours, H_k, D = f"blocks.{i}.attn.", cfg.n_linear_key_heads, cfg.linear_dim
            r = cfg.n_linear_value_heads // H_k
            q, k, v, out[ours + "gate.weight"] = from_key_heads(out[ours + "qkv.weight"], [D, D, r * D, r * D], H_k)
            out[ours + "qkv.weight"] = torch.cat([q, k, v])
            out[ours + "beta_proj.weight"], out[ours + "decay_proj.weight"] = from_key_heads(
                out[ours + "beta_proj.weight"], [r, r], H_k)
        for i in model.moe_layers():
            out[f"blocks.{i}.ffn.shared.w_out.weight"] = out[f"blocks.{i}.ffn.shared.w_out.weight"] / GATE_SCALE
        return out

    def read(self, hf: dict) -> dict:
        return super().read(hf) | partial_rope(hf)

    def window_settings(self, hf: dict, n_layers: int, context: int) -> dict:
        return {}  # Qwen3-Next has no sliding window; its layer_types are read by attention_settings

    def attention_settings(self, hf: dict) -> dict:
        """The linear layers, if any (a hybrid's attention then gated), and the RoPE share."""
        linear = hybrid_settings(hf)
        return linear | {"attention_gate": bool(linear), "rotary_fraction": float(hf["partial_rotary_factor"])}

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
