"""Throughput of this repo's models against their peers, in one process on one machine.

    python bench.py [--device cpu|cuda] [--threads N] [--repeats N] [--json PATH] [--plot PATH] [--quick] [overrides]
    python bench.py --ablation [--repeats N] [--json PATH]    # training tokens/s of each ablation variant

llama_tiny is what `python train.py` trains (configs/, composed as train.py composes it). transformers'
LlamaForCausalLM gets its sizes and its weights (copied through interop/hf_llama.py), the same inputs and the
same thread count. The timed runs alternate (A B C, C B A, A B C, ...) so that noise from other processes hits
every peer, and every figure is the median over --repeats runs after one untimed warm-up. Machines are
shared: compare the ratios, not the absolute figures.

Training: tokens/s of forward + cross-entropy + backward + AdamW step on train.batch_size sequences of
llama_tiny's context, the optimizer built as train.py builds it (training/optim.py) for every peer:
    llama_tiny, eagerly (train.compile=false, the default) and, on a copy of the same weights, with its loss
    (forward and cross-entropy) through torch.compile as train.compile=true runs it (its untimed warm-up step
    compiles: that time is reported apart);
    this repo's GPT-2 configuration of the same sizes (norm=layernorm position=learned attention=mha ffn=gelu);
    transformers' LlamaForCausalLM and GPT2LMHeadModel (exact GELU, biases as GPT-2 has them), eagerly;
    llama_tiny with one component switched to the GPT-2 configuration's: what that component costs.
CPU runs fp32; --device cuda runs under bf16 autocast. One formula for every row:
    MFU = FLOPs per token * tokens/s / peak FLOP/s
    FLOPs per token = 6 * N_matmul + 6 * L * T * d
      N_matmul: the weights that multiply activations (every nn.Linear of this repo's model of that
      configuration, the LM head included; the embedding lookup multiplies nothing). 2 FLOPs per
      multiply-add, x3 for forward + backward. Attention: q k^T and att v each take T_keys * d
      multiply-adds per token and layer; under the causal mask a token sees T_keys = T / 2 keys on
      average. (PaLM's convention counts all T: 12 L T d.)
    peak = the best n x n torch.matmul (n = 2048) of the run, timed between the training steps.
Decode: greedy, 512 new tokens after a 16-token prompt, at batch 1 and 8; tokens/s = batch * 512 / the wall
time of the whole generation, the prompt's prefill included. Ours through generation.engine.Engine with and
without the KV cache (the no-cache run once, at batch 1: it takes minutes at batch 8) and with the cache under
generation.engine.compiled_decoder (its warm-up run compiles the decode step: that time is reported apart), theirs through
generate(use_cache=True, do_sample=False, min_new_tokens=512). 16 + 512 tokens do not fit llama_tiny's
256-token context, so both decode models have context_length = max_position_embeddings = 1024.
Prefill: one forward over a 256-token prompt into an empty cache, logits of the last position only
(what generation needs; transformers' generate asks for the same with logits_to_keep=1).
The weight-streaming limit: a batch-1 decode step reads every weight once, so it cannot beat
bandwidth / weight bytes tokens/s; bandwidth is the best of 5 copies of a 256 MB tensor (read + write).
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.generation.streamers import BaseStreamer

from cli import Parser
from errors import UsageError
from generation.engine import Engine, compiled_decoder
from interop.hf_llama import hf_config, hf_state_dict
from model import ModelConfig, Transformer
from settings import compose_config
from storage.files import atomic_write, write_json
from training.config import autocast_for, model_config
from training.evaluate import next_token_loss
from training.optim import make_optimizer

TRAIN = compose_config([]).train  # train.py's settings: the batch size and the optimizer every peer gets
# CPU fp32: llama_tiny's training tokens/s against this repo's GPT-2 configuration (eager, and train.compile=true)
# and transformers' LLaMA; the default decode (what generate.py runs) against transformers' and the limit
# that streaming every weight once per token sets
TARGETS = {"train_vs_gpt2": 1.0, "train_vs_hf_llama": 1.2, "compiled_train_vs_gpt2": 1.15, "decode_ratio": 3.0,
           "decode_vs_limit": 0.4, "cache_vs_nocache": 5.0}


@dataclass
class Sizes:
    dims: dict
    batch_size: int  # training sequences per step
    context: int  # training sequence length
    prompt_tokens: int
    new_tokens: int
    decode_batches: tuple[int, int]
    decode_context: int  # holds prompt_tokens + new_tokens
    prefill_tokens: int
    peak_n: int
    repeats: int


def full_sizes(overrides: list[str]) -> Sizes:
    """What `python train.py <overrides>` trains (default: llama_tiny and its vocabulary), at the bench's sizes."""
    cfg = compose_config(overrides)
    dims = {key: cfg.model[key] for key in ("d_model", "n_layers", "n_heads", "n_kv_heads")}
    return Sizes(dims | {"vocab_size": model_config(cfg).vocab_size}, batch_size=cfg.train.batch_size,
                 context=cfg.model.context_length, prompt_tokens=16, new_tokens=512, decode_batches=(1, 8),
                 decode_context=1024, prefill_tokens=256, peak_n=2048, repeats=5)


