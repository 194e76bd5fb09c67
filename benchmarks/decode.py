"""Decode and prefill tokens/s: this repo's Engine against transformers' generate, each kind of cache, and
generation past the context."""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from functools import partial

import torch
from torch import nn
from transformers.generation.streamers import BaseStreamer

from benchmarks.hf import build_pair
from benchmarks.sizes import STREAM_SINKS, Sizes
from benchmarks.timing import Device, memory_bandwidth, speed_rows, speed_table, timed_alternately
from generation.engine import Engine, compiled_decoder
from model import ModelConfig, Transformer
from training.config import model_config


class StepClock(BaseStreamer):
    """transformers' generate hands it the prompt, then each step's new tokens: it keeps the times."""

    def __init__(self):
        self.start, self.times = time.perf_counter(), []

    def put(self, value):
        self.times.append(time.perf_counter() - self.start)

    def end(self):
        pass


def our_generation(model: Transformer, prompts: torch.Tensor, new_tokens: int, use_cache: bool, device: Device,
                   compile: bool = False, engine_class: type = Engine):
    """A run returning the time from its start at which each new token was out, and the tokens [B, new].
    compile: the decode step through torch.compile, compiled here; run.compile_s is what that took.
    engine_class: another checkout's Engine (--against)."""
    engine, prompt_lists = engine_class(model), prompts.tolist()
    compile_s = compiled_decoder(engine, prompts.shape[0]) if compile else 0.0

    def run():
        start, times, ids = time.perf_counter(), [], []
        with device.autocast():
            for step_ids in engine.generate(prompt_lists, new_tokens, temperature=0, use_cache=use_cache):
                times.append(time.perf_counter() - start)
                ids.append(step_ids)
        return times, torch.stack(ids, dim=1)
    run.compile_s = compile_s
    return run


def their_generation(model: nn.Module, prompts: torch.Tensor, new_tokens: int, device: Device):
    def run():
        clock = StepClock()
        with torch.inference_mode(), device.autocast():
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                                 streamer=clock)
        return clock.times[1:], out[:, prompts.shape[1]:]  # times[0] is the prompt's
    return run


def our_prefill(model: Transformer, prompts: torch.Tensor, device: Device):
    def run():
        cache = model.new_kv_cache(prompts.shape[0], prompts.shape[1])
        with torch.inference_mode(), device.autocast():
            return model(prompts, 0, cache, last_only=True)[:, -1]
    return run


def their_prefill(model: nn.Module, prompts: torch.Tensor, device: Device):
    def run():
        with torch.inference_mode(), device.autocast():
            return model(input_ids=prompts, use_cache=True, logits_to_keep=1).logits[:, -1]  # fills a new cache
    return run


def bench_decode(model: ModelConfig, sizes: Sizes, repeats: int, device: Device,
                 compile: bool = True) -> tuple[dict, dict]:
    ours, theirs = build_pair(replace(model, context_length=sizes.decode_context), device)
    ours.eval(), theirs.eval()
    vocab, new = model.vocab_size, sizes.new_tokens
    # A batch-1 decode step reads every weight once: at the machine's bandwidth that caps its tokens/s.
    bandwidth = memory_bandwidth(device)
    weight_bytes = sum(p.nbytes for p in ours.parameters())
    results = {"memory_bandwidth_gb_per_s": bandwidth / 1e9, "weight_bytes": weight_bytes,
               "streaming_limit_tokens_per_s": bandwidth / weight_bytes}
    curves = {}
    for batch in sizes.decode_batches:
        prompts = torch.randint(vocab, (batch, sizes.prompt_tokens), device=device.name)
        runs = {"ours": our_generation(ours, prompts, new, use_cache=True, device=device),
                "theirs": their_generation(theirs, prompts, new, device)}
        if compile:  # its warm-up run compiles the decode step
            runs["ours, compiled"] = our_generation(ours, prompts, new, use_cache=True, device=device, compile=True)
        seconds, last, _ = timed_alternately(f"decode, batch {batch}", runs, repeats, device)
        ours_tps, theirs_tps = (batch * new / statistics.median(seconds[name]) for name in ("ours", "theirs"))
        suffix = "" if batch == 1 else f"_b{batch}"
        results |= {f"decode{suffix}_tokens_per_s": ours_tps, f"hf_decode{suffix}_tokens_per_s": theirs_tps,
                    f"decode{suffix}_ratio": ours_tps / theirs_tps,
                    # one greedy sequence on the same weights: they part only on a near-tie of two logits
                    f"decode{suffix}_same_tokens": bool(torch.equal(last["ours"][1], last["theirs"][1])),
                    f"decode{suffix}_s": seconds["ours"], f"hf_decode{suffix}_s": seconds["theirs"]}
        if compile:
            compiled_tps = batch * new / statistics.median(seconds["ours, compiled"])
            results |= {f"compiled_decode{suffix}_tokens_per_s": compiled_tps,
                        f"compiled_decode{suffix}_ratio": compiled_tps / theirs_tps,
                        f"compiled_decode{suffix}_compile_s": runs["ours, compiled"].compile_s,
                        f"compiled_decode{suffix}_same_tokens": bool(torch.equal(last["ours"][1],
                                                                                 last["ours, compiled"][1])),
                        f"compiled_decode{suffix}_s": seconds["ours, compiled"]}
        if batch == 1:
            curves |= {name: last[key][0] for name, key in (
                ("nanollama, KV cache", "ours"), ("nanollama, KV cache, compiled", "ours, compiled"),
                ("transformers, KV cache", "theirs")) if key in last}
            # once, and without a warm-up (the cached runs warmed the same model): it is the slow one
            nocache_seconds, nocache, _ = timed_alternately("decode, batch 1", {
                "ours, no cache": our_generation(ours, prompts, new, use_cache=False, device=device)}, 1, device,
                warm_up=False)
            nocache_tps = new / nocache_seconds["ours, no cache"][0]
            curves["nanollama, no cache"] = nocache["ours, no cache"][0]
            results |= {"nocache_decode_tokens_per_s": nocache_tps, "cache_vs_nocache": ours_tps / nocache_tps,
                        "nocache_decode_s": nocache_seconds["ours, no cache"],
                        "decode_vs_limit": ours_tps / results["streaming_limit_tokens_per_s"]}
    prompts = torch.randint(vocab, (1, sizes.prefill_tokens), device=device.name)
    seconds, _, _ = timed_alternately("prefill", {"ours": our_prefill(ours, prompts, device),
                                               "theirs": their_prefill(theirs, prompts, device)}, repeats, device)
    ours_tps, theirs_tps = (sizes.prefill_tokens / statistics.median(seconds[name]) for name in ("ours", "theirs"))
    results |= {"prefill_tokens_per_s": ours_tps, "hf_prefill_tokens_per_s": theirs_tps,
                "prefill_ratio": ours_tps / theirs_tps}
    return results, curves


