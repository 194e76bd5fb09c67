"""Generate text from a checkpoint, with the KV cache (default) or without it (--no-kv-cache).

    python generate.py --ckpt outputs/<date>/<time> --prompt "ROMEO:" --max-new-tokens 200 --top-k 50

    python generate.py --ckpt RUN --context 512 --rope-scaling yarn --rope-factor 4   # 4x the trained context
    python generate.py --ckpt RUN --max-new-tokens 20000 --sink-tokens 4     # StreamingLLM: no re-prefill

Past the context a generation slides (re-prefilling the last half of it) unless its cache rolls: a model whose
layers are all local (model.window) streams in its own rolling cache, and --sink-tokens S makes the full layers
keep their first S positions and a rolling window of the rest (StreamingLLM, docs/generation.md).

The prompt is BOS followed by --prompt's tokens. The first sample streams to stdout as its tokens
arrive; with --num-samples N > 1 each sample gets a `--- sample i ---` header and samples 2 .. N are
printed once the batch is done; the prompt is prefilled once for all N (its KV cache copied to each
sample's row). stderr gets the checkpoint's run dir first (the resolved path: outputs/latest's target, not the
link), and afterwards prompt tokens, generated tokens, prefill and decode tokens/s and the KV cache's bytes.
Bad input: one `error: ...` line on stderr, exit 2; a --context, --num-samples or --max-new-tokens whose tables,
cache or token window would not fit in memory is refused so, before anything of that size is allocated.
"""
import argparse
import sys

import torch

from cli import Parser
from data.tokenizer import Tokenizer
from errors import UsageError
from generation.engine import Engine, SamplingError, check_sampling, compiled_decoder
from interop.load import load_model, loaded_line
from model.rope_scaling import SCALINGS, scales
from storage.checkpoint import check_vocab

MAX_NUM_SAMPLES = 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(description="Generate text from a nanollama checkpoint.")
    parser.add_argument("--ckpt", required=True, help="a run dir or its ckpt/ dir")
    parser.add_argument("--prompt", default="", help="text after BOS (default: BOS only)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="sample in the smallest set whose probability exceeds p")
    parser.add_argument("--seed", type=int, help="the same seed gives the same text")
    parser.add_argument("--num-samples", type=int, default=1, help="samples generated together, as one batch")
    parser.add_argument("--no-kv-cache", action="store_true", help="recompute the whole prefix every step")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="run every sample for --max-new-tokens, for benchmarks")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the decode step: seconds of compiling at the first step "
                             "(docs/performance.md), which pay off on long generations")
    parser.add_argument("--context", type=int, help="the positions a generation uses before its window slides "
                        "(default: the trained model.context_length); past it with a --rope-scaling")
    parser.add_argument("--rope-scaling", choices=SCALINGS, help="read RoPE's positions under this scaling "
                        "(model/rope_scaling.py), the trained context as the original one")
    parser.add_argument("--rope-factor", type=float, help="the scaling's factor s (> 1), e.g. --context / the trained one")
    parser.add_argument("--sink-tokens", type=int, help="StreamingLLM: past the context, keep the first S tokens "
                        "and a rolling window of the last context - S, instead of re-prefilling (0: the window alone)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.context is not None and args.context < 2:
        raise UsageError(f"--context={args.context} must be >= 2")
    if scales(args.rope_scaling) == (args.rope_factor is None):
        raise UsageError("--rope-scaling and --rope-factor go together: e.g. --rope-scaling yarn --rope-factor 4")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # the shell passed bytes that are not UTF-8 (Python keeps them as surrogates)
        bad = args.prompt[e.start].encode("utf-8", "surrogateescape")
        raise UsageError(f"--prompt is not UTF-8 text: byte 0x{bad.hex()} at character {e.start}") from None
    if args.compile and args.no_kv_cache:
        raise UsageError("--compile compiles the cached decode step; it does nothing with --no-kv-cache")
    if args.sink_tokens is not None and args.no_kv_cache:
        raise UsageError(f"--sink-tokens={args.sink_tokens} keeps tokens in the KV cache; it does nothing with "
                         f"--no-kv-cache")
    try:
        check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    except SamplingError as e:
        raise as_flag(e) from None
    if not 1 <= args.num_samples <= MAX_NUM_SAMPLES:
        raise UsageError(f"--num-samples={args.num_samples} must be in [1, {MAX_NUM_SAMPLES}]")
    try:
        torch.empty(0, device=args.device)
    except (RuntimeError, AssertionError, NotImplementedError) as e:  # unknown name, or a backend not built in
        raise UsageError(f"--device={args.device} is not usable here: {str(e).splitlines()[0]}") from None
    return args


def as_flag(e: SamplingError) -> UsageError:
    """The engine's refusal of a setting, in the words of this command's flag."""
    return UsageError(f"--{e.setting.replace('_', '-')}={e.value} {e.rule}")


class TextStream:
    """Prints a growing token sequence as text. Each call decodes the whole sequence and prints what
    is new, so pieces that only make sense together (the UTF-8 bytes of one character, in byte
    fallback) come out right; an unfinished character decodes as U+FFFD and is held back."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.printed = ""

    def show(self, ids: list[int], final: bool = False) -> None:
        text = self.tokenizer.decode(ids)
        if not final:
            text = text.rstrip("\ufffd")
        if text.startswith(self.printed):
            sys.stdout.write(text[len(self.printed):])
            sys.stdout.flush()
            self.printed = text


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        model, ckpt_dir = load_model(args.ckpt, args.device)
        tokenizer = check_vocab(model.cfg, ckpt_dir / "tokenizer.model")
        if args.rope_scaling:
            model = model.with_rope_scaling(args.rope_scaling, args.rope_factor or 1.0)
        prompt = [tokenizer.bos_id] + tokenizer.encode(args.prompt)
        try:  # a learned table refuses a longer context here; tables, cache or window too large for the memory too
            engine = Engine(model, tokenizer, context=args.context, sink_tokens=args.sink_tokens)
            steps = engine.generate([prompt], args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                                    args.seed, use_cache=not args.no_kv_cache,
                                    eos_id=None if args.ignore_eos else tokenizer.eos_id, num_samples=args.num_samples)
        except SamplingError as e:
            raise as_flag(e) from None
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(loaded_line(ckpt_dir), file=sys.stderr)  # stdout is the text alone
    if args.compile:
        print(f"torch.compile of the decode step: {compiled_decoder(engine, args.num_samples):.1f} s", file=sys.stderr)
    samples = [list(prompt) for _ in range(args.num_samples)]
    if args.num_samples > 1:
        print("--- sample 1 ---")
    stream = TextStream(tokenizer)
    for new_ids in steps:
        for sample, new_id in zip(samples, new_ids.tolist()):
            sample.append(new_id)  # an ended sample gets EOS again, which decode drops
        stream.show(samples[0])
    stream.show(samples[0], final=True)
    print()
    for i, sample in enumerate(samples[1:], start=2):
        print(f"--- sample {i} ---")
        print(tokenizer.decode(sample))
    print(engine.stats, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
