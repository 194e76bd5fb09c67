"""Ministral: MinistralForCausalLM, LLaMA with a sliding window in the layers its config.json's layer_types names."""
from interop.families.base import local_layer_types
from interop.families.llama import Llama
from model.config import ModelConfig


class Ministral(Llama):
    name, model_type, class_name = "Ministral", "ministral", "MinistralForCausalLM"
    fixed = {"hidden_act": "silu"}
    reads_windows = True

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.window is not None and cfg.window_pattern != "all"

    def window_keys(self, cfg: ModelConfig) -> dict:
        return {"sliding_window": cfg.window, "layer_types": local_layer_types(cfg)}


FAMILY = Ministral()
