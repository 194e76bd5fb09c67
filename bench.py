"""Throughput of this repo's models against their peers, in one process on one machine.

    python bench.py [--device cpu|cuda] [--threads N] [--repeats N] [--json PATH] [--plot PATH] [--quick]
                    [--no-compile] [overrides]
    python bench.py --ablation [--repeats N] [--json PATH] [overrides]   # training tokens/s of each ablation variant
    python bench.py --against DIR [--repeats N] [--json PATH] [overrides]  # this tree against another checkout
    python bench.py --caches [--long] [--repeats N] [--json PATH] [overrides]  # decode with GQA's, MQA's, MLA's caches
    python bench.py --streaming [--repeats N] [--json PATH] [overrides]  # 20,000 tokens past the context, 3 ways

llama_tiny is what `python train.py [overrides]` trains; every peer is composed from configs/ and the overrides
as train.py composes them. How each figure is measured, and what each mode compares: benchmarks/__init__.py.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import transformers

from benchmarks.against import OtherTree, against_peers, against_tables, bench_against
from benchmarks.decode import (bench_caches, bench_decode, bench_streaming, cache_peers, caches_tables,
                                streaming_peers, streaming_tables)
from benchmarks.sizes import LONG_FACTOR, QUICK_LONG_FACTOR, STREAM_TOKENS, full_sizes, long_sizes, quick_sizes
from benchmarks.tables import TARGETS, plot, table, training_table
from benchmarks.timing import Device, machine, speed_table
from benchmarks.train_steps import ablation_peers, bench_ablation, bench_training, training_peers
from cli import Parser, run_command
from errors import UsageError
from storage.files import write_json
from training.config import model_config


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


def main(argv=None) -> int:
    return run_command(lambda: bench(argv))


def bench(argv) -> int:
    args = parse_args(argv)
    device = Device(args.device)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # generate's notes on unused sampling flags
    torch.manual_seed(0)
    sizes = (quick_sizes if args.quick else full_sizes)(args.overrides)
    # every peer is built before the first measurement, so that a bad setting (a bad override, a setting that
    # builds no model, one transformers cannot mirror) costs no time
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
