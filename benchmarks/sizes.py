"""What a bench measures: the model and settings of `python train.py <overrides>` and the sizes of its runs."""
from __future__ import annotations

from dataclasses import dataclass, replace

from omegaconf import DictConfig

from settings import compose_config
from training.config import check_train_config, model_config


@dataclass
class Sizes:
    overrides: list[str]  # train.py's: every model and train.* setting of every peer is composed from them
    prompt_tokens: int
    new_tokens: int
    decode_batches: tuple[int, int]
    decode_context: int  # holds prompt_tokens + new_tokens
    prefill_tokens: int
    peak_n: int
    repeats: int

    def compose(self, *switches: str) -> DictConfig:
        """`python train.py <overrides> <switches>`'s settings, checked as train.py checks them before it builds
        anything (a bad one raises a composition error or ConfigError)."""
        cfg = compose_config(self.overrides + list(switches))
        check_train_config(cfg.train, world_size=1)
        model_config(cfg)  # a model setting that cannot build a model raises ConfigError here
        return cfg


def full_sizes(overrides: list[str]) -> Sizes:
    """What `python train.py <overrides>` trains (default: llama_tiny and its vocabulary), at the bench's sizes."""
    return Sizes(list(overrides), prompt_tokens=16, new_tokens=512, decode_batches=(1, 8), decode_context=1024,
                 prefill_tokens=256, peak_n=2048, repeats=5)


# --quick: the same code paths at toy sizes, for the test of the JSON's shape; its figures mean nothing. The depth
# is the model's own: a 3:1 hybrid on fewer than 4 layers would have no attention layer (and is refused).
QUICK_OVERRIDES = ["model.d_model=64", "model.context_length=32", "data.vocab_size=256",
                   "train.batch_size=2", "train.micro_batch_size=null"]


def quick_sizes(overrides: list[str]) -> Sizes:
    return Sizes(QUICK_OVERRIDES + list(overrides), prompt_tokens=4, new_tokens=8, decode_batches=(1, 2),
                 decode_context=64, prefill_tokens=32, peak_n=256, repeats=2)


STREAM_TOKENS = 20_000  # --streaming's new tokens (--quick: the quick sizes' context times 3)
STREAM_SINKS = 4  # StreamingLLM's sink tokens (Xiao et al. 2023 keep 4)
LONG_FACTOR = 32  # --caches --long: the context YaRN stretches the preset's to (--quick: QUICK_LONG_FACTOR)
QUICK_LONG_FACTOR = 4


def long_sizes(sizes: Sizes, factor: int) -> Sizes:
    """The preset's context stretched `factor` times by YaRN, and a generation from the prompt to its end."""
    trained = sizes.compose().model.context_length
    context = factor * trained
    stretched = [f"model.context_length={context}", f"model.rope_original_context={trained}",
                 "model.rope_scaling=yarn", f"model.rope_factor={factor}"]
    return replace(sizes, overrides=[*sizes.overrides, *stretched], decode_context=context,
                   new_tokens=context - sizes.prompt_tokens)
