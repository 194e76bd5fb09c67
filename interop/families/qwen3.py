"""Qwen3: Qwen3ForCausalLM, llama.cpp's qwen3 graph. LLaMA plus an RMSNorm over each q and k head after the
projections and before RoPE (model.qk_norm=rmsnorm), with one gain of D dims per layer shared by the heads and eps
rms_norm_eps, as model/qk_norm.py's:

    blocks.i.attn.qk_norm.q_norm.weight [D]    model.layers.i.self_attn.q_norm.weight
    blocks.i.attn.qk_norm.k_norm.weight [D]    model.layers.i.self_attn.k_norm.weight

Qwen3Config's head_dim defaults to 128 whatever the width; its MLP has no bias switch. Its sliding windows are off
unless use_sliding_window is true, then in the layers layer_types names, or from max_window_layers on. llama.cpp's
qwen3 graph rotates the half-split pairs itself (its "NEOX" RoPE), so q's and k's rows and the norm gains, which a
reordering of q's and k's dims would have to follow, stay as they are.
"""
import gguf
import torch

from interop.families.base import Family, LlamaCppArch, local_layer_types
from interop.layout import Names
from model.config import ModelConfig

QWEN_MAX_WINDOW_LAYERS = 28  # Qwen2Config's and Qwen3Config's default: the first layer with a window


def qk_norm_names(cfg: ModelConfig, ours: str, theirs: str) -> Names:
    return {ours + "qk_norm.q_norm.weight": [(theirs + "q_norm.weight", cfg.head_dim)],
            ours + "qk_norm.k_norm.weight": [(theirs + "k_norm.weight", cfg.head_dim)]}


def qwen_sliding_window(hf: dict) -> int | None:
    """The Qwen families' window: none unless use_sliding_window says so (their default is false)."""
    return hf.get("sliding_window") if hf.get("use_sliding_window", False) else None


def windows_from_max_window_layers(hf: dict, window: int | None, n_layers: int) -> list[str]:
    """Qwen2's and Qwen3's layers where config.json lists none: the window, if any, from max_window_layers on."""
    first = hf.get("max_window_layers", QWEN_MAX_WINDOW_LAYERS)
    return ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n_layers)]


class Qwen3(Family):
    name, model_type, class_name = "Qwen3", "qwen3", "Qwen3ForCausalLM"
    switches = Family.switches | {"qk_norm": "rmsnorm"}
    fixed = {"hidden_act": "silu", "attention_bias": False}
    default_head_dim = 128
    reads_windows = True
    llama_cpp = LlamaCppArch(gguf.MODEL_ARCH.QWEN3, adjacent_rope=False)

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.qk_norm == "rmsnorm"

    def query_key_value_names(self, attn: torch.nn.Module, cfg: ModelConfig, ours: str, theirs: str) -> Names:
        return super().query_key_value_names(attn, cfg, ours, theirs) | qk_norm_names(cfg, ours, theirs)

    def window_keys(self, cfg: ModelConfig) -> dict:
        if cfg.window is None:
            return {"use_sliding_window": False, "sliding_window": None}
        return {"use_sliding_window": True, "sliding_window": cfg.window, "layer_types": local_layer_types(cfg)}

    def sliding_window(self, hf: dict) -> int | None:
        return qwen_sliding_window(hf)

    def default_layer_types(self, hf: dict, window: int | None, n_layers: int) -> list[str]:
        return windows_from_max_window_layers(hf, window, n_layers)


FAMILY = Qwen3()
