"""Shared by the interop tests (transformers, GGUF): a tiny corpus for the tokenizer, a LLaMA config that a
mapping dropping any setting fails, texts where tokenizer conversions usually differ, export's command line."""
import torch

import export
from generation.engine import Engine
from model.config import ModelConfig
from model.transformer import Transformer

VOCAB = 300
PROMPT = "to be or not"
# whitespace runs, tabs, newlines, accents and emoji: where tokenizer conversions usually differ
TEXTS = ["the quick brown fox", " leading space", "double  space\tand tab\nnewline", "accents é ü, emoji 🙂",
         "  ", "x\n\n  y  "]


def corpus() -> list[str]:
    words = "the quick brown fox jumps over a  lazy dog\tto be or not that is the question".split(" ")
    gen = torch.Generator().manual_seed(0)
    return [" ".join(words[i] for i in torch.randint(len(words), (12,), generator=gen)) for _ in range(500)]


def llama_cfg(**overrides) -> ModelConfig:
    # GQA, a non-default rope base and eps: a mapping that drops any of them fails
    return ModelConfig(**dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                              context_length=64, rope_base=500.0, norm_eps=1e-4) | overrides)


def greedy_ids(model: Transformer, prompt: list[int], eos_id: int | None, n: int = 40) -> list[int]:
    return [int(step[0]) for step in Engine(model).generate([prompt], n, temperature=0, eos_id=eos_id)]


def run_export(*args) -> int:
    return export.main([str(a) for a in args])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err
