"""The training loss, and the validation metrics computed from it over a fixed set of batches.

    loss = mean over the B*T positions of -log p(y | x)            (nats per token)
    val_ppl = exp(val_loss)
    val_bpb = val_loss / ln 2 / bytes_per_token                     (bits per byte of val text)
bpb divides out the tokenizer: a bigger vocab packs more bytes into each token, which raises the
loss per token but not the cost per byte, so bpb compares runs across vocab sizes and corpora.
"""
import math
from contextlib import AbstractContextManager

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def next_token_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x, y: [B, T] token ids, y[:, t] the token after x[:, t]. The logits [B, T, V] go to fp32
    for the softmax, which bf16 autocast would otherwise compute in bf16."""
    return F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], autocast: AbstractContextManager,
             bytes_per_token: float) -> dict:
    model.eval()
    with autocast:
        val_loss = sum(next_token_loss(model, x, y).item() for x, y in batches) / len(batches)
    model.train()
    val_ppl = math.exp(val_loss) if val_loss < 700 else math.inf  # exp(710) overflows a float
    return {"val_loss": val_loss, "val_bpb": val_loss / math.log(2) / bytes_per_token, "val_ppl": val_ppl}


def unigram_bpb(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int, bytes_per_token: float) -> float:
    """The val bpb of the unigram solution: each val token predicted by its add-one smoothed frequency
    in the train split, whatever came before it. A model stuck near it has learnt no use of context."""
    counts = np.bincount(train_tokens, minlength=vocab_size)[:vocab_size] + 1.0
    nats = -np.log(counts[val_tokens] / counts.sum()).mean()
    return float(nats / math.log(2) / bytes_per_token)
