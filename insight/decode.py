"""The KV cache's speed, measured: the time of each generated token against its position, with the cache and
without it, through generation/engine.py as generate.py runs it (greedy, batch 1, from a one-token prompt to a
full context).

    cached step at position t:   one token's projections, norms and FFN, O(d^2), and its query against t + 1
                                 cached keys, O(t d): it grows with t, it is not O(1)
    uncached step at position t: the whole forward over t + 1 tokens, O(t d^2 + t^2 d); O(n^2 d) and more in all
"""
import time

from generation.engine import Engine
from model.transformer import Transformer


def step_times(engine: Engine, first_token: int, use_cache: bool) -> list[float]:
    """Seconds of each step after the prefill: entry i feeds the token at position i + 1, up to the last position."""
    context = engine.model.cfg.context_length
    steps = engine.generate([[first_token]], context, temperature=0, use_cache=use_cache)
    next(steps)  # the prefill of the one-token prompt and the first pick
    times = []
    for _ in range(context - 1):
        clock = time.perf_counter()
        next(steps)
        times.append(time.perf_counter() - clock)
    return times


def decode_times(model: Transformer, first_token: int, repeats: int = 3) -> dict:
    """Per position 1 .. context_length - 1, the fastest of `repeats` runs of each step with the cache and without
    it (the machine's other work only ever adds time; the runs alternate, so a busy moment falls on both), and
    the bytes of the cache the cached run allocated."""
    engine = Engine(model)
    step_times(engine, first_token, use_cache=True)  # warm-up: the first calls of each kernel cost more
    cached, uncached = [], []
    for _ in range(repeats):
        cached.append(step_times(engine, first_token, use_cache=True))
        cache_bytes = engine.stats.cache_bytes
        uncached.append(step_times(engine, first_token, use_cache=False))
    return {"positions": list(range(1, model.cfg.context_length)),
            "cached_s": [min(at) for at in zip(*cached)], "uncached_s": [min(at) for at in zip(*uncached)],
            "cache_bytes": cache_bytes, "cache_bytes_per_token": model.kv_cache_bytes_per_token()}
