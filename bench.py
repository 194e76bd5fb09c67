"""Throughput of this repo's models against their peers, in one process on one machine.

    python bench.py [--device cpu|cuda] [--threads N] [--repeats N] [--json PATH] [--plot PATH] [--quick]
                    [--no-compile] [overrides]
    python bench.py --ablation [--repeats N] [--json PATH] [overrides]   # training tokens/s of each ablation variant
    python bench.py --against DIR [--repeats N] [--json PATH] [overrides]  # this tree against another checkout
    python bench.py --caches [--long] [--repeats N] [--json PATH] [overrides]  # decode with GQA's, MQA's, MLA's caches
    python bench.py --streaming [--repeats N] [--json PATH] [overrides]  # 20,000 tokens past the context, 3 ways

llama_tiny is what `python train.py [overrides]` trains. Every peer of ours is composed from configs/ and the
overrides as train.py composes them (settings.py), so every model.* and train.* setting reaches it: the
GPT-2 configuration and the one-switch rows add their group options (norm=layernorm, ...), the ablation's
variants `+experiment=ablation ablation=X`; train.py's AdamW of the composed train.* settings steps each one
(training/optim.py). --quick adds toy sizes to the overrides (QUICK_OVERRIDES). transformers'
LlamaForCausalLM gets its sizes and its weights (copied through interop/hf.py), the same inputs and the
same thread count. The timed runs alternate (A B C, C B A, A B C, ...) so that noise from other processes hits
every peer, and every figure is the median over --repeats runs after one untimed warm-up. Machines are
shared: compare the ratios, not the absolute figures. Every ratio "A vs B" is A's tokens/s over B's (above 1:
A is faster): the tables' last column (vs llama_tiny, vs baseline) is its row over the baseline row, and
each target (train_vs_gpt2, ...) is llama_tiny's figure over its peer's.

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
context, so both decode models have context_length = max_position_embeddings = 1024.
Prefill: one forward over a 256-token prompt into an empty cache, logits of the last position only
(what generation needs; transformers' generate asks for the same with logits_to_keep=1).
The weight-streaming limit: a batch-1 decode step reads every weight once, so it cannot beat
bandwidth / weight bytes tokens/s; bandwidth is the best of 5 copies of a 256 MB tensor (read + write).
--against DIR: did a change move the speed? This tree's model of the overrides against the same model of the
checkout in DIR (e.g. `git worktree add ../before <commit>`), both in this process on the same weights and
inputs, alternating: training steps through each tree's own loss and AdamW, and KV-cache decode through each
tree's own Engine at batch 1 and 8, as above; "vs DIR" is this tree's tokens/s over the other's. It refuses a
tree whose model computes other logits on the same weights (SAME_LOGITS), or cannot express the settings.
--caches: what each kind of cache buys at decode. The preset's model under attention=gqa (its K/V heads),
attention=mqa (one) and attention=mla (a latent, model/mla.py), on random weights: greedy decode as above at
batch 1 and 8, one generation of each in turn, alternating; tokens/s, cache bytes per token, parameters, and
"vs gqa", each row's tokens/s over GQA's, and what the generation holds: the cache (its bytes per token x the
prompt and new tokens x the batch) beside the weights. --long: the preset's context stretched 32x by YaRN
(model.rope_scaling=yarn, model.rope_factor=32, model.rope_original_context = the preset's context; 4,096 tokens
for llama_tiny) and a generation that fills it, where the cache, not the weights, is most of what decode reads.
--streaming: generation far past the trained context (STREAM_TOKENS new tokens after the 16-token prompt, at batch
1 and 8, greedy, random weights), three ways, alternating: the preset's model sliding as generate.py does by
default (every context / 2 tokens it re-prefills the last context / 2), the same model streaming with
STREAM_SINKS sink tokens and a rolling window (StreamingLLM, Engine(sink_tokens=...)), and the preset with every
layer local (model.window = context / 4) in its own rolling cache; "vs slide" is each row's tokens/s over the
sliding one's, and each cache's bytes are what it allocates.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Callable
from pathlib import Path

import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.generation.streamers import BaseStreamer

from cli import Parser
from errors import UsageError
from generation.engine import Engine, compiled_decoder
from interop.hf import hf_config, hf_state_dict
from model import ModelConfig, Transformer
from settings import CONFIG_DIR, compose_config
from storage.files import atomic_write, write_json
from training.config import autocast_for, check_train_config, model_config
from training.evaluate import next_token_loss
from training.optim import make_optimizer

# CPU fp32: llama_tiny's training tokens/s against this repo's GPT-2 configuration (eager, and train.compile=true)
# and transformers' LLaMA; the default decode (what generate.py runs) against transformers' and the limit
# that streaming every weight once per token sets
TARGETS = {"train_vs_gpt2": 1.0, "train_vs_hf_llama": 1.2, "compiled_train_vs_gpt2": 1.15, "decode_ratio": 3.0,
           "decode_vs_limit": 0.4, "cache_vs_nocache": 5.0}


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


COMPILED = "llama_tiny, train.compile=true"
# --quick: the same code paths at toy sizes, for the test of the JSON's shape; its figures mean nothing.
QUICK_OVERRIDES = ["model.d_model=64", "model.n_layers=2", "model.context_length=32", "data.vocab_size=256",
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


def parse_args(argv):
    parser = Parser(description="Training, decode and prefill throughput against transformers' LLaMA.")
    parser.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (bf16 autocast)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads for both implementations (default: torch's, %(default)s here)")
    parser.add_argument("--repeats", type=int, help="timed runs of each measurement (default 5, --quick 2)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a PNG of decode tokens/s against generated length")
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks that everything runs")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave out the torch.compile rows (compiling takes longer than the rest of --quick)")
    parser.add_argument("--ablation", action="store_true",
                        help="only the ablation's variants: training tokens/s of each, alternated")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="another checkout of this repo: its training and decode speed beside this tree's")
    parser.add_argument("--caches", action="store_true",
                        help="only decode with each kind of cache (GQA, MQA, MLA): tokens/s and cache bytes, alternated")
    parser.add_argument("--streaming", action="store_true",
                        help="generation past the context: re-prefilling, sink tokens, a windowed model's cache")
    parser.add_argument("--long", action="store_true",
                        help=f"with --caches: a generation that fills the context stretched {LONG_FACTOR}x by YaRN")
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
    if args.against is not None and not (args.against / "model" / "__init__.py").is_file():
        raise UsageError(f"--against={args.against} is no checkout of this repo: it has no model/__init__.py")
    modes = [flag for flag, on in (("--against", args.against is not None), ("--ablation", args.ablation),
                                   ("--caches", args.caches), ("--streaming", args.streaming)) if on]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(modes)} are separate benches: pass one of them")
    if args.long and not args.caches:
        raise UsageError("--long is a setting of --caches: pass both")
    if args.plot is not None and modes:
        raise UsageError(f"--plot={args.plot} draws the full bench's decode curves: not with {modes[0]}")
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


def build_pair(cfg: ModelConfig, device: Device) -> tuple[Transformer, nn.Module]:
    """Our model and transformers' LlamaForCausalLM with the same config and the same weights."""
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


