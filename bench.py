"""Throughput of this repo's LLaMA against transformers' LlamaForCausalLM, in one process on one machine.

    python bench.py [--device cpu|cuda] [--threads N] [--repeats N] [--json PATH] [--plot PATH] [--quick]
    python bench.py --ablation [--repeats N] [--json PATH]    # training tokens/s of each ablation variant

Both implementations get the llama_tiny dims (vocab 4096, d 256, 6 layers, 8 query / 2 K/V heads, SwiGLU
d_ff 704, tied embeddings), the same weights (copied through model/hf_interop.py), the same inputs and the
same thread count. The timed runs alternate (ours, theirs, theirs, ours, ours, ...) so that noise from other
processes hits both, and every figure is the median over --repeats runs after one untimed warm-up.
Machines are shared: compare the ratios, not the absolute figures.

Training: tokens/s of forward + cross-entropy + backward + AdamW step on train.batch_size (16) sequences of
llama_tiny's 256-token context, the optimizer built as train.py builds it (training/optim.py, the `train`
settings of configs/config.yaml) for both. Ours eagerly (train.compile=false, the default) and, on a copy of
the same weights, through torch.compile as train.compile=true runs it (its untimed warm-up step compiles: that
time is reported apart); theirs eagerly. CPU runs fp32; --device cuda runs under bf16 autocast.
    MFU = FLOPs per token * tokens/s / peak FLOP/s
    FLOPs per token = 6 * N_matmul + 6 * L * T * d
      N_matmul: the weights that multiply activations (every nn.Linear, the LM head included; the
      embedding lookup multiplies nothing). 2 FLOPs per multiply-add, x3 for forward + backward.
      Attention: q k^T and att v each take T_keys * d multiply-adds per token and layer; under the
      causal mask a token sees T_keys = T / 2 keys on average. (PaLM's convention counts all T: 12 L T d.)
    peak = the best n x n torch.matmul (n = 2048) of the run, timed between the training steps.
Decode: greedy, 512 new tokens after a 16-token prompt, at batch 1 and 8; tokens/s = batch * 512 / the wall
time of the whole generation, the prompt's prefill included. Ours through model.engine.Engine with and
without the KV cache (the no-cache run once, at batch 1: it takes minutes at batch 8) and with the cache under
Engine(compile=True) (its untimed warm-up run compiles the decode step: that time is reported apart), theirs through
generate(use_cache=True, do_sample=False, min_new_tokens=512). 16 + 512 tokens do not fit llama_tiny's
256-token context, so both decode models have context_length = max_position_embeddings = 1024.
Prefill: one forward over a 256-token prompt into an empty cache, logits of the last position only
(what generation needs; transformers' generate asks for the same with logits_to_keep=1).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from omegaconf import OmegaConf
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.generation.streamers import BaseStreamer

from data.files import atomic_write
from model import ModelConfig, Transformer
from model.engine import Engine
from model.hf_interop import hf_config, hf_state_dict
from training.config import autocast_for
from training.evaluate import next_token_loss
from training.optim import make_optimizer
from training.tracking import write_json

LLAMA_TINY = dict(vocab_size=4096, d_model=256, n_layers=6, n_heads=8, n_kv_heads=2)  # configs/model/llama_tiny.yaml
TRAIN = OmegaConf.load(Path(__file__).resolve().parent / "configs" / "config.yaml").train  # train.py's settings
# issue 7, CPU fp32; the training and decode targets are checked eagerly (the default) and through torch.compile
TARGETS = {"train_ratio": 1.0, "compiled_train_ratio": 1.0, "mfu": 0.6, "compiled_mfu": 0.6, "decode_ratio": 2.0,
           "compiled_decode_ratio": 2.0, "cache_vs_nocache": 5.0}


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


FULL = Sizes(LLAMA_TINY, batch_size=TRAIN.batch_size, context=256, prompt_tokens=16, new_tokens=512,
             decode_batches=(1, 8), decode_context=1024, prefill_tokens=256, peak_n=2048, repeats=5)
# --quick: the same code paths at toy sizes, for the test of the JSON's shape; its figures mean nothing.
QUICK = Sizes(dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2), batch_size=2, context=32,
              prompt_tokens=4, new_tokens=8, decode_batches=(1, 2), decode_context=64, prefill_tokens=32,
              peak_n=256, repeats=2)


class UserError(ValueError):
    """A bad flag; main prints it as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(message)


