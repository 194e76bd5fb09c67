"""Qwen2: Qwen2ForCausalLM, LLaMA with biases on the q, k and v projections. This repo's projections have biases all
or none (model.bias), so it neither exports nor imports Qwen2; it reads a Qwen2 config.json's windows as transformers
does, the Qwen way (qwen3.py), for the KV-cache estimator (generation/kv_memory.py)."""
from interop.families.base import Family
from interop.families.qwen3 import qwen_sliding_window, windows_from_max_window_layers


class Qwen2(Family):
    name, model_type, class_name = "Qwen2", "qwen2", "Qwen2ForCausalLM"
    refusal = ("its q, k and v projections have biases and its output and MLP projections none, where this repo's "
               "projections have biases all or none (model.bias)")

    def sliding_window(self, hf: dict) -> int | None:
        return qwen_sliding_window(hf)

    def default_layer_types(self, hf: dict, window: int | None, n_layers: int) -> list[str]:
        return windows_from_max_window_layers(hf, window, n_layers)


FAMILY = Qwen2()