# ---------------------------------------------------------------- training steps and their table

@dataclass
class Peer:
    """One row of a training table: a model, its loss of (inputs, targets) (train.py's next-token loss), the
    model whose nn.Linear weights count its FLOPs, train.py's AdamW of the peer's train.* settings
    (training/optim.py), and one batch of train.batch_size random sequences of the model's context."""
    model: nn.Module
    loss_of: Callable
    counted: Transformer
    optimizer: torch.optim.Optimizer
    tokens: torch.Tensor  # [batch_size, context + 1]

    @property
    def tokens_per_step(self) -> int:
        return self.tokens[:, 1:].numel()

    def step(self, device: Device) -> None:
        """forward + loss, backward, AdamW step."""
        with device.autocast():
            loss = self.loss_of(self.tokens[:, :-1], self.tokens[:, 1:])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def peer(model: nn.Module, settings: DictConfig, device: Device, loss_of: Callable | None = None,
         counted: Transformer | None = None) -> Peer:
    """model (already on the device) as a Peer; loss_of and counted default to the model's own."""
    counted = counted or model
    tokens = torch.randint(counted.cfg.vocab_size, (settings.train.batch_size, counted.cfg.context_length + 1),
                           device=device.name)
    return Peer(model, loss_of or partial(next_token_loss, model), counted, make_optimizer(model, settings.train),
                tokens)


