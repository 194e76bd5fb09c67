"""Where a training step's time goes: llama_tiny against this repo's GPT-2 configuration, by op and by module.

    python scripts/profile_training.py [--steps 5] [overrides]     # e.g. model.d_model=256 model.n_layers=6

Each model takes a few untimed steps, then `--steps` profiled ones (forward, loss, backward, AdamW as
bench.py runs them). By op: torch.profiler's self CPU time per ATen op. By module: each module kind's
forward (attention, FFN, norms, RoPE, the LM head), timed by a record_function range its hooks open and close.
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cli import ascii_numbers  # noqa: E402
from benchmarks.sizes import full_sizes  # noqa: E402  (the repo root: bench.py's peers)
from benchmarks.timing import Device  # noqa: E402
from benchmarks.train_steps import GPT2_SWITCHES, our_peer  # noqa: E402

KINDS = ("Attention", "FeedForward", "RMSNorm", "LayerNorm", "Rotary", "Linear", "Embedding")


def label_modules(model: torch.nn.Module) -> None:
    for module in model.modules():
        kind = type(module).__name__
        if kind in KINDS:
            name = f"module: {'LM head' if module is getattr(model, 'lm_head', None) else kind}"
            module.register_forward_pre_hook(lambda m, args, name=name: m.__dict__.setdefault(
                "_ranges", []).append(record_function(name).__enter__()))
            module.register_forward_hook(lambda m, args, out: m._ranges.pop().__exit__(None, None, None))


def main(argv=None):
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    sizes, device = full_sizes(args.overrides), Device("cpu")
    for name, switches in (("llama_tiny", ()), ("GPT-2 configuration", GPT2_SWITCHES)):
        peer = our_peer(sizes.compose(*switches), device)  # bench.py's training row: its batch, its AdamW
        peer.model.train()
        label_modules(peer.model)
        for _ in range(2):
            peer.step(device)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                peer.step(device)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / args.steps / 1e3
        batch, context = peer.tokens[:, 1:].shape
        print(f"\n== {name}: {total:.1f} ms of CPU time per step ({batch} x {context} tokens) ==")
        ops = sorted((e for e in events if not e.key.startswith("module: ")), key=lambda e: -e.self_cpu_time_total)
        print("by op (self CPU ms per step, share):")
        for e in ops[:12]:
            print(f"  {e.key:<42} {e.self_cpu_time_total / args.steps / 1e3:8.2f}  {e.self_cpu_time_total / args.steps / 1e3 / total:6.1%}")
        print("by module, forward only (CPU ms per step, ops inside included):")
        for e in sorted((e for e in events if e.key.startswith("module: ")), key=lambda e: -e.cpu_time_total):
            print(f"  {e.key[8:]:<42} {e.cpu_time_total / args.steps / 1e3:8.2f}  calls {e.count // args.steps}")


if __name__ == "__main__":
    main()
