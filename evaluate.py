"""Score a checkpoint's val split at any length, past its trained context too, chunked and with a sliding window.

    python evaluate.py --ckpt outputs/<date>/<time> --lengths 128,256,512,1024 --json lengths.json
    python evaluate.py --ckpt RUN --lengths 512 --rope-scaling yarn --rope-factor 4 --stride 64

For each length L and mode (chunked, sliding; both by default), the val bits per byte over the scored tokens and
per bucket of positions inside the window (insight/lengths.py says what each mode scores). The val split is the
run's own (its config.yaml's data settings, the token cache training used); every length scores the same first
--max-tokens of it. --rope-scaling and --rope-factor read the weights under a RoPE scaling (model/rope_scaling.py),
the checkpoint's context as the original one. Writes --json (the results) and a figure of bpb against position
(--plot, default: the JSON's name with .png). docs/long_context.md has the study this serves.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from cli import Parser
from errors import UsageError
from insight.figures import loss_by_position, png
from insight.lengths import MODES, run_val_split, score
from interop.load import load_model
from model.rope_scaling import SCALINGS
from storage.checkpoint import check_vocab
from storage.files import write_bytes, write_json


def parse_args(argv: list[str] | None):
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="a run dir or its ckpt/ dir (the run's config.yaml names its data)")
    parser.add_argument("--lengths", required=True, help="window lengths in tokens, comma-separated: 128,256,512")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--stride", type=int, help="the sliding window's step, at most the length (default: L / 2)")
    parser.add_argument("--bucket", type=int, help="positions per bucket (default: the trained context / 4)")
    parser.add_argument("--rope-scaling", choices=SCALINGS, help="read RoPE's weights under this scaling")
    parser.add_argument("--rope-factor", type=float, help="the scaling's factor s (> 1)")
    parser.add_argument("--max-tokens", type=int, default=65536, help="the val split's first tokens to score")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per forward")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="the figure (default: --json with .png)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        args.lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        raise UsageError(f"--lengths={args.lengths} must be integers separated by commas, e.g. 128,256,512") from None
    if min(args.lengths) < 2:
        raise UsageError(f"--lengths={min(args.lengths)} must be >= 2: a window of one token has no next token "
                         f"inside it")
    for flag, value in (("--stride", args.stride), ("--bucket", args.bucket), ("--max-tokens", args.max_tokens),
                        ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}={value} must be >= 1")
    if args.stride and args.stride > min(args.lengths):
        raise UsageError(f"--stride={args.stride} is longer than the length {min(args.lengths)}: windows would "
                         f"skip tokens")
    if (args.rope_scaling in (None, "none")) != (args.rope_factor is None):
        raise UsageError("--rope-scaling and --rope-factor go together: e.g. --rope-scaling yarn --rope-factor 4")
    if max(args.lengths) + 1 > args.max_tokens:
        raise UsageError(f"--max-tokens={args.max_tokens} holds no window of {max(args.lengths)} tokens")
    return args


def evaluate(args) -> dict:
    model, ckpt_dir = load_model(args.ckpt, args.device)
    check_vocab(model.cfg, ckpt_dir / "tokenizer.model")
    if args.rope_scaling:
        model = model.with_rope_scaling(args.rope_scaling, args.rope_factor or 1.0)
    model.fit_positions(max(args.lengths))  # a learned table past its rows: one error line before any work
    try:
        val, bytes_per_token = run_val_split(ckpt_dir)
    except UsageError as e:
        raise UsageError(f"--ckpt {args.ckpt}: {e}") from None
    stream = val[:args.max_tokens]
    if len(stream) < max(args.lengths) + 1:
        raise UsageError(f"the val split has {len(stream)} tokens, fewer than a window of {max(args.lengths)} + 1")
    cfg = model.cfg
    bucket = args.bucket or max(1, cfg.original_context // 4)
    modes = MODES if args.mode == "both" else (args.mode,)
    results = []
    for length in args.lengths:
        for mode in modes:
            results.append(score(model, stream, length, mode, args.stride or max(1, length // 2), bucket,
                                 bytes_per_token, args.batch_size))
            print(f"length {length:>6} {mode:<8} val bpb {results[-1]['val_bpb']:.4f} "
                  f"({results[-1]['tokens']:,} tokens)", flush=True)
    return {"ckpt": str(ckpt_dir), "context_length": cfg.context_length, "original_context": cfg.original_context,
            "position": cfg.position, "rope_scaling": cfg.rope_scaling, "rope_factor": cfg.rope_factor,
            "val_tokens": len(stream), "bytes_per_token": bytes_per_token, "results": results}


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        with torch.no_grad():
            result = evaluate(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if args.json:
        write_json(args.json, result)
    if plot:
        write_bytes(plot, png(loss_by_position(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