def our_peer(settings: DictConfig, device: Device) -> Peer:
    return peer(Transformer(model_config(settings)).to(device.name), settings, device)


def tokens_per_step(peers: dict[str, Peer]) -> dict[str, int]:
    return {name: p.tokens_per_step for name, p in peers.items()}


def speed_rows(seconds: dict[str, list[float]], tokens_per_run: dict[str, int], baseline: str) -> dict:
    """Each run's tokens/s from its timed calls: the median, the range, the seconds, and
    vs_baseline = its median tokens/s / the baseline's: above 1 it is faster than the baseline."""
    rows = {}
    for name, tokens in tokens_per_run.items():
        s = seconds[name]
        rows[name] = {"tokens_per_s": tokens / statistics.median(s), "tokens_per_s_range": [tokens / max(s),
                                                                                            tokens / min(s)],
                      "step_s": s}
    for row in rows.values():
        row["vs_baseline"] = row["tokens_per_s"] / rows[baseline]["tokens_per_s"]
    return rows


def speed_table(rows: dict, first: str, baseline: str, columns: dict[str, Callable] | None = None,
                measure: str = "training tokens/s") -> str:
    """speed_rows as markdown; columns: header -> a row's cell, between the range and vs <baseline>."""
    columns = columns or {}
    lines = [f"| {first} | {measure} (median) | min - max | {' | '.join([*columns, f'vs {baseline}'])} |",
             "|---|" + "---:|" * (3 + len(columns))]
    for name, row in rows.items():
        low, high = row["tokens_per_s_range"]
        cells = [f"{row['tokens_per_s']:,.0f}", f"{low:,.0f} - {high:,.0f}", *(cell(row) for cell in columns.values()),
                 f"{row['vs_baseline']:.3f}x"]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def train_flops_per_token(model: Transformer) -> int:
    cfg = model.cfg
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6 * n_matmul + 6 * cfg.n_layers * cfg.context_length * cfg.d_model


# ---------------------------------------------------------------- the ablation's variants

def ablation_peers(sizes: Sizes, device: Device) -> dict[str, Peer]:
    """Every ablation variant, as `python train.py <overrides> +experiment=ablation ablation=X` builds it. A context
    that the variants' widest window would not cut (--quick's 32) is doubled past it for every variant, so that all
    build."""
    from sweep import VARIANTS
    window = max(OmegaConf.load(CONFIG_DIR / "ablation" / f"{variant}.yaml").get("model", {}).get("window") or 0
                 for variant in VARIANTS)
    context = sizes.compose("+experiment=ablation").model.context_length
    room = [f"model.context_length={2 * window}"] if context <= window else []
    return {variant: our_peer(sizes.compose("+experiment=ablation", f"ablation={variant}", *room), device)
            for variant in VARIANTS}


def bench_ablation(peers: dict[str, Peer], repeats: int, device: Device) -> dict:
    """Training tokens/s of every ablation variant at the ablation's size, one training step of each in turn,
    alternated in one process: the speed the learning-rate sweep's runs cannot show, since they shared the cores."""
    steps = {variant: partial(p.step, device) for variant, p in peers.items()}
    seconds, _, _ = timed_alternately("ablation training steps", steps, repeats, device)
    return speed_rows(seconds, tokens_per_step(peers), "baseline")


# ---------------------------------------------------------------- training