def parse_args(argv):
    parser = _Parser(description="Training, decode and prefill throughput against transformers' LLaMA.")
    parser.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (bf16 autocast)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads for both implementations (default: torch's, %(default)s here)")
    parser.add_argument("--repeats", type=int, help="timed runs of each measurement (default 5, --quick 2)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a PNG of decode tokens/s against generated length")
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks that everything runs")
    parser.add_argument("--ablation", action="store_true",
                        help="only the ablation's variants: training tokens/s of each, alternated")
    args = parser.parse_args(argv)
    if args.device not in ("cpu", "cuda"):
        raise UserError(f"--device={args.device!r} must be cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device=cuda but torch sees no CUDA device")
    if args.threads < 1:
        raise UserError(f"--threads={args.threads} must be >= 1")
    if args.repeats is not None and args.repeats < 1:
        raise UserError(f"--repeats={args.repeats} must be >= 1")
    for flag in ("json", "plot"):  # checked now, not after minutes of measuring
        path = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            raise UserError(f"--{flag}={path}: directory {path.parent} does not exist")
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
    from training.settings import compose_config

    steps, tokens_per_step = {}, None
    for variant in VARIANTS:
        cfg = compose_config(["+experiment=ablation", f"ablation={variant}"])
        model = Transformer(model_config(cfg)).to(device.name)
        T = model.cfg.context_length
        batch = torch.randint(model.cfg.vocab_size, (cfg.train.batch_size, T + 1), device=device.name)
        steps[variant] = train_step(model, model, batch, device)
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

def train_step(model: nn.Module, logits_of, tokens: torch.Tensor, device: Device):
    """One closure: forward (logits_of(inputs)), next-token cross-entropy, backward, AdamW step on model."""
    optimizer = make_optimizer(model, TRAIN)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        with device.autocast():
            loss = next_token_loss(logits_of, inputs, targets)  # train.py's loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def train_flops_per_token(model: Transformer, context: int) -> int:
    cfg = model.cfg
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6 * n_matmul + 6 * cfg.n_layers * context * cfg.d_model


def bench_training(sizes: Sizes, repeats: int, device: Device) -> dict:
    ours, theirs = build_pair(sizes.dims, sizes.context, device)
    ours.train(), theirs.train()
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
    compiled = copy.deepcopy(ours)  # the same weights, an optimizer of its own
    seconds, _, warm_up_s = timed_alternately("training", {
        "ours": train_step(ours, ours, tokens, device),
        "ours, compiled": train_step(compiled, torch.compile(compiled), tokens, device),  # as train.py compiles
        "theirs": train_step(theirs, lambda x: theirs(input_ids=x).logits, tokens, device),
        "peak matmul": matmuls,
    }, repeats, device)
    tokens_per_step = sizes.batch_size * sizes.context
    flops = train_flops_per_token(ours, sizes.context)
    peak = 2 * sizes.peak_n ** 3 / min(matmul_seconds)
    ours_tps, compiled_tps, theirs_tps = (tokens_per_step / statistics.median(seconds[name])
                                          for name in ("ours", "ours, compiled", "theirs"))
    return {"train_tokens_per_s": ours_tps, "hf_train_tokens_per_s": theirs_tps, "train_ratio": ours_tps / theirs_tps,
            "compiled_train_tokens_per_s": compiled_tps, "compiled_train_ratio": compiled_tps / theirs_tps,
            "compiled_train_compile_s": warm_up_s["ours, compiled"],  # compiling, then one step
            "mfu": flops * ours_tps / peak, "compiled_mfu": flops * compiled_tps / peak, "hf_mfu": flops * theirs_tps / peak,
            "train_flops_per_token": flops, "peak_gflops": peak / 1e9,
            "train_step_s": seconds["ours"], "compiled_train_step_s": seconds["ours, compiled"],
            "hf_train_step_s": seconds["theirs"], "peak_matmul_s": matmul_seconds}


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
    run.compile_s: each run's torch.compile time (Engine stats), the first run's holding the compilation."""
    engine, prompt_lists = Engine(model, compile=compile), prompts.tolist()

    def run():
        start, times, ids = time.perf_counter(), [], []
        with device.autocast():
            for step_ids in engine.generate(prompt_lists, new_tokens, temperature=0, use_cache=use_cache):
                times.append(time.perf_counter() - start)
                ids.append(step_ids)
        run.compile_s.append(engine.stats.compile_s)
        return times, torch.stack(ids, dim=1)
    run.compile_s = []
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


def bench_decode(sizes: Sizes, repeats: int, device: Device) -> tuple[dict, dict]:
    ours, theirs = build_pair(sizes.dims, sizes.decode_context, device)
    ours.eval(), theirs.eval()
    vocab, new = sizes.dims["vocab_size"], sizes.new_tokens
    results, curves = {}, {}
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
                    f"compiled_decode{suffix}_compile_s": compiled.compile_s[0],
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
                        "nocache_decode_s": nocache_seconds["ours, no cache"]}
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


def table(r: dict, sizes: Sizes) -> str:
    b = sizes.decode_batches[1]
    rows = [  # name, ours, theirs, ratio, the key of its target
        (f"training tokens/s ({sizes.batch_size} x {sizes.context}, fwd + bwd + AdamW)",
         r["train_tokens_per_s"], r["hf_train_tokens_per_s"], r["train_ratio"], "train_ratio"),
        (f"MFU (peak {r['peak_gflops']:.0f} GFLOP/s, {r['train_flops_per_token'] / 1e6:.1f} MFLOP/token)",
         f"{r['mfu']:.1%}", f"{r['hf_mfu']:.1%}", None, "mfu"),
        (f"training tokens/s, train.compile=true (compiled in {r['compiled_train_compile_s']:.0f} s)",
         r["compiled_train_tokens_per_s"], r["hf_train_tokens_per_s"], r["compiled_train_ratio"],
         "compiled_train_ratio"),
        ("MFU, train.compile=true", f"{r['compiled_mfu']:.1%}", f"{r['hf_mfu']:.1%}", None, "compiled_mfu"),
        (f"decode tokens/s, batch 1, {sizes.new_tokens} new", r["decode_tokens_per_s"], r["hf_decode_tokens_per_s"],
         r["decode_ratio"], "decode_ratio"),
        (f"decode tokens/s, batch 1, torch.compile (compiled in {r['compiled_decode_compile_s']:.0f} s)",
         r["compiled_decode_tokens_per_s"], r["hf_decode_tokens_per_s"], r["compiled_decode_ratio"],
         "compiled_decode_ratio"),
        (f"decode tokens/s, batch {b}, {sizes.new_tokens} new", r[f"decode_b{b}_tokens_per_s"],
         r[f"hf_decode_b{b}_tokens_per_s"], r[f"decode_b{b}_ratio"], None),
        (f"decode tokens/s, batch {b}, torch.compile (compiled in {r[f'compiled_decode_b{b}_compile_s']:.0f} s)",
         r[f"compiled_decode_b{b}_tokens_per_s"], r[f"hf_decode_b{b}_tokens_per_s"], r[f"compiled_decode_b{b}_ratio"],
         None),
        ("no-cache decode tokens/s, batch 1 (ratio: KV cache / no cache)", r["nocache_decode_tokens_per_s"], None,
         r["cache_vs_nocache"], "cache_vs_nocache"),
        (f"prefill tokens/s, {sizes.prefill_tokens}-token prompt", r["prefill_tokens_per_s"],
         r["hf_prefill_tokens_per_s"], r["prefill_ratio"], None),
    ]

    def cell(value):
        return "" if value is None else value if isinstance(value, str) else f"{value:,.0f}"

    def target(key):
        if key is None:
            return ""
        goal = f"{TARGETS[key]:.0%}" if key.endswith("mfu") else f"{TARGETS[key]:.1f}x"
        return f"≥ {goal}: {'met' if r['targets_met'][key] else 'NOT met'}"
    lines = ["| measure | nanollama | transformers | ratio | target |", "|---|---:|---:|---:|---|"]
    lines += [f"| {name} | {cell(ours)} | {cell(theirs)} | {'' if ratio is None else f'{ratio:.3f}x'} | "
              f"{target(key)} |" for name, ours, theirs, ratio, key in rows]
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
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
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
    print(table(results, sizes))
    if args.json:
        write_json(args.json, results)
    if args.plot:
        plot(curves, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
