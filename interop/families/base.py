"""The base every family in this folder extends: LLaMA's answers, which a family changes where it differs.

A family is one transformers architecture (a config.json model_type) and, where llama.cpp runs it, one llama.cpp
graph. Its class answers, for this repo's ModelConfig and model:
    claims(cfg)                       whether a model with these switches is this family's (to export, or to refuse
                                      with the family's reasons); the registry (__init__.py) asks the most specific
                                      first
    check(cfg, target)                the refusals: switches unlike the family's (switches_for), windows (check_window)
                                      and experts it has no counterpart for; one InteropError line each
    head_keys, expert_keys,           config.json's keys for the attention, the experts and the windows (hf.py
    window_keys, fixed_for            writes the LLaMA keys every family has around them)
    weight_names(model)               our parameter -> the transformers tensors it stacks (layout.Names), built from
                                      attention_names and ffn_names per block
    to_hf, from_hf, extra_tensors     the transforms between the two layouts, and tensors no parameter of ours maps
and for a config.json:
    read(hf)                          the config with the defaults its transformers class reads for missing keys
    model_config(hf)                  the ModelConfig, or an InteropError naming the key this repo has no
                                      counterpart for (layer_types and the head dim as transformers reads them)
and for llama.cpp's GGUF (gguf.py writes the file):
    llama_cpp                         the graph (None: no_llama_cpp says why), whether it rotates adjacent pairs
    check_llama_cpp(cfg)              that graph's refusals
    add_llama_cpp_ffn, _attention,    its metadata keys
    _rope
    llama_cpp_tensors, llama_cpp_name its tensors (names from the gguf package's map for the graph)

The RoPE translation (model/rope_scaling.py in both formats) is the same in every family: hf_rope, rope_settings.
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf
import torch

from interop import InteropError
from interop.layout import Experts, Names, dense_ffn_names, expert_names, moe_layout
from model.block import rope_dim
from model.config import ModelConfig, window_pattern_of
from model.rope_scaling import YARN_BETA_FAST, YARN_BETA_SLOW, ntk_base
from model.transformer import Transformer

# The value each switch must have for the model to be a LLaMA; a family adds the switches that make it itself.
LLAMA_SWITCHES = {"norm": "rmsnorm", "norm_position": "pre", "position": "rope", "ffn": "swiglu", "bias": False,
                  "embedding_scale": "gpt2", "linear_pattern": None, "attention_gate": False, "rotary_fraction": 1.0,
                  "logit_softcap": None, "value_embeddings": None, "residual_scalars": False}
# ffn=moe (model/moe.py) under the softmax router, no shared experts and no balancing bias: Mixtral's, Qwen3-MoE's
MOE_SWITCHES = LLAMA_SWITCHES | {"ffn": "moe", "router": "softmax", "n_shared_experts": 0, "router_bias_rate": 0.0}


@dataclass(frozen=True)
class LlamaCppArch:
    """One of llama.cpp's architectures, and how its graph rotates q and k."""
    arch: gguf.MODEL_ARCH
    adjacent_rope: bool  # its graph rotates the dims (2i, 2i + 1) of a head, where ours rotates (i, i + D/2)

    @property
    def name(self) -> str:  # general.architecture, and the prefix of the model's keys
        return gguf.MODEL_ARCH_NAMES[self.arch]