# The training peers: this repo's own GPT-2 configuration of llama_tiny's sizes, and llama_tiny with one of its
# components switched to that configuration's, so that what each LLaMA component costs is a row of its own.
GPT2_SWITCHES = ("norm=layernorm", "position=learned", "attention=mha", "ffn=gelu")


def hf_gpt2(cfg: ModelConfig) -> nn.Module:
    """transformers' GPT2LMHeadModel of cfg's sizes: LayerNorm, learned positions, MHA, exact GELU 4d, tied head
    (and, being GPT-2, biases in every linear layer and LayerNorm)."""
    from transformers import GPT2Config
    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.d_model,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, activation_function="gelu", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def training_peers(sizes: Sizes, device: Device, compile: bool = True) -> dict[str, Peer]:
    """llama_tiny (as `python train.py <overrides>` builds it), its compiled twin (unless not compile), the GPT-2
    configuration, the transformers peers and the one-switch rows, each composed from the overrides as train.py
    composes them."""
    settings, gpt2_settings = sizes.compose(), sizes.compose(*GPT2_SWITCHES)
    llama, hf_llama = build_pair(model_config(settings), device)
    gpt2 = Transformer(model_config(gpt2_settings)).to(device.name)
    hf_gpt2_model = hf_gpt2(gpt2.cfg).to(device.name)
    peers = {"llama_tiny": peer(llama, settings, device)}
    if compile:  # as train.py compiles: the loss, forward and cross-entropy in one graph, on a copy (its own AdamW)
        compiled = copy.deepcopy(llama)
        peers[COMPILED] = peer(compiled, settings, device, partial(torch.compile(next_token_loss), compiled), llama)
    peers |= {
        "GPT-2 configuration": peer(gpt2, gpt2_settings, device),
        "transformers LlamaForCausalLM": peer(hf_llama, settings, device,
                                              partial(next_token_loss, lambda x: hf_llama(input_ids=x).logits), llama),
        "transformers GPT2LMHeadModel": peer(hf_gpt2_model, gpt2_settings, device,
                                             partial(next_token_loss, lambda x: hf_gpt2_model(input_ids=x).logits),
                                             gpt2),
    }
    for switch in GPT2_SWITCHES:
        peers[f"llama_tiny {switch}"] = our_peer(sizes.compose(switch), device)
    return peers


def bench_training(peers: dict[str, Peer], sizes: Sizes, repeats: int, device: Device) -> dict:
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
    for p in peers.values():
        p.model.train()
    steps = {name: partial(p.step, device) for name, p in peers.items()}
    seconds, _, warm_up_s = timed_alternately("training", steps | {"peak matmul": matmuls}, repeats, device)
    peak = 2 * sizes.peak_n ** 3 / min(matmul_seconds)
    rows = speed_rows(seconds, tokens_per_step(peers), "llama_tiny")
    for name, row in rows.items():
        row["flops_per_token"] = train_flops_per_token(peers[name].counted)
        row["mfu"] = row["flops_per_token"] * row["tokens_per_s"] / peak
    base, gpt2 = rows["llama_tiny"]["tokens_per_s"], rows["GPT-2 configuration"]["tokens_per_s"]
    results = {"training": rows, "peak_gflops": peak / 1e9, "peak_matmul_s": matmul_seconds,
               "train_vs_gpt2": base / gpt2,
               "train_vs_hf_llama": base / rows["transformers LlamaForCausalLM"]["tokens_per_s"]}
    if COMPILED in rows:
        results |= {"compiled_train_compile_s": warm_up_s[COMPILED],  # compiling, then one step
                    "compiled_train_vs_gpt2": rows[COMPILED]["tokens_per_s"] / gpt2}
    return results


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


# ---------------------------------------------------------------- this tree against another checkout

HERE = Path(__file__).resolve().parent