# --quick: the same code paths at toy sizes, for the test of the JSON's shape; its figures mean nothing.
QUICK = Sizes(dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2), batch_size=2, context=32,
              prompt_tokens=4, new_tokens=8, decode_batches=(1, 2), decode_context=64, prefill_tokens=32,
              peak_n=256, repeats=2)


def parse_args(argv):
    parser = Parser(description="Training, decode and prefill throughput against transformers' LLaMA.")
    parser.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (bf16 autocast)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads for both implementations (default: torch's, %(default)s here)")
    parser.add_argument("--repeats", type=int, help="timed runs of each measurement (default 5, --quick 2)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a PNG of decode tokens/s against generated length")
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks that everything runs")
    parser.add_argument("--ablation", action="store_true",
                        help="only the ablation's variants: training tokens/s of each, alternated")
    parser.add_argument("overrides", nargs="*", help="train.py's Hydra overrides of the LLaMA to measure, e.g. "
                        "model.d_model=256 model.n_layers=6 (default: llama_tiny)")
    args = parser.parse_args(argv)
    if args.device not in ("cpu", "cuda"):
        raise UsageError(f"--device={args.device!r} must be cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device=cuda but torch sees no CUDA device")
    if args.threads < 1:
        raise UsageError(f"--threads={args.threads} must be >= 1")
    if args.repeats is not None and args.repeats < 1:
        raise UsageError(f"--repeats={args.repeats} must be >= 1")
    for flag in ("json", "plot"):  # checked now, not after minutes of measuring
        path = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            raise UsageError(f"--{flag}={path}: directory {path.parent} does not exist")
    return args


class Device:
    """Where and in which precision both implementations run, and how to wait for them."""

    def __init__(self, name: str):
        self.name = name
        self.cuda = name == "cuda"

    def autocast(self):
        return autocast_for(torch.device(self.name))  # as train.py trains: bf16 autocast on CUDA, fp32 on CPU

    def sync(self):
        if self.cuda:  # kernels run asynchronously; wait for them before reading the clock
            torch.cuda.synchronize()


def build_pair(dims: dict, context: int, device: Device) -> tuple[Transformer, nn.Module]:
    """Our model and transformers' LlamaForCausalLM with the same config and the same weights."""
    cfg = ModelConfig(**dims, context_length=context)  # defaults: RMSNorm, Pre-Norm, RoPE, SwiGLU, tied
    ours = Transformer(cfg)
    theirs = AutoModelForCausalLM.from_config(LlamaConfig(**hf_config(cfg)), attn_implementation="sdpa")
    missing, unexpected = theirs.load_state_dict(hf_state_dict(ours), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # lm_head is tied
    return ours.to(device.name), theirs.to(device.name)


def timed_alternately(what: str, runs: dict, repeats: int, device: Device,
                      warm_up: bool = True) -> tuple[dict, dict, dict]:
    """Calls the runs in turn, A B C, C B A, A B C ..., `repeats` times, after one untimed call of each if warm_up:
    the order flips every round so that no run always follows the same one.
    Returns ({name: [seconds]}, {name: the last call's return value}, {name: its warm-up call's seconds})."""
    seconds, results, warm_up_s = {name: [] for name in runs}, {}, {}
    print(f"bench: {what}: {', '.join(runs)}, {repeats} timed runs each", file=sys.stderr, flush=True)
    for repeat in range(repeats + warm_up):
        for name, run in list(runs.items())[::1 if repeat % 2 == 0 else -1]:
            device.sync()
            start = time.perf_counter()
            results[name] = run()
            device.sync()
            if repeat >= warm_up:
                seconds[name].append(time.perf_counter() - start)
            else:
                warm_up_s[name] = time.perf_counter() - start
    return seconds, results, warm_up_s


# ---------------------------------------------------------------- the ablation's variants

def bench_ablation(repeats: int, device: Device) -> dict:
    """Training tokens/s of every ablation variant at the ablation's size (+experiment=ablation ablation=X:
    train.batch_size sequences of its context, train.py's AdamW), one training step of each in turn, alternated
    in one process: the speed the learning-rate sweep's runs cannot show, since they shared the cores."""
    from sweep import VARIANTS
    from training.config import model_config

    steps, tokens_per_step = {}, None
    for variant in VARIANTS:
        cfg = compose_config(["+experiment=ablation", f"ablation={variant}"])
        model = Transformer(model_config(cfg)).to(device.name)
        T = model.cfg.context_length
        batch = torch.randint(model.cfg.vocab_size, (cfg.train.batch_size, T + 1), device=device.name)
        steps[variant] = train_step(model, partial(next_token_loss, model), batch, device)
        tokens_per_step = cfg.train.batch_size * T
    seconds, _, _ = timed_alternately("ablation training steps", steps, repeats, device)
    base = statistics.median(seconds["baseline"])
    return {variant: {"tokens_per_s": tokens_per_step / statistics.median(s),
                      "tokens_per_s_range": [tokens_per_step / max(s), tokens_per_step / min(s)],
                      "vs_baseline": base / statistics.median(s)} for variant, s in seconds.items()}


def ablation_table(speeds: dict) -> str:
    rows = ["| variant | training tokens/s (median) | min - max | vs baseline |", "|---|---:|---:|---:|"]
    for variant, r in speeds.items():
        low, high = r["tokens_per_s_range"]
        rows.append(f"| {variant} | {r['tokens_per_s']:,.0f} | {low:,.0f} - {high:,.0f} | {r['vs_baseline']:.3f}x |")
    return "\n".join(rows)


# ---------------------------------------------------------------- training

def train_step(model: nn.Module, loss_of, tokens: torch.Tensor, device: Device):
    """One closure: loss_of(inputs, targets) (train.py's next-token loss), backward, AdamW step on model."""
    optimizer = make_optimizer(model, TRAIN)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        with device.autocast():
            loss = loss_of(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def train_flops_per_token(model: Transformer, context: int) -> int:
    cfg = model.cfg
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6 * n_matmul + 6 * cfg.n_layers * context * cfg.d_model


# The training peers: this repo's own GPT-2 configuration of llama_tiny's sizes, and llama_tiny with one of its
# components switched to that configuration's, so that what each LLaMA component costs is a row of its own.
GPT2_SWITCHES = {"norm": "layernorm", "position": "learned", "attention": "mha", "ffn": "gelu"}


def config_with(dims: dict, context: int, **switches) -> ModelConfig:
    kv_heads = dims["n_heads"] if switches.get("attention") == "mha" else dims["n_kv_heads"]
    return ModelConfig(**{**dims, "n_kv_heads": kv_heads}, context_length=context, **switches)


def hf_gpt2(cfg: ModelConfig) -> nn.Module:
    """transformers' GPT2LMHeadModel of cfg's sizes: LayerNorm, learned positions, MHA, exact GELU 4d, tied head
    (and, being GPT-2, biases in every linear layer and LayerNorm)."""
    from transformers import GPT2Config
    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.d_model,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, activation_function="gelu", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def bench_training(sizes: Sizes, repeats: int, device: Device) -> dict:
    llama, hf_llama = build_pair(sizes.dims, sizes.context, device)
    gpt2_cfg = config_with(sizes.dims, sizes.context, **GPT2_SWITCHES)
    gpt2, compiled = Transformer(gpt2_cfg).to(device.name), copy.deepcopy(llama)  # a copy: its own optimizer
    hf_gpt2_model = hf_gpt2(gpt2_cfg).to(device.name)
    peers = {  # name: (model, its loss of (inputs, targets), the model whose nn.Linear weights count its FLOPs)
        "llama_tiny": (llama, partial(next_token_loss, llama), llama),
        # as train.py compiles: the loss, forward and cross-entropy in one graph
        "llama_tiny, train.compile=true": (compiled, partial(torch.compile(next_token_loss), compiled), llama),
        "GPT-2 configuration": (gpt2, partial(next_token_loss, gpt2), gpt2),
        "transformers LlamaForCausalLM": (hf_llama, partial(next_token_loss, lambda x: hf_llama(input_ids=x).logits),
                                          llama),
        "transformers GPT2LMHeadModel": (hf_gpt2_model, partial(next_token_loss,
                                                                 lambda x: hf_gpt2_model(input_ids=x).logits), gpt2),
    }
    for group, option in GPT2_SWITCHES.items():
        model = Transformer(config_with(sizes.dims, sizes.context, **{group: option})).to(device.name)
        peers[f"llama_tiny {group}={option}"] = (model, partial(next_token_loss, model), model)
    tokens = torch.randint(sizes.dims["vocab_size"], (sizes.batch_size, sizes.context + 1), device=device.name)
    dtype = torch.bfloat16 if device.cuda else torch.float32
    a, b = (torch.randn(sizes.peak_n, sizes.peak_n, device=device.name, dtype=dtype) for _ in range(2))
    product, matmul_seconds = torch.empty_like(a), []

    def matmuls():  # three in a row: the best of them all is the peak
        for _ in range(3):
            device.sync()
            start = time.perf_counter()
            torch.matmul(a, b, out=product)
            device.sync()
            matmul_seconds.append(time.perf_counter() - start)
    for model, _, _ in peers.values():
        model.train()
    steps = {name: train_step(model, loss_of, tokens, device) for name, (model, loss_of, _) in peers.items()}
    seconds, _, warm_up_s = timed_alternately("training", steps | {"peak matmul": matmuls}, repeats, device)
    tokens_per_step = sizes.batch_size * sizes.context
    peak = 2 * sizes.peak_n ** 3 / min(matmul_seconds)
    rows = {}
    for name, (_, _, counted) in peers.items():
        tps, flops = tokens_per_step / statistics.median(seconds[name]), train_flops_per_token(counted, sizes.context)
        rows[name] = {"tokens_per_s": tps, "tokens_per_s_range": [tokens_per_step / max(seconds[name]),
                                                                  tokens_per_step / min(seconds[name])],
                      "flops_per_token": flops, "mfu": flops * tps / peak, "step_s": seconds[name]}
    base = rows["llama_tiny"]["tokens_per_s"]
    for row in rows.values():
        row["llama_tiny_ratio"] = base / row["tokens_per_s"]
    compiled_tps = rows["llama_tiny, train.compile=true"]["tokens_per_s"]
    return {"training": rows, "peak_gflops": peak / 1e9, "peak_matmul_s": matmul_seconds,
            "compiled_train_compile_s": warm_up_s["llama_tiny, train.compile=true"],  # compiling, then one step
            "train_vs_gpt2": base / rows["GPT-2 configuration"]["tokens_per_s"],
            "train_vs_hf_llama": base / rows["transformers LlamaForCausalLM"]["tokens_per_s"],
            "compiled_train_vs_gpt2": compiled_tps / rows["GPT-2 configuration"]["tokens_per_s"]}


# ---------------------------------------------------------------- decode and prefill

class StepClock(BaseStreamer):
    """transformers' generate hands it the prompt, then each step's new tokens: it keeps the times."""

    def __init__(self):
        self.start, self.times = time.perf_counter(), []

    def put(self, value):
        self.times.append(time.perf_counter() - self.start)

    def end(self):
        pass


def our_generation(model: Transformer, prompts: torch.Tensor, new_tokens: int, use_cache: bool, device: Device,
                   compile: bool = False):
    """A run returning the time from its start at which each new token was out, and the tokens [B, new].
    compile: the decode step through torch.compile, compiled here; run.compile_s is what that took."""
    engine, prompt_lists = Engine(model), prompts.tolist()
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


def memory_bandwidth(device: Device, megabytes: int = 256) -> float:
    """Bytes per second of the best of 5 copies of a `megabytes` fp32 tensor (each reads and writes it once)."""
    src = torch.randn(megabytes * 2**20 // 4, device=device.name)
    dst, best = torch.empty_like(src), math.inf
    for _ in range(5):
        device.sync()
        start = time.perf_counter()
        dst.copy_(src)
        device.sync()
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def bench_decode(sizes: Sizes, repeats: int, device: Device) -> tuple[dict, dict]:
    ours, theirs = build_pair(sizes.dims, sizes.decode_context, device)
    ours.eval(), theirs.eval()
    vocab, new = sizes.dims["vocab_size"], sizes.new_tokens
    # A batch-1 decode step reads every weight once: at the machine's bandwidth that caps its tokens/s.
    bandwidth = memory_bandwidth(device)
    weight_bytes = sum(p.nbytes for p in ours.parameters())
    results = {"memory_bandwidth_gb_per_s": bandwidth / 1e9, "weight_bytes": weight_bytes,
               "streaming_limit_tokens_per_s": bandwidth / weight_bytes}
    curves = {}
    for batch in sizes.decode_batches:
        prompts = torch.randint(vocab, (batch, sizes.prompt_tokens), device=device.name)
        compiled = our_generation(ours, prompts, new, use_cache=True, device=device, compile=True)
        seconds, last, _ = timed_alternately(f"decode, batch {batch}", {
            "ours": our_generation(ours, prompts, new, use_cache=True, device=device),
            "ours, compiled": compiled,  # its warm-up run compiles the decode step
            "theirs": their_generation(theirs, prompts, new, device)}, repeats, device)
        ours_tps, compiled_tps, theirs_tps = (batch * new / statistics.median(seconds[name])
                                              for name in ("ours", "ours, compiled", "theirs"))
        suffix = "" if batch == 1 else f"_b{batch}"
        results |= {f"decode{suffix}_tokens_per_s": ours_tps, f"hf_decode{suffix}_tokens_per_s": theirs_tps,
                    f"decode{suffix}_ratio": ours_tps / theirs_tps,
                    f"compiled_decode{suffix}_tokens_per_s": compiled_tps,
                    f"compiled_decode{suffix}_ratio": compiled_tps / theirs_tps,
                    f"compiled_decode{suffix}_compile_s": compiled.compile_s,
                    # one greedy sequence on the same weights: they part only on a near-tie of two logits
                    f"decode{suffix}_same_tokens": bool(torch.equal(last["ours"][1], last["theirs"][1])),
                    f"compiled_decode{suffix}_same_tokens": bool(torch.equal(last["ours"][1],
                                                                             last["ours, compiled"][1])),
                    f"decode{suffix}_s": seconds["ours"], f"compiled_decode{suffix}_s": seconds["ours, compiled"],
                    f"hf_decode{suffix}_s": seconds["theirs"]}
        if batch == 1:
            curves |= {"nanollama, KV cache": last["ours"][0],
                       "nanollama, KV cache, compiled": last["ours, compiled"][0],
                       "transformers, KV cache": last["theirs"][0]}
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


# ---------------------------------------------------------------- report

def machine(device: Device) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    name = f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}"
    return name + (f", {torch.cuda.get_device_name()}" if device.cuda else "")


def training_table(r: dict, sizes: Sizes) -> str:
    lines = [f"Training, {sizes.batch_size} x {sizes.context} tokens a step (fwd + bwd + AdamW). MFU = FLOPs per token x "
             f"tokens/s / peak, FLOPs per token = 6 N_matmul + 6 L T d for every row, peak {r['peak_gflops']:.0f} "
             f"GFLOP/s (the best {sizes.peak_n}^3 matmul)", "",
             "| model | tokens/s (median) | min - max | MFLOP/token | MFU | llama_tiny / it |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in r["training"].items():
        low, high = row["tokens_per_s_range"]
        lines.append(f"| {name} | {row['tokens_per_s']:,.0f} | {low:,.0f} - {high:,.0f} | "
                     f"{row['flops_per_token'] / 1e6:.1f} | {row['mfu']:.1%} | {row['llama_tiny_ratio']:.3f}x |")
    return "\n".join(lines)


def table(r: dict, sizes: Sizes) -> str:
    b = sizes.decode_batches[1]
    rows = [  # name, value, the key of its target
        ("training: llama_tiny / GPT-2 configuration, eager", r["train_vs_gpt2"], "train_vs_gpt2"),
        ("training: llama_tiny / transformers LlamaForCausalLM", r["train_vs_hf_llama"], "train_vs_hf_llama"),
        (f"training: llama_tiny train.compile=true (compiled in {r['compiled_train_compile_s']:.0f} s) / GPT-2 "
         f"configuration eager", r["compiled_train_vs_gpt2"], "compiled_train_vs_gpt2"),
        (f"decode, batch 1, {sizes.new_tokens} new: {r['decode_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r['hf_decode_tokens_per_s']:,.0f}", r["decode_ratio"], "decode_ratio"),
        (f"decode, batch 1: / the weight-streaming limit {r['streaming_limit_tokens_per_s']:,.0f} tokens/s "
         f"({r['weight_bytes'] / 1e6:.1f} MB at {r['memory_bandwidth_gb_per_s']:.1f} GB/s)", r["decode_vs_limit"],
         "decode_vs_limit"),
        (f"decode, batch 1, torch.compile (compiled in {r['compiled_decode_compile_s']:.0f} s): "
         f"{r['compiled_decode_tokens_per_s']:,.0f} tokens/s / transformers", r["compiled_decode_ratio"], None),
        (f"decode, batch {b}: {r[f'decode_b{b}_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r[f'hf_decode_b{b}_tokens_per_s']:,.0f}", r[f"decode_b{b}_ratio"], None),
        (f"decode, batch {b}, torch.compile (compiled in {r[f'compiled_decode_b{b}_compile_s']:.0f} s) / "
         f"transformers", r[f"compiled_decode_b{b}_ratio"], None),
        (f"decode, batch 1: KV cache / no cache ({r['nocache_decode_tokens_per_s']:,.0f} tokens/s)",
         r["cache_vs_nocache"], "cache_vs_nocache"),
        (f"prefill, {sizes.prefill_tokens}-token prompt: {r['prefill_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r['hf_prefill_tokens_per_s']:,.0f}", r["prefill_ratio"], None),
    ]

    def target(key):
        if key is None:
            return ""
        goal = f"{TARGETS[key]:.0%}" if key == "decode_vs_limit" else f"{TARGETS[key]:.2f}x"
        return f"≥ {goal}: {'met' if r['targets_met'][key] else 'NOT met'}"
    lines = ["| measure | ratio | target |", "|---|---:|---|"]
    lines += [f"| {name} | {value:.0%} | {target(key)} |" if key == "decode_vs_limit" else
              f"| {name} | {value:.3f}x | {target(key)} |" for name, value, key in rows]
    return "\n".join(lines)


def plot(curves: dict, path: Path, window: int = 32):
    """tokens/s over each window of `window` new tokens, at batch 1."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, times in curves.items():
        ends = range(window, len(times) + 1, window)
        ax.plot(list(ends), [window / (times[end - 1] - (times[end - window - 1] if end > window else 0))
                             for end in ends], label=label, marker=".")
    ax.set(xlabel="generated tokens", ylabel=f"tokens/s (batch 1, over {window}-token windows)", yscale="log",
           title="Greedy decode speed against generated length")
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png"))


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        sizes = QUICK if args.quick else full_sizes(args.overrides)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    repeats = args.repeats or sizes.repeats
    device = Device(args.device)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # generate's notes on unused sampling flags
    torch.manual_seed(0)
    load_before = os.getloadavg()
    started = time.perf_counter()
    if args.ablation:
        speeds = bench_ablation(repeats, device)
        print(f"{machine(device)} | {torch.get_num_threads()} threads | load {load_before[0]:.1f} -> "
              f"{os.getloadavg()[0]:.1f} | {time.perf_counter() - started:.0f} s | medians of {repeats}\n")
        print(ablation_table(speeds))
        if args.json:
            write_json(args.json, speeds)
        return 0
    results = bench_training(sizes, repeats, device)
    decode, curves = bench_decode(sizes, repeats, device)
    results |= decode
    results["targets_met"] = {key: results[key] >= goal for key, goal in TARGETS.items()}
    results |= {"threads": torch.get_num_threads(), "device": device.name,
                "dtype": "bf16 autocast" if device.cuda else "fp32", "torch_version": torch.__version__,
                "transformers_version": transformers.__version__, "machine": machine(device),
                "load_average_1min": {"start": load_before[0], "end": os.getloadavg()[0]},
                "bench_seconds": time.perf_counter() - started, "quick": args.quick, "repeats": repeats,
                "sizes": {k: v for k, v in vars(sizes).items() if k != "repeats"}}
    print(f"{results['machine']} | {results['threads']} threads | {results['dtype']} | torch {torch.__version__} | "
          f"transformers {transformers.__version__} | load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} | "
          f"{results['bench_seconds']:.0f} s | medians of {repeats}\n")
    print(training_table(results, sizes) + "\n")
    print(table(results, sizes))
    if args.json:
        write_json(args.json, results)
    if args.plot:
        plot(curves, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
