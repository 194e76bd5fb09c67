"""Batches from a flat token stream: x is a window of T tokens, y the same window shifted by one."""
import numpy as np
import torch


def windows_at(tokens, starts, context_length: int, device):
    rows = np.stack([tokens[s : s + context_length + 1] for s in starts]).astype(np.int64)
    windows = torch.from_numpy(rows)
    if torch.device(device).type == "cuda":
        windows = windows.pin_memory().to(device, non_blocking=True)
    return windows[:, :-1], windows[:, 1:]


def get_batch(tokens, batch_size: int, context_length: int, generator: torch.Generator, device="cpu"):
    """batch_size random windows; the same generator state gives the same batch (exact resume)."""
    starts = torch.randint(len(tokens) - context_length, (batch_size,), generator=generator)
    return windows_at(tokens, starts.tolist(), context_length, device)


def eval_batches(tokens, batch_size: int, context_length: int, n_windows: int, device="cpu"):
    """A fixed set of n_windows windows spread evenly over the whole stream, in batches of batch_size (the
    last one holds the rest): every evaluation, whatever the batch size, scores the same tokens."""
    starts = np.linspace(0, len(tokens) - context_length - 1, n_windows).round().astype(int)
    return [windows_at(tokens, starts[i : i + batch_size], context_length, device)
            for i in range(0, len(starts), batch_size)]