def import_tree(root: Path, names: tuple[str, ...]) -> list:
    """The modules `names` of the checkout at root, imported from its own files. This tree's modules of the same
    top-level names are set aside meanwhile and put back after: the other tree's objects keep their own. A module
    that would come from anywhere else (a file the other tree lacks, found in this one) is refused."""
    tops = {p.stem for base in (HERE, root) for p in base.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}

    def loaded() -> dict:
        return {key: module for key, module in sys.modules.items() if key.partition(".")[0] in tops}
    ours = loaded()
    for key in ours:
        del sys.modules[key]
    sys.path.insert(0, str(root))
    try:
        modules = [importlib.import_module(name) for name in names]
        strays = sorted(key for key, module in loaded().items()
                        if not Path(getattr(module, "__file__", None) or root).resolve().is_relative_to(root.resolve()))
        if strays:
            raise UsageError(f"--against={root}: {', '.join(strays)} came from outside it")
        return modules
    except (ImportError, SyntaxError) as e:
        raise UsageError(f"--against={root}: cannot import its {' and '.join(names)}: {e}") from None
    finally:
        sys.path.remove(str(root))
        for key in loaded():
            del sys.modules[key]
        sys.modules.update(ours)


@dataclass
class OtherTree:
    """Another checkout's model, training loss, optimizer and generation engine: what this tree's rows use."""
    root: Path
    config_class: type
    transformer: type
    loss_of: Callable
    make_optimizer: Callable
    engine: type

    @classmethod
    def load(cls, root: Path) -> "OtherTree":
        model, evaluate, optim, engine = import_tree(
            root, ("model", "training.evaluate", "training.optim", "generation.engine"))
        return cls(root, model.ModelConfig, model.Transformer, evaluate.next_token_loss, optim.make_optimizer,
                   engine.Engine)

    def twin(self, ours: Transformer) -> nn.Module:
        """Its model of our model's settings, with our weights; a setting it lacks must be at our default."""
        accepted, defaults = {f.name for f in fields(self.config_class)}, ModelConfig()
        settings = ours.cfg.to_dict()
        lacking = [f"model.{key}={value}" for key, value in settings.items()
                   if key not in accepted and value != getattr(defaults, key)]
        if lacking:
            raise UsageError(f"--against={self.root}: its ModelConfig has no {', '.join(lacking)}")
        if "attention" in accepted:  # older trees store the attention's name beside n_kv_heads
            settings["attention"] = ours.cfg.attention
        try:  # its own checks raise its own error classes, not ours
            model = self.transformer(self.config_class(**{k: v for k, v in settings.items() if k in accepted}))
            model.load_state_dict(ours.state_dict())
        except Exception as e:
            raise UsageError(f"--against={self.root}: it cannot build this model with its weights: "
                             f"{str(e).splitlines()[0]}") from None
        return model.to(ours.tok_emb.weight.device)


# The two trees' logits on the same weights and inputs: float32 through a few layers of reordered sums moves them
# by ~1e-6 of their scale, a model that computes something else by its whole scale; 1e-4 of it lies between.
SAME_LOGITS = 1e-4


def against_peers(other: OtherTree, settings: DictConfig, device: Device) -> dict[str, Peer]:
    """This tree's model of the settings and the other tree's twin, each with its own loss and AdamW, on one batch;
    refused unless both compute the same logits (else the A/B would time two models)."""
    ours = Transformer(model_config(settings)).to(device.name)
    theirs, mine = other.twin(ours), peer(ours, settings, device)
    with torch.no_grad(), device.autocast():
        logits = ours(mine.tokens[:, :-1])
        difference = (logits - theirs(mine.tokens[:, :-1])).abs().max().item()
    scale = logits.abs().max().item()
    if not difference <= SAME_LOGITS * scale:
        raise UsageError(f"--against={other.root}: its model's logits differ from this tree's by {difference:.3g} "
                         f"on the same weights (largest logit {scale:.3g}): it is another model")
    return {"this tree": mine, str(other.root): Peer(theirs, partial(other.loss_of, theirs), ours,
                                                     other.make_optimizer(theirs, settings.train), mine.tokens)}


