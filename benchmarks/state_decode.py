"""Decode that does not grow: per-token decode time and cache bytes at long contexts, full attention against the
Gated DeltaNet hybrid and an all-linear model (model/gated_deltanet.py). A cache of K and V makes each step read every
earlier position, so a step costs more the longer the context; a fixed state costs the same at any length.

    python -m benchmarks.state_decode                    # contexts 256, 1,024, 4,096 and 16,384, 3 timed rounds
    python -m benchmarks.state_decode --contexts 256 1024 --repeats 5 --json out.json

Each model prefills N random tokens at each context N once, then every (model, context) pair decodes `--steps`
tokens per round, in turn (forwards, then backwards the next round), each round going on from where its last one
ended after one untimed step (which brings the model's weights back into the CPU's caches, whatever the pair before
it left there: a 16k KV cache is larger than them); a round's per-token time is its seconds over its steps. Every
pair runs WARM_UP_ROUNDS untimed rounds first. Growth: the median over rounds of a round's per-token time at the
longest context less that at the shortest (the two timed seconds apart, not minutes: the machine's drift cancels),
with its range over the rounds, and each model's over llama_tiny's; the all-linear's is to be read against its range.
Models: llama_tiny, llama_tiny of one layer, qwen35_tiny (the 3:1 hybrid) and qwen35_tiny with every layer linear,
random weights, fp32.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from cli import Parser, run_command
from errors import UsageError
from model import Transformer
from settings import compose_config
from storage.files import write_json
from training.config import model_config

ALL_LINEAR = ["model.linear_pattern=all", "position=none", "qk_norm=none", "model.attention_gate=false",
              "model.rotary_fraction=1.0"]
# llama_tiny cut to one layer: the hybrid's one attention layer and its cache, with no other layer around them
MODELS = {"llama_tiny": ["model=llama_tiny"], "llama_tiny, 1 layer": ["model=llama_tiny", "model.n_layers=1"],
          "qwen35_tiny (3:1)": ["model=qwen35_tiny"], "all linear": ["model=qwen35_tiny", *ALL_LINEAR]}
PREFILL_CHUNK = 1024  # the prompt is read this many positions at a time: a 16k prefill's attention stays small
WARM_UP_ROUNDS = 2  # untimed rounds of every model at every context first: the process's first rounds ran twice as slow


def parse_args(argv):
    parser = Parser(prog="python -m benchmarks.state_decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--steps", type=int, default=32, help="decode steps per round (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3), after one untimed")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    for name in ("steps", "repeats", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name}={getattr(args, name)} must be >= 1")
    if min(args.contexts) < 1 or len(set(args.contexts)) < 2:
        raise UsageError(f"--contexts {' '.join(map(str, args.contexts))}: at least two different positive lengths")
    return args


@torch.inference_mode()
def decoder(model: Transformer, context: int, steps: int, rounds: int):
    """A cache holding `context` random tokens (prefilled) and a function that decodes `steps` more into it, going on
    from where the last call ended; it returns the seconds that took."""
    generator = torch.Generator().manual_seed(context)
    tokens = torch.randint(model.cfg.vocab_size, (1, context), generator=generator)
    cache = model.new_kv_cache(1, context + (steps + 1) * rounds)
    for start in range(0, context, PREFILL_CHUNK):
        logits = model(tokens[:, start:start + PREFILL_CHUNK], start, cache, last_only=True)
    position = context

    def step() -> None:
        nonlocal logits, position
        logits = model(logits[:, -1].argmax(-1, keepdim=True), position, cache, last_only=True)
        position += 1

    def run() -> float:
        with torch.inference_mode():
            step()  # untimed: the model's weights back in the CPU's caches, whatever the model before it left there
            clock = time.perf_counter()
            for _ in range(steps):
                step()
            return time.perf_counter() - clock
    return run


def measure(args) -> dict:
    torch.manual_seed(0)
    models = {name: Transformer(model_config(compose_config(overrides))).eval() for name, overrides in MODELS.items()}
    runs = {}
    for context in sorted(args.contexts):
        print(f"bench: context {context:,}: prefilling", file=sys.stderr, flush=True)
        for name, model in models.items():
            runs[name, context] = decoder(model, context, args.steps, args.repeats + WARM_UP_ROUNDS)
    seconds = {key: [] for key in runs}
    for round_ in range(1 - WARM_UP_ROUNDS, args.repeats + 1):  # rounds up to 0 untimed
        for key in list(runs)[::1 if round_ % 2 == 0 else -1]:
            elapsed = runs[key]()
            if round_ > 0:
                seconds[key].append(elapsed / args.steps)
    short, long = min(args.contexts), max(args.contexts)
    results = {}
    for name, model in models.items():
        contexts = {context: {"ms_per_token": statistics.median(seconds[name, context]) * 1e3,
                              "ms_range": [min(seconds[name, context]) * 1e3, max(seconds[name, context]) * 1e3],
                              "cache_bytes": model.kv_cache_bytes(context)} for context in sorted(args.contexts)}
        # each round's own long-less-short: the two were timed seconds apart, so a drift of the machine's speed
        # over the minutes of the run cancels out of the difference
        growths = [(at_long - at_short) * 1e3 for at_short, at_long in zip(seconds[name, short], seconds[name, long])]
        results[name] = {"num_params": model.num_params(), "contexts": contexts,
                         "growth_ms": statistics.median(growths), "growth_range_ms": [min(growths), max(growths)]}
    baseline = results["llama_tiny"]["growth_ms"]
    for row in results.values():
        row["growth_vs_llama_tiny"] = row["growth_ms"] / baseline
    return results


def table(results: dict) -> str:
    contexts = list(next(iter(results.values()))["contexts"])
    header = ("| model | " + " | ".join(f"{c:,}: ms/token (range), cache bytes" for c in contexts)
              + " | growth ms/token (range over rounds) | vs llama_tiny's growth |")
    lines = [header, "|" + "---|" * (len(contexts) + 4)]
    for name, row in results.items():
        cells = [f"{c['ms_per_token']:.2f} ({c['ms_range'][0]:.2f}-{c['ms_range'][1]:.2f}), {c['cache_bytes']:,}"
                 for c in row["contexts"].values()]
        low, high = row["growth_range_ms"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['growth_ms']:+.2f} ({low:+.2f} to {high:+.2f}) | "
                     f"{row['growth_vs_llama_tiny']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    def run():
        args = parse_args(argv)
        torch.set_num_threads(args.threads)
        results = measure(args)
        print(f"{torch.get_num_threads()} threads | fp32 | medians of {args.repeats} rounds of {args.steps} steps\n")
        print(table(results))
        if args.json:
            write_json(args.json, results)
    return run_command(run)


if __name__ == "__main__":
    sys.exit(main())