CACHE_KINDS = ("gqa", "mqa", "mla")  # attention=...: the preset's K/V heads, one K/V head, a latent


def cache_peers(sizes: Sizes, device: Device) -> dict[str, Transformer]:
    """The preset's model under each attention=<kind>, with the decode's context, on random weights."""
    return {kind: Transformer(replace(model_config(sizes.compose(f"attention={kind}")),
                                      context_length=sizes.decode_context)).to(device.name).eval()
            for kind in CACHE_KINDS}


def bench_caches(models: dict[str, Transformer], sizes: Sizes, repeats: int, device: Device) -> dict:
    """At each decode batch, speed_rows of a greedy generation with each model's cache, alternated, with its
    cache bytes per token (the models' dtype), parameters, and the bytes of the generation's cache and weights."""
    results = {}
    for batch in sizes.decode_batches:
        prompts = torch.randint(next(iter(models.values())).cfg.vocab_size, (batch, sizes.prompt_tokens),
                                device=device.name)
        runs = {kind: our_generation(m, prompts, sizes.new_tokens, use_cache=True, device=device)
                for kind, m in models.items()}
        seconds, _, _ = timed_alternately(f"decode, batch {batch}", runs, repeats, device)
        rows = speed_rows(seconds, {kind: batch * sizes.new_tokens for kind in runs}, "gqa")
        for kind, row in rows.items():
            per_token = models[kind].kv_cache_bytes_per_token(models[kind].tok_emb.weight.dtype)
            row |= {"cache_bytes_per_token": per_token, "num_params": models[kind].num_params(),
                    "cache_bytes": per_token * (sizes.prompt_tokens + sizes.new_tokens) * batch,
                    "weight_bytes": sum(p.nbytes for p in models[kind].parameters())}
        results[f"batch {batch}"] = rows
    return results


def streaming_peers(sizes: Sizes, device: Device) -> dict[str, tuple[Transformer, int | None]]:
    """--streaming's three ways: (the model, its sink tokens: None slides, or streams where every layer is local)."""
    cfg = model_config(sizes.compose())
    full = Transformer(cfg).to(device.name).eval()
    windowed = Transformer(replace(cfg, window=max(1, cfg.context_length // 4))).to(device.name).eval()
    return {"slide": (full, None), "sinks": (full, STREAM_SINKS), "window": (windowed, None)}


def bench_streaming(peers: dict[str, tuple[Transformer, int | None]], sizes: Sizes, new_tokens: int, repeats: int,
                    device: Device) -> dict:
    """At each decode batch, speed_rows of a greedy generation of new_tokens, each way in turn, and the bytes of
    each way's cache."""
    results = {}
    for batch in sizes.decode_batches:
        model = peers["slide"][0]
        prompts = torch.randint(model.cfg.vocab_size, (batch, sizes.prompt_tokens), device=device.name)
        runs = {name: our_generation(m, prompts, new_tokens, use_cache=True, device=device,
                                     engine_class=partial(Engine, sink_tokens=sinks))
                for name, (m, sinks) in peers.items()}
        seconds, _, _ = timed_alternately(f"{new_tokens:,} tokens, batch {batch}", runs, repeats, device)
        rows = speed_rows(seconds, {name: batch * new_tokens for name in runs}, "slide")
        for name, row in rows.items():
            m = peers[name][0]
            row["cache_bytes"] = m.kv_cache_bytes(min(m.cfg.context_length, sizes.prompt_tokens + new_tokens - 1),
                                                  batch, m.tok_emb.weight.dtype)
        results[f"batch {batch}"] = rows
    return results


def streaming_tables(results: dict) -> str:
    columns = {"cache bytes": lambda row: f"{row['cache_bytes']:,}"}
    return "\n\n".join(f"{batch}\n\n" + speed_table(rows, "way", "slide", columns, "decode tokens/s")
                       for batch, rows in results.items())


def caches_tables(results: dict) -> str:
    columns = {"cache bytes/token": lambda row: f"{row['cache_bytes_per_token']:,}",
               "parameters": lambda row: f"{row['num_params']:,}",
               "cache MB / weights MB": lambda row: f"{row['cache_bytes'] / 1e6:.2f} / {row['weight_bytes'] / 1e6:.2f}"}
    return "\n\n".join(f"{batch}\n\n" + speed_table(rows, "attention", "gqa", columns, "decode tokens/s")
                       for batch, rows in results.items())
