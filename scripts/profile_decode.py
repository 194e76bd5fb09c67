"""Where a greedy decode step's time goes at batch 1: this repo's Engine against transformers' generate, on the same
weights (bench.py's pair), by ATen op: calls and self CPU time per new token.

    python scripts/profile_decode.py [--new-tokens 256] [overrides]     # e.g. model.d_model=256

Each side decodes once untimed, once timed without the profiler (its tokens/s), then once under torch.profiler.
"""
import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cli import ascii_numbers  # noqa: E402
from benchmarks.decode import our_generation, their_generation  # noqa: E402  (the repo root: bench.py's runs)
from benchmarks.hf import build_pair  # noqa: E402
from benchmarks.sizes import full_sizes  # noqa: E402
from benchmarks.timing import Device  # noqa: E402
from training.config import model_config  # noqa: E402


def main(argv=None):
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    sizes, device, new = full_sizes(args.overrides), Device("cpu"), args.new_tokens
    cfg = model_config(sizes.compose())  # as bench.py's decode runs build it
    ours, theirs = build_pair(replace(cfg, context_length=sizes.prompt_tokens + new), device)
    prompts = torch.randint(cfg.vocab_size, (1, sizes.prompt_tokens), generator=torch.Generator().manual_seed(0))
    for name, run in (("this repo's Engine", our_generation(ours.eval(), prompts, new, True, device)),
                      ("transformers' generate", their_generation(theirs.eval(), prompts, new, device))):
        run()
        started = time.perf_counter()
        run()
        wall = time.perf_counter() - started
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        print(f"\n== {name}: {new / wall:,.0f} tokens/s, {wall / new * 1e6:.0f} us a token; ATen: "
              f"{sum(e.count for e in ops) / new:.0f} calls, {sum(e.self_cpu_time_total for e in ops) / new:.0f} us "
              f"of self CPU time a token (profiled) ==")
        for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:10]:
            print(f"  {e.key:<50} calls {e.count / new:6.1f}  us {e.self_cpu_time_total / new:7.1f}")


if __name__ == "__main__":
    main()
