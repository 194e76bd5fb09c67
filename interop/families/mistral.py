"""Mistral: MistralForCausalLM, LLaMA with a sliding window (model.window) in every layer."""
from interop.families.llama import Llama
from model.config import ModelConfig


class Mistral(Llama):
    name, model_type, class_name = "Mistral", "mistral", "MistralForCausalLM"
    fixed = {"hidden_act": "silu"}
    reads_windows = every_layer_window = True

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.window is not None and cfg.window_pattern == "all"

    def window_keys(self, cfg: ModelConfig) -> dict:
        return {"sliding_window": cfg.window}


FAMILY = Mistral()
