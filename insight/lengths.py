"""The loss at any length: a checkpoint's val split scored in windows of L tokens, as a whole and by position.

Three ways to cut a token stream s into windows of L tokens (x = s[a : a + L], y = s[a + 1 : a + L + 1]):
    chunked   a = 0, L, 2L, ...: every token is scored once, at its position inside its window, so the early
              positions of each window are scored with little context (Press et al. 2022's early-token curse)
    sliding   a = 0, S, 2S, ... (stride S): the first window scores all its L tokens, each later one only its
              last S, so every token after the first window is scored with at least L - S tokens before it
    training  training's own eval set (data/batches.py's eval_batches): `count` windows (train.eval_tokens // L)
              spread evenly over the whole stream, every token scored; at the trained length it is the set whose
              val bpb the run logged, so the two numbers agree to float precision (docs/long_context.md)
    streaming chunked windows, each read as a generation reads past its context without re-prefilling: its first
              C (the trained context) tokens prefilled into a cache of C positions, then one token at a time, the
              cache keeping S sink tokens and a rolling window of the last C - S (StreamingLLM, model/kv_cache.py;
              S = 0 the window alone), or a windowed model's own rolling cache (sink_tokens None)
Per window and position t, nats(t) = -ln p(y_t | x_0..t). For a length, the result is the mean over the scored
tokens, as bits per byte (nats / ln 2 / the split's bytes per token, training/evaluate.py), and the same mean per
bucket of `bucket` positions: the loss against position, which shows where a model stops using its positions.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from data import prepare_data
from data.batches import eval_batches, windows_at
from errors import UsageError
from model.positions import position_limit
from model.transformer import Transformer
from storage.checkpoint import run_dir_of

MODES = ("chunked", "sliding", "training", "streaming")
REPORT_MULTIPLES = (1, 2, 4)  # the report's lengths, in trained contexts
REPORT_TOKENS = 16384  # the val split's first tokens the report scores


def run_config(ckpt_dir: Path) -> DictConfig:
    """The config.yaml of the training run that holds ckpt_dir."""
    run_dir = run_dir_of(ckpt_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"no config.yaml in {run_dir}, so no val split to score: give a training run's dir")
    return OmegaConf.load(run_dir / "config.yaml")


def run_val_split(ckpt_dir: Path) -> tuple[np.ndarray, float]:
    """(the val token stream, its bytes per token) of the training run that holds ckpt_dir: its config.yaml's data
    settings, through the token cache training built (data/prepare.py rebuilds a missing one)."""
    config = run_config(ckpt_dir)
    return prepare_data(config.data, config.model.context_length, 1).val_split()


def window_starts(n_tokens: int, length: int, mode: str, stride: int) -> list[int]:
    """The chunked (and streaming) or sliding windows' first positions in a stream of n_tokens (each window needs
    length + 1)."""
    last = n_tokens - length - 1
    step = stride if mode == "sliding" else length  # chunked and streaming: windows end to end
    return list(range(0, last + 1, step))


def window_count(n_tokens: int, length: int, mode: str, stride: int, count: int | None = None) -> int:
    """The windows a mode scores (`count`: the training mode's, train.eval_tokens // length)."""
    return count if mode == "training" else len(window_starts(n_tokens, length, mode, stride))


def window_batches(stream: np.ndarray, length: int, mode: str, stride: int, batch_size: int, count: int | None):
    """Yields (x, y, scored) per batch of windows: inputs and targets [b, length], and the positions of each window
    that count. The training mode's batches are training's own (eval_batches), so no second copy of its rule; the
    streaming mode's windows are the chunked ones."""
    if mode == "training":
        for x, y in eval_batches(stream, batch_size, length, count):
            yield x, y, torch.ones_like(y, dtype=torch.bool)
        return
    starts = window_starts(len(stream), length, mode, stride)
    for first in range(0, len(starts), batch_size):
        batch = starts[first:first + batch_size]
        x, y = windows_at(stream, batch, length, "cpu")
        scored = torch.ones_like(y, dtype=torch.bool)
        if mode == "sliding":  # every window but the stream's first scores only its last `stride` positions
            scored[[i for i, a in enumerate(batch) if a > 0], :length - stride] = False
        yield x, y, scored


def streamed_logits(model: Transformer, x: torch.Tensor, sink_tokens: int | None) -> torch.Tensor:
    """x: [B, L] read as the streaming mode reads it: the first C tokens prefilled into a cache of the trained
    context C, then one at a time, the cache rolling (module docstring) -> logits [B, L, V]. The position tables
    must already cover L (fit_positions), so that no step regrows them."""
    context = model.cfg.context_length
    cache = model.new_kv_cache(x.shape[0], context, sink_tokens=sink_tokens)
    steps = [model(x[:, :context], 0, cache)]
    steps += [model(x[:, t:t + 1], t, cache) for t in range(context, x.shape[1])]
    return torch.cat(steps, dim=1)


@torch.no_grad()
def position_nats(model: Transformer, stream: np.ndarray, length: int, mode: str, stride: int,
                  batch_size: int = 8, count: int | None = None,
                  sink_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the summed nats, the scored tokens) at each position 0 .. length - 1 of the windows, as float64 arrays."""
    nats, counts = np.zeros(length), np.zeros(length)
    device = model.tok_emb.weight.device
    for x, y, scored in window_batches(stream, length, mode, stride, batch_size, count):
        logits = streamed_logits(model, x.to(device), sink_tokens) if mode == "streaming" else model(x.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32)),
                               y.to(device).flatten(), reduction="none").view(y.shape).double().cpu()
        nats += (loss * scored).sum(0).numpy()
        counts += scored.sum(0).numpy()
    return nats, counts


def score(model: Transformer, stream: np.ndarray, length: int, mode: str, stride: int, bucket: int,
          bytes_per_token: float, batch_size: int = 8, count: int | None = None,
          sink_tokens: int | None = None) -> dict:
    """One length, one mode: val bpb over every scored token and per bucket of positions."""
    nats, counts = position_nats(model, stream, length, mode, stride, batch_size, count, sink_tokens)
    to_bpb = 1 / math.log(2) / bytes_per_token
    buckets = []
    for start in range(0, length, bucket):
        end = min(start + bucket, length)
        tokens = counts[start:end].sum()
        if tokens:
            buckets.append({"start": start, "end": end, "tokens": int(tokens),
                            "val_bpb": float(nats[start:end].sum() / tokens * to_bpb)})
    return {"length": length, "mode": mode, "stride": stride if mode == "sliding" else None,
            "sink_tokens": sink_tokens if mode == "streaming" else None,
            "windows": window_count(len(stream), length, mode, stride, count), "tokens": int(counts.sum()),
            "val_bpb": float(nats.sum() / counts.sum() * to_bpb), "buckets": buckets}


def report_windows(stream: np.ndarray, length: int) -> torch.Tensor:
    """[N, length]: the chunked windows of the val split's first REPORT_TOKENS tokens that past_context scores at
    that length (N = 0 when the split is shorter than one window and its next token)."""
    stream = stream[:REPORT_TOKENS]
    rows = [stream[a:a + length] for a in window_starts(len(stream), length, "chunked", length)]
    return torch.from_numpy(np.stack(rows).astype(np.int64)) if rows else torch.empty(0, length, dtype=torch.long)


def past_context(model: Transformer, stream: np.ndarray, bytes_per_token: float) -> dict:
    """The report's section: chunked val bpb by position at 1, 2 and 4 times the trained context (a learned table:
    its own context only), on the val split's first REPORT_TOKENS tokens."""
    cfg = model.cfg
    stream = stream[:REPORT_TOKENS]
    limit = position_limit(cfg)  # a learned table's, which reads no position past its own context
    lengths = [n for n in (k * cfg.context_length for k in REPORT_MULTIPLES)
               if n < len(stream) and (limit is None or n <= limit)]
    return {"context_length": cfg.context_length, "original_context": cfg.original_context, "position": cfg.position,
            "rope_scaling": cfg.rope_scaling, "rope_factor": cfg.rope_factor, "val_tokens": len(stream),
            "results": [score(model, stream, n, "chunked", n, max(1, cfg.original_context // 4), bytes_per_token)
                        for n in lengths]}
