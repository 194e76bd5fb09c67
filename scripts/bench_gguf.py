"""Batch-1 decode speed of llama.cpp (through llama-cpp-python) against generate.py's Engine, on the same weights.

    python scripts/bench_gguf.py --ckpt outputs/<date>/<time> [--dtype f32 f16 q8_0] [--threads N] [--repeats 5]

The checkpoint's weights at bench.py's decode sizes: greedy, 512 new tokens after a 16-token prompt, with the
context raised to 1024 so that they fit (RoPE's tables are computed, not stored: the weights are unchanged), so
for llama_tiny the figures line up with bench.py's decode rows. llama.cpp gets the model as export.py --format
gguf writes it, once per --dtype; ours runs in float32 through generation.engine.Engine, eagerly, with the KV
cache (generate.py's default). tokens/s = new tokens / the wall time of the whole generation, the prompt's
prefill included, as bench.py counts. llama.cpp runs Llama.generate at temperature 0 (its C sampler, called from
Python's loop, as a Python user runs it), its KV cache emptied before each run. The runs alternate
(bench.timed_alternately: A B C, C B A, ...) after one untimed warm-up each. Printed per engine: the range and
median of tokens/s over --repeats runs and, for llama.cpp, the ratio of medians to ours with the range of the
per-round ratios; and whether llama.cpp's f32 tokens equal ours (positions past the trained context included,
so a near-tie there may part them). Needs llama-cpp-python (pip install llama-cpp-python).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import sys
import tempfile
from pathlib import Path

import llama_cpp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench  # noqa: E402  (the repo root, for bench's timing and our generation run)
from interop.gguf import DTYPES, write_gguf  # noqa: E402
from model import Transformer  # noqa: E402
from storage.checkpoint import load_checkpoint  # noqa: E402

PROMPT_TOKENS, NEW_TOKENS, CONTEXT = 16, 512, 1024  # bench.py's decode sizes


def open_llama_cpp(path: Path, n_ctx: int, threads: int, **settings) -> llama_cpp.Llama:
    """llama_cpp.Llama on `path`, quiet; on a CPU with AMX, without weight repacking (llama-cli --no-repack):
    llama.cpp's AMX repack of q8_0 weights segfaults at the first matmul there (llama.cpp issue 20824)."""
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def no_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params
    if b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info():
        llama_cpp.llama_cpp.llama_model_default_params = no_repack  # Llama() has no argument for it
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               verbose=False, **settings)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults


def llama_cpp_generation(path: Path, prompt: list[int], new_tokens: int, threads: int):
    llm = open_llama_cpp(path, CONTEXT, threads)

    def run() -> list[int]:
        llm.reset()
        return list(itertools.islice(llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True),
                                     new_tokens))
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="a run dir or checkpoint dir (a LLaMA)")
    parser.add_argument("--dtype", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trained, ckpt_dir = load_checkpoint(args.ckpt)
    model = Transformer(dataclasses.replace(trained.cfg, context_length=CONTEXT)).eval()
    model.load_state_dict(trained.state_dict())
    prompt = torch.randint(model.cfg.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))

    runs = {"ours (Engine, f32)": bench.our_generation(model, prompt, NEW_TOKENS, use_cache=True,
                                                       device=bench.Device("cpu"))}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtype:
            path = Path(tmp) / f"model-{dtype}.gguf"
            write_gguf(model, ckpt_dir / "tokenizer.model", path, dtype)
            runs[f"llama.cpp, {dtype}"] = llama_cpp_generation(path, prompt[0].tolist(), NEW_TOKENS, args.threads)
        load_before = os.getloadavg()[0]
        seconds, last, _ = bench.timed_alternately("decode, batch 1", runs, args.repeats, bench.Device("cpu"))
    ours = "ours (Engine, f32)"
    print(f"{bench.machine(bench.Device('cpu'))} | {args.threads} threads | load {load_before:.1f} -> "
          f"{os.getloadavg()[0]:.1f} | {model.num_params():,} parameters | batch 1, {PROMPT_TOKENS}-token prompt + "
          f"{NEW_TOKENS} new, greedy | {args.repeats} runs each\n")
    print("| engine | decode tokens/s, median | range | vs ours, ratio of medians | per-round ratios |")
    print("|---|---|---|---|---|")
    for name, s in seconds.items():
        speeds = [NEW_TOKENS / t for t in s]
        row = f"| {name} | {statistics.median(speeds):,.0f} | {min(speeds):,.0f} - {max(speeds):,.0f} |"
        if name == ours:
            print(row + " 1 | |")
            continue
        ratios = [o / t for o, t in zip(seconds[ours], s)]
        print(row + f" {statistics.median(seconds[ours]) / statistics.median(s):.2f} | "
                    f"{min(ratios):.2f} - {max(ratios):.2f} |")
    if "f32" in args.dtype:
        ours_ids, theirs_ids = last[ours][1][0].tolist(), last["llama.cpp, f32"]
        first = next((i for i, (a, b) in enumerate(zip(ours_ids, theirs_ids)) if a != b), None)
        print("\nllama.cpp f32 tokens " + ("equal ours" if first is None else f"part from ours at new token {first}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