class Family:
    """LLaMA's answers (LlamaForCausalLM; llama.cpp's llama graph). A subclass sets its names and overrides what its
    family does otherwise. The base itself reads a config.json of a model_type no family has (the KV-cache
    estimator's head dim and windows) as transformers' generic code does."""
    name = "transformers"  # for messages
    model_type = ""  # config.json's model_type
    class_name = ""  # config.json's architectures
    switches = LLAMA_SWITCHES | {"qk_norm": "none"}  # every switch this repo's model must have to be it
    fixed = {"hidden_act": "silu"}  # config.json keys with the one value this repo's model has: written, checked
    default_head_dim: int | None = None  # transformers' head dim when config.json has none (None: hidden / heads)
    defaults: dict = {}  # what its config class reads for a missing key, where this repo's readers would assume other
    experts: Experts | None = None  # an MoE family's per-expert tensors
    n_experts_key, expert_width_key = "num_local_experts", "intermediate_size"  # config.json's E and d_e
    reads_windows = False  # whether a config.json's sliding window has a counterpart here
    every_layer_window = False  # its window, if any, is in every layer (no layer_types)
    llama_cpp: LlamaCppArch | None = None
    no_llama_cpp = ""  # why not, where llama_cpp is None
    llama_cpp_float32: set = set()  # the gguf.MODEL_TENSOR kinds its graph reads as float32 whatever --dtype
    refusal: str | None = None  # why this repo neither exports nor imports the family, though it reads its config

    # ------------------------------------------------------------ this repo -> transformers

    def claims(self, cfg: ModelConfig) -> bool:
        return False

    def sparse(self, cfg: ModelConfig) -> bool:
        """Whether the model has this family's experts: an MoE family's always, unless it has a dense variant too."""
        return self.experts is not None

    def switches_for(self, sparse: bool) -> dict:
        return self.switches

    def fixed_for(self, sparse: bool) -> dict:
        return self.fixed

    def check(self, cfg: ModelConfig, target: str) -> None:
        """Refuses a model with a switch unlike the family's, naming every offending one, and what else the family
        has no counterpart for; target: whose format, for the message."""
        switches = self.switches_for(self.sparse(cfg))
        refused = [f"model.{key}={getattr(cfg, key)}" for key, value in switches.items() if getattr(cfg, key) != value]
        if refused:
            raise InteropError(f"no {target} {self.name} equivalent for {', '.join(refused)} "
                               f"({self.name} is {', '.join(f'model.{k}={v}' for k, v in switches.items())})")
        self.check_window(cfg, target)
        if self.sparse(cfg) and cfg.experts_per_token == 1:  # model/moe.py: a top-1 gate is p, not renormalised
            raise InteropError(f"model.experts_per_token=1 has no {target} {self.name} equivalent: its gates are "
                               f"renormalised over the k chosen, 1 for a single expert, where this repo's top-1 gate "
                               f"is the router's probability (Switch)")

    def check_window(self, cfg: ModelConfig, target: str) -> None:
        """A family whose one window is in every layer cannot write a window in some layers only."""
        if self.every_layer_window and cfg.window is not None and cfg.window_pattern != "all":
            raise InteropError(f"model.window={cfg.window} with model.window_pattern={cfg.window_pattern} has no "
                               f"{target} {self.name} equivalent: its window is in every layer "
                               f"(model.window_pattern=all)")

    def head_keys(self, cfg: ModelConfig) -> dict:
        return {"num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim}

    def expert_keys(self, cfg: ModelConfig) -> dict:
        """E, k and d_e under the family's names (none for a dense model); a family adds which blocks are dense."""
        if not self.sparse(cfg):
            return {}
        return {self.n_experts_key: cfg.n_experts, "num_experts_per_tok": cfg.experts_per_token,
                self.expert_width_key: cfg.expert_width, "router_aux_loss_coef": cfg.router_aux_coef,
                "output_router_logits": False}

    def window_keys(self, cfg: ModelConfig) -> dict:
        return {}

    def rope_keys(self, cfg: ModelConfig) -> dict:
        """What the family adds to rope_parameters beside the scaling (Qwen3.5's partial_rotary_factor)."""
        return {}

    def weight_names(self, model: Transformer) -> Names:
        """Our parameter name -> the transformers names whose rows it stacks, with their row counts."""
        cfg = model.cfg
        names = {"tok_emb.weight": [("model.embed_tokens.weight", cfg.vocab_size)],
                 "final_norm.weight": [("model.norm.weight", cfg.d_model)]}
        for i, block in enumerate(model.blocks):
            ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
            names[ours + "attn_norm.weight"] = [(theirs + "input_layernorm.weight", cfg.d_model)]
            names |= self.attention_names(block.attn, cfg, ours + "attn.", theirs + "self_attn.")
            names[ours + "ffn_norm.weight"] = [(theirs + "post_attention_layernorm.weight", cfg.d_model)]
            names |= self.ffn_names(block.ffn, i in model.moe_layers(), cfg, ours + "ffn.", theirs)
        if not cfg.tie_embeddings:
            names["lm_head.weight"] = [("lm_head.weight", cfg.vocab_size)]
        return names

    def attention_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        """q, k and v (the rows [Wq; Wk; Wv] of qkv, its stacked_rows), then the output projection."""
        return self.query_key_value_names(attn, cfg, ours, theirs) | {
            ours + "out.weight": [(theirs + "o_proj.weight", cfg.d_model)]}

    def query_key_value_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        return {ours + "qkv.weight": list(zip([theirs + f"{x}_proj.weight" for x in "qkv"], attn.qkv.stacked_rows,
                                              strict=True))}

    def ffn_names(self, ffn: torch.nn.Module, sparse: bool, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        """A dense block's SwiGLU under mlp., a sparse one's router and experts under the family's names."""
        if sparse:
            return expert_names(ffn, self.experts, ours, theirs, cfg.d_model)
        return dense_ffn_names(ffn, ours, theirs + "mlp.", cfg.d_model)

    def extra_tensors(self, model: Transformer) -> dict[str, torch.Tensor]:
        """transformers tensors that no name of weight_names maps (gpt-oss's fused experts), as export writes them."""
        return {}

    def to_hf(self, state: dict[str, torch.Tensor], model: Transformer) -> dict[str, torch.Tensor]:
        """Our weights (our names) laid out as the family's tensors are, so that weight_names splits them."""
        return moe_layout(state, model)

    def from_hf(self, state: dict[str, torch.Tensor], model: Transformer, hf_state: dict[str, torch.Tensor],
                config: dict, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """to_hf's inverse, on weight_names' concatenations (our names); hf_state: every transformers tensor, config:
        config.json, extra: extra_tensors(model), whose names hf_state holds (checked)."""
        return moe_layout(state, model, to_hf=False)

    # ------------------------------------------------------------ transformers -> this repo

    def read(self, hf: dict) -> dict:
        """A config.json with the defaults transformers reads for the keys it leaves out (defaults)."""
        return self.defaults | hf

    def sparse_config(self, hf: dict) -> bool:
        """Whether a config.json (read) has experts: as sparse."""
        return self.experts is not None

    def model_config(self, hf: dict) -> ModelConfig:
        """ModelConfig for a config.json (read); refuses features this repo does not have."""
        sparse = self.sparse_config(hf)
        for key, supported in self.fixed_for(sparse).items():
            if hf.get(key, supported) != supported:
                raise InteropError(f"{key}={hf[key]!r} is not supported; this repo's {self.name} has "
                                   f"{key}={supported!r}")
        try:
            d, n_heads = hf["hidden_size"], hf["num_attention_heads"]
            ffn_width = hf["intermediate_size"]
            values = dict(vocab_size=hf["vocab_size"], d_model=d, n_layers=hf["num_hidden_layers"], n_heads=n_heads,
                          n_kv_heads=hf.get("num_key_value_heads") or n_heads,
                          context_length=hf["max_position_embeddings"])
        except KeyError as e:
            raise InteropError(f"config.json has no {e.args[0]}") from None
        values |= rope_settings(hf, values["context_length"])
        values |= self.window_settings(hf, values["n_layers"], values["context_length"])
        values |= self.attention_settings(hf)
        if sparse:
            values |= self.expert_settings(hf)
        head_dim = values.pop("head_dim", None) or self.head_dim(hf)
        if head_dim * n_heads != d:
            raise InteropError(f"head_dim={head_dim} is not supported; this repo's head dim is "
                               f"hidden_size / num_attention_heads = {d} / {n_heads}")
        return ModelConfig(**values, d_ff=ffn_width, norm_eps=hf.get("rms_norm_eps", 1e-6),
                           tie_embeddings=hf.get("tie_word_embeddings", False), **self.switches_for(sparse))

    def head_dim(self, hf: dict) -> int:
        """The head dim as transformers reads it: head_dim, else the family's default, else hidden_size /
        num_attention_heads. KeyError where those are missing."""
        return hf.get("head_dim") or self.default_head_dim or hf["hidden_size"] // hf["num_attention_heads"]

    def attention_settings(self, hf: dict) -> dict:
        """The attention's settings beyond LLaMA's heads (DeepseekV3's latents)."""
        return {}

    def expert_settings(self, hf: dict) -> dict:
        """model.n_experts, experts_per_token, expert_d_ff and router_aux_coef of a sparse config.json: expert_keys'
        inverse (a family adds its dense blocks)."""
        try:
            values = {"n_experts": hf[self.n_experts_key], "experts_per_token": hf["num_experts_per_tok"],
                      "expert_d_ff": hf[self.expert_width_key],
                      "router_aux_coef": float(hf.get("router_aux_loss_coef", 0))}
        except KeyError as e:
            raise InteropError(f"config.json has no {e.args[0]}") from None
        if values["experts_per_token"] == 1:  # as check refuses it
            raise InteropError(f"num_experts_per_tok=1 is not supported for {self.name}: its one gate is renormalised "
                               f"to 1, where this repo's top-1 gate is the router's probability (Switch)")
        return values

    def sliding_window(self, hf: dict) -> int | None:
        return hf.get("sliding_window")

    def default_layer_types(self, hf: dict, window: int | None, n_layers: int) -> list[str]:
        """Each layer's attention where config.json lists none: a window, if any, in every layer."""
        return ["sliding_attention" if window is not None else "full_attention" for _ in range(n_layers)]

    def layer_types(self, hf: dict, n_layers: int) -> tuple[int | None, list[str]]:
        """(the sliding window, each layer's attention) as transformers reads a config.json (read): layer_types
        where given, else the family's default_layer_types."""
        window = self.sliding_window(hf)
        types = hf.get("layer_types")
        if types is None:
            return window, self.default_layer_types(hf, window, n_layers)
        check_layer_count(types, n_layers)
        return window, types

    def window_settings(self, hf: dict, n_layers: int, context: int) -> dict:
        """model.window and model.window_pattern of a config.json (layer_types): window_keys' inverse. A window no
        shorter than the context cuts nothing: full attention. Layers whose types no model.window_pattern makes (a
        full one first, say) are refused in one line."""
        window, types = self.layer_types(hf, n_layers)
        for layer, kind in enumerate(types):
            if kind not in ("full_attention", "sliding_attention"):
                raise InteropError(f"layer_types[{layer}]={kind!r} is not supported; this repo's layers are "
                                   f"full_attention or sliding_attention")
        local = [kind == "sliding_attention" for kind in types]
        if window is None or window >= context or not any(local):
            return {}
        if not self.reads_windows:
            raise InteropError(f"sliding_window={window} is not supported; this repo's {self.name} attends to every "
                               f"earlier position")
        pattern = window_pattern_of(local)
        if pattern is None:
            raise InteropError(f"layer_types={types} is not supported; this repo's local layers are all of them, "
                               f"every other one from the first (alternate), or N local to one full (N:1)")
        return {"window": window, "window_pattern": pattern}

    # ------------------------------------------------------------ llama.cpp

    def check_llama_cpp(self, cfg: ModelConfig) -> None:
        """What the family's llama.cpp graph cannot run (after check and the writer's own refusals)."""
        if cfg.rope_scaling == "dynamic":
            raise InteropError(f"model.rope_scaling=dynamic has no GGUF counterpart: {self.llama_cpp.name}.rope."
                               f"scaling.type is none, linear, yarn or longrope, each with fixed frequencies")

    def llama_cpp_notes(self, cfg: ModelConfig) -> list[str]:
        """Where llama.cpp's graph computes the exported model otherwise, for the user."""
        return []

    def llama_cpp_tensors(self, hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
        """The transformers tensors as llama.cpp's graph reads them, still under transformers' names."""
        return hf_state

    def llama_cpp_name(self, names: gguf.TensorNameMap, hf_name: str) -> tuple[gguf.MODEL_TENSOR, str]:
        return names.get_type_and_name(hf_name, try_suffixes=(".weight",))

    def add_llama_cpp_ffn(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        writer.add_feed_forward_length(cfg.ffn_width)

    def add_llama_cpp_attention(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        writer.add_head_count(cfg.n_heads)
        writer.add_head_count_kv(cfg.n_kv_heads)
        writer.add_rope_dimension_count(cfg.head_dim)

    def add_llama_cpp_rope(self, writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
        """RoPE's base and scaling as llama.cpp reads them: ntk is a larger <arch>.rope.freq_base, linear and yarn are
        <arch>.rope.scaling.* (yarn with its original context and betas; llama.cpp derives the attention factor
        0.1 ln s + 1 itself); finetuned says whether the weights were trained under the scaling."""
        ntk = cfg.rope_scaling == "ntk"
        writer.add_rope_freq_base(ntk_base(cfg.rope_base, cfg.rope_factor, rope_dim(cfg)) if ntk else cfg.rope_base)
        if cfg.rope_scaling not in ("linear", "yarn"):
            return
        writer.add_rope_scaling_type(gguf.RopeScalingType(cfg.rope_scaling))
        writer.add_rope_scaling_factor(cfg.rope_factor)
        writer.add_rope_scaling_orig_ctx_len(cfg.original_context)
        writer.add_rope_scaling_finetuned(cfg.context_length > cfg.original_context)
        if cfg.rope_scaling == "yarn":
            writer.add_rope_scaling_yarn_beta_fast(YARN_BETA_FAST)
            writer.add_rope_scaling_yarn_beta_slow(YARN_BETA_SLOW)


def check_layer_count(types: list, n_layers: int) -> None:
    """A config.json's own layer_types names each layer once, as transformers' configs require."""
    if len(types) != n_layers:
        raise InteropError(f"layer_types has {len(types)} entries, num_hidden_layers is {n_layers}: it names each "
                           f"layer's attention, one entry per layer")


def local_layer_types(cfg: ModelConfig) -> list[str]:
    """config.json's layer_types of a windowed model: each block's attention."""
    return ["sliding_attention" if window else "full_attention" for window in cfg.layer_windows]


def hf_rope(cfg: ModelConfig) -> tuple[dict, int]:
    """(rope_parameters, max_position_embeddings) for the model's RoPE scaling, in transformers' terms
    (model/rope_scaling.py): ntk is its default type with the NTK-aware base; dynamic reads its original context
    from max_position_embeddings, yarn from original_max_position_embeddings."""
    if cfg.rope_scaling == "none":
        return {"rope_type": "default", "rope_theta": cfg.rope_base}, cfg.context_length
    if cfg.rope_scaling == "ntk":
        return {"rope_type": "default", "rope_theta": ntk_base(cfg.rope_base, cfg.rope_factor, rope_dim(cfg))}, \
            cfg.context_length
    rope = {"rope_type": cfg.rope_scaling, "rope_theta": cfg.rope_base, "factor": float(cfg.rope_factor)}
    if cfg.rope_scaling == "dynamic":
        return rope, cfg.original_context
    if cfg.rope_scaling == "yarn":
        rope |= {"original_max_position_embeddings": cfg.original_context, "beta_fast": YARN_BETA_FAST,
                 "beta_slow": YARN_BETA_SLOW, "truncate": True}
    return rope, cfg.context_length


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