def bench_against(other: OtherTree, peers: dict[str, Peer], sizes: Sizes, repeats: int, device: Device) -> dict:
    """The two trees' training steps, then their KV-cache decode at each batch, alternating."""
    label, ours = str(other.root), peers["this tree"].model
    seconds, _, _ = timed_alternately(f"training, this tree and {label}",
                                      {name: partial(p.step, device) for name, p in peers.items()}, repeats, device)
    results = {"against": label, "training": speed_rows(seconds, tokens_per_step(peers), label)}
    ours = Transformer(replace(ours.cfg, context_length=sizes.decode_context)).to(device.name).eval()
    theirs = other.twin(ours).eval()
    for batch in sizes.decode_batches:
        prompts = torch.randint(ours.cfg.vocab_size, (batch, sizes.prompt_tokens), device=device.name)
        seconds, last, _ = timed_alternately(f"decode, batch {batch}", {
            "this tree": our_generation(ours, prompts, sizes.new_tokens, True, device),
            label: our_generation(theirs, prompts, sizes.new_tokens, True, device, engine_class=other.engine)},
            repeats, device)
        results[f"decode_b{batch}"] = speed_rows(seconds, {name: batch * sizes.new_tokens for name in seconds}, label)
        # greedy tokens on the same weights: they part only on a near-tie of two logits
        results[f"decode_b{batch}_same_tokens"] = bool(torch.equal(last["this tree"][1], last[label][1]))
    return results


def against_tables(r: dict, sizes: Sizes) -> str:
    label = r["against"]
    tables = [speed_table(r["training"], "tree", label)]
    for batch in sizes.decode_batches:
        tables.append(speed_table(r[f"decode_b{batch}"], "tree", label, measure=f"decode tokens/s, batch {batch}")
                      + f"\n\nthe same {sizes.new_tokens} greedy tokens: {r[f'decode_b{batch}_same_tokens']}")
    return "\n\n".join(tables)


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


def training_table(r: dict, settings: DictConfig, sizes: Sizes) -> str:
    header = (f"Training, {settings.train.batch_size} x {settings.model.context_length} tokens a step (fwd + bwd + "
              f"AdamW). MFU = FLOPs per token x tokens/s / peak, FLOPs per token = 6 N_matmul + 6 L T d for every "
              f"row, peak {r['peak_gflops']:.0f} GFLOP/s (the best {sizes.peak_n}^3 matmul)")
    return header + "\n\n" + speed_table(r["training"], "model", "llama_tiny", {
        "MFLOP/token": lambda row: f"{row['flops_per_token'] / 1e6:.1f}", "MFU": lambda row: f"{row['mfu']:.1%}"})


