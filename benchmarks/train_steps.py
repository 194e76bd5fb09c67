"""Training tokens/s: the peers (one row each), their steps alternated, MFU against the measured peak matmul."""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from benchmarks.hf import build_pair, hf_gpt2
from benchmarks.sizes import Sizes
from benchmarks.timing import Device, speed_rows, timed_alternately
from model import Transformer
from settings import CONFIG_DIR, ablation_variants
from training.config import model_config
from training.evaluate import next_token_loss
from training.optim import make_optimizer


COMPILED = "llama_tiny, train.compile=true"


@dataclass
class Peer:
    """One row of a training table: a model, its loss of (inputs, targets) (train.py's next-token loss), the
    model of this repo whose flops_per_token counts its FLOPs, train.py's AdamW of the peer's train.* settings
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


# The training peers: this repo's own GPT-2 configuration of llama_tiny's sizes, and llama_tiny with one of its
# components switched to that configuration's, so that what each LLaMA component costs is a row of its own.
GPT2_SWITCHES = ("norm=layernorm", "position=learned", "attention=mha", "ffn=gelu")


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
        counted = peers[name].counted  # this repo's model of the peer's configuration: it counts what runs
        row["flops_per_token"] = counted.flops_per_token(counted.cfg.context_length, training=True)
        row["mfu"] = row["flops_per_token"] * row["tokens_per_s"] / peak
    base, gpt2 = rows["llama_tiny"]["tokens_per_s"], rows["GPT-2 configuration"]["tokens_per_s"]
    results = {"training": rows, "peak_gflops": peak / 1e9, "peak_matmul_s": matmul_seconds,
               "train_vs_gpt2": base / gpt2,
               "train_vs_hf_llama": base / rows["transformers LlamaForCausalLM"]["tokens_per_s"]}
    if COMPILED in rows:
        results |= {"compiled_train_compile_s": warm_up_s[COMPILED],  # compiling, then one step
                    "compiled_train_vs_gpt2": rows[COMPILED]["tokens_per_s"] / gpt2}
    return results


def ablation_peers(sizes: Sizes, device: Device) -> dict[str, Peer]:
    """Every ablation variant (configs/ablation/), as `python train.py <overrides> +experiment=ablation ablation=X`
    builds it. A context that the variants' widest window would not cut (--quick's 32) is doubled past it for every
    variant, so that all build."""
    variants = ablation_variants()
    window = max(OmegaConf.load(CONFIG_DIR / "ablation" / f"{variant}.yaml").get("model", {}).get("window") or 0
                 for variant in variants)
    context = sizes.compose("+experiment=ablation").model.context_length
    room = [f"model.context_length={2 * window}"] if context <= window else []
    return {variant: our_peer(sizes.compose("+experiment=ablation", f"ablation={variant}", *room), device)
            for variant in variants}


def bench_ablation(peers: dict[str, Peer], repeats: int, device: Device) -> dict:
    """Training tokens/s of every ablation variant at the ablation's size, one training step of each in turn,
    alternated in one process: the speed the learning-rate sweep's runs cannot show, since they shared the cores."""
    steps = {variant: partial(p.step, device) for variant, p in peers.items()}
    seconds, _, _ = timed_alternately("ablation training steps", steps, repeats, device)
    return speed_rows(seconds, tokens_per_step(peers), "baseline")