def table(r: dict, sizes: Sizes) -> str:
    b = sizes.decode_batches[1]
    rows = [  # name, value, the key of its target
        ("training: llama_tiny / GPT-2 configuration, eager", r["train_vs_gpt2"], "train_vs_gpt2"),
        ("training: llama_tiny / transformers LlamaForCausalLM", r["train_vs_hf_llama"], "train_vs_hf_llama"),
        (f"training: llama_tiny train.compile=true (compiled in {r.get('compiled_train_compile_s', 0):.0f} s) / "
         f"GPT-2 configuration eager", r.get("compiled_train_vs_gpt2"), "compiled_train_vs_gpt2"),
        (f"decode, batch 1, {sizes.new_tokens} new: {r['decode_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r['hf_decode_tokens_per_s']:,.0f}", r["decode_ratio"], "decode_ratio"),
        (f"decode, batch 1: / the weight-streaming limit {r['streaming_limit_tokens_per_s']:,.0f} tokens/s "
         f"({r['weight_bytes'] / 1e6:.1f} MB at {r['memory_bandwidth_gb_per_s']:.1f} GB/s)", r["decode_vs_limit"],
         "decode_vs_limit"),
        (f"decode, batch 1, torch.compile (compiled in {r.get('compiled_decode_compile_s', 0):.0f} s): "
         f"{r.get('compiled_decode_tokens_per_s', 0):,.0f} tokens/s / transformers", r.get("compiled_decode_ratio"),
         None),
        (f"decode, batch {b}: {r[f'decode_b{b}_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r[f'hf_decode_b{b}_tokens_per_s']:,.0f}", r[f"decode_b{b}_ratio"], None),
        (f"decode, batch {b}, torch.compile (compiled in {r.get(f'compiled_decode_b{b}_compile_s', 0):.0f} s) / "
         f"transformers", r.get(f"compiled_decode_b{b}_ratio"), None),
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
              f"| {name} | {value:.3f}x | {target(key)} |" for name, value, key in rows
              if value is not None]  # --no-compile: no compiled rows
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
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    device = Device(args.device)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # generate's notes on unused sampling flags
    torch.manual_seed(0)
    sizes = (quick_sizes if args.quick else full_sizes)(args.overrides)
    try:  # every peer is built before the first measurement, so a bad setting costs no time
        if args.long:
            sizes = long_sizes(sizes, QUICK_LONG_FACTOR if args.quick else LONG_FACTOR)
        settings = sizes.compose()
        if args.against:
            other = OtherTree.load(args.against)
            peers = against_peers(other, settings, device)
        elif args.caches:
            peers = cache_peers(sizes, device)
        elif args.streaming:
            peers = streaming_peers(sizes, device)
            stream_tokens = 3 * peers["slide"][0].cfg.context_length if args.quick else STREAM_TOKENS
        else:
            peers = ablation_peers(sizes, device) if args.ablation else training_peers(sizes, device, args.compile)
    except UsageError as e:  # a bad override, a setting that builds no model, one transformers cannot mirror
        print(f"error: {e}", file=sys.stderr)
        return 2
    repeats = args.repeats or sizes.repeats
    load_before = os.getloadavg()
    started = time.perf_counter()
    if args.against or args.ablation or args.caches or args.streaming:  # one table of one kind of run
        speeds = (bench_against(other, peers, sizes, repeats, device) if args.against
                  else bench_caches(peers, sizes, repeats, device) if args.caches
                  else bench_streaming(peers, sizes, stream_tokens, repeats, device) if args.streaming
                  else bench_ablation(peers, repeats, device))
        print(f"{machine(device)} | {torch.get_num_threads()} threads | load {load_before[0]:.1f} -> "
              f"{os.getloadavg()[0]:.1f} | {time.perf_counter() - started:.0f} s | medians of {repeats}\n")
        print(against_tables(speeds, sizes) if args.against else caches_tables(speeds) if args.caches
              else streaming_tables(speeds) if args.streaming else speed_table(speeds, "variant", "baseline"))
        if args.json:
            write_json(args.json, speeds)
        return 0
    model = model_config(settings)
    results = bench_training(peers, sizes, repeats, device)
    decode, curves = bench_decode(model, sizes, repeats, device, args.compile)
    results |= decode
    results["targets_met"] = {key: results[key] >= goal for key, goal in TARGETS.items() if key in results}
    results |= {"threads": torch.get_num_threads(), "device": device.name,
                "dtype": "bf16 autocast" if device.cuda else "fp32", "torch_version": torch.__version__,
                "transformers_version": transformers.__version__, "machine": machine(device),
                "load_average_1min": {"start": load_before[0], "end": os.getloadavg()[0]},
                "bench_seconds": time.perf_counter() - started, "quick": args.quick, "repeats": repeats,
                "sizes": {k: v for k, v in vars(sizes).items() if k != "repeats"}
                | {"batch_size": settings.train.batch_size, "model": model.to_dict()}}
    print(f"{results['machine']} | {results['threads']} threads | {results['dtype']} | torch {torch.__version__} | "
          f"transformers {transformers.__version__} | load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} | "
          f"{results['bench_seconds']:.0f} s | medians of {repeats}\n")
    print(training_table(results, settings, sizes) + "\n")
    print(table(results, sizes))
    if args.json:
        write_json(args.json, results)
    if args.plot:
        plot(curves, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
