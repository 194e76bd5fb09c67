"""evaluate.py's work: its flags, checked before any scoring, a checkpoint's val split scored at each length and mode
(insight/lengths.py's score), and the results written whole (the JSON and the figure of bpb against position).
A length study (study/lengths.py) runs the same command through evaluate_and_write."""
from __future__ import annotations

import errno
import json
import os
from contextlib import suppress
from pathlib import Path

import torch
from omegaconf import DictConfig

from cli import Parser
from errors import ConfigError, UsageError
from generation.engine import SamplingError, check_sink_tokens
from generation.memory import memory_shortfall
from insight.figures import loss_by_position, png
from insight.lengths import MODES, run_config, run_val_split, score, window_count
from interop.load import load_model, loaded_line
from model.block import rope_dim
from model.positions import table_bytes
from model.rope_scaling import SCALINGS, scales
from parsing import whole_numbers
from storage.checkpoint import check_vocab
from storage.files import atomic_write, write_json, writing
from training.config import autocast_for, eval_window_count

BOTH = ("chunked", "sliding")


def parse_args(argv: list[str] | None):
    parser = Parser(description="Score a checkpoint's val split at any length, past its trained context too, chunked "
                                "and with a sliding window.")
    parser.add_argument("--ckpt", required=True, help="a run dir or its ckpt/ dir (the run's config.yaml names its data)")
    parser.add_argument("--lengths", required=True, help="window lengths in tokens, comma-separated: 128,256,512")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both", help="both: chunked and sliding")
    parser.add_argument("--stride", type=int, help="the sliding window's step, at most the length (default: L / 2)")
    parser.add_argument("--sink-tokens", type=int, help="--mode streaming: the first tokens the cache keeps, beside "
                        "a rolling window of the rest of the trained context (0: the window alone; leave it out "
                        "for a windowed model's own rolling cache)")
    parser.add_argument("--bucket", type=int, help="positions per bucket (default: the trained context / 4)")
    parser.add_argument("--rope-scaling", choices=SCALINGS, help="read RoPE's weights under this scaling")
    parser.add_argument("--rope-factor", type=float, help="the scaling's factor s (> 1)")
    parser.add_argument("--max-tokens", type=int, default=65536, help="the val split's first tokens to score")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per forward")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="the figure (default: --json with .png)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    lengths = whole_numbers(args.lengths)
    if lengths is None:
        raise UsageError(f"--lengths={args.lengths} must be integers separated by commas, e.g. 128,256,512")
    args.lengths = lengths
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
    if scales(args.rope_scaling) == (args.rope_factor is None):
        raise UsageError("--rope-scaling and --rope-factor go together: e.g. --rope-scaling yarn --rope-factor 4")
    if max(args.lengths) + 1 > args.max_tokens:
        raise UsageError(f"--max-tokens={args.max_tokens} holds no window of {max(args.lengths)} tokens")
    if args.sink_tokens is not None and args.mode != "streaming":
        raise UsageError(f"--sink-tokens={args.sink_tokens} is a setting of --mode streaming, not --mode {args.mode}")
    args.modes = BOTH if args.mode == "both" else (args.mode,)
    args.plot = args.plot or (args.json.with_suffix(".png") if args.json else None)
    for path in (args.json, args.plot):
        if path is not None:
            check_writable(path)
    return args


def check_writable(path: Path) -> None:
    """Refuses, before minutes of scoring, a path no write can succeed at: a directory, or a parent that is
    missing, not a directory or not writable (a full disk only shows at the write itself)."""
    parent = path.parent
    if path.is_dir():
        reason = errno.EISDIR
    elif not parent.exists():
        reason = errno.ENOENT
    elif not parent.is_dir():
        reason = errno.ENOTDIR
    elif not os.access(parent, os.W_OK):
        reason = errno.EACCES
    else:
        return
    raise UsageError(f"cannot write {path}: {os.strerror(reason)}")  # the OS's own words for the same failure


def evaluate(args) -> dict:
    model, ckpt_dir = load_model(args.ckpt, args.device)
    check_vocab(model.cfg, ckpt_dir / "tokenizer.model")
    if args.rope_scaling:
        model = model.with_rope_scaling(args.rope_scaling, args.rope_factor or 1.0)
    try:
        val, bytes_per_token = run_val_split(ckpt_dir)
        train = run_config(ckpt_dir).train
    except UsageError as e:
        raise UsageError(f"--ckpt {args.ckpt}: {e}") from None
    stream = val[:args.max_tokens]
    cfg = model.cfg
    windows = {(length, mode): checked_window_count(args, len(stream), len(val), train, length, mode)
               for length in args.lengths for mode in args.modes}
    # What scoring allocates at least, before any of it is: the position tables, and one batch's logits with the
    # log-softmax cross_entropy makes of them (fp32, B x L x V each)
    length, batch = max(((n, min(args.batch_size, count)) for (n, _), count in windows.items()),
                        key=lambda nb: nb[0] * nb[1])
    needs = {"the position tables": table_bytes(cfg, rope_dim(cfg), max(args.lengths)),
             "one batch's logits and log-probabilities": 2 * batch * length * cfg.vocab_size * 4}
    if shortfall := memory_shortfall(needs, args.device):
        raise UsageError(f"--lengths={max(args.lengths)} at --batch-size={args.batch_size} {shortfall}")
    model.fit_positions(max(args.lengths))  # a learned table past its rows: one error line before any work
    if "streaming" in args.modes:
        check_streaming(model, args.sink_tokens)
    print(loaded_line(ckpt_dir), flush=True)
    bucket = args.bucket or max(1, cfg.original_context // 4)
    results = []
    for (length, mode), count in windows.items():
        results.append(score(model, val if mode == "training" else stream, length, mode, stride(args, length),
                             bucket, bytes_per_token, args.batch_size, count, args.sink_tokens))
        print(f"length {length:>6} {mode:<8} val bpb {results[-1]['val_bpb']:.4f} "
              f"({results[-1]['tokens']:,} tokens)", flush=True)
    return {"ckpt": str(ckpt_dir), "context_length": cfg.context_length, "original_context": cfg.original_context,
            "position": cfg.position, "rope_scaling": cfg.rope_scaling, "rope_factor": cfg.rope_factor,
            "val_tokens": len(stream), "bytes_per_token": bytes_per_token, "results": results}


def check_streaming(model, sink_tokens: int | None) -> None:
    """The streaming mode's cache for this model, refused in one line where it cannot be: sink tokens the model
    cannot take (generation.engine.check_sink_tokens), or a model with full layers and no sink tokens, whose
    cache would not roll."""
    cfg = model.cfg
    try:
        check_sink_tokens(model, sink_tokens, cfg.context_length)
    except SamplingError as e:
        raise UsageError(f"--{e.setting.replace('_', '-')}={e.value} {e.rule}") from None
    if sink_tokens is None and cfg.n_local_layers < cfg.n_layers:
        raise UsageError("--mode streaming needs --sink-tokens (0: the window alone) for a model with full layers: "
                         "only a model whose layers are all local streams in its own rolling cache")
    if refusal := model.stream_refusal(None):  # with sink tokens check_sink_tokens has refused it
        raise UsageError(f"--mode streaming {refusal}")


def checked_window_count(args, n_stream: int, n_val: int, train: DictConfig, length: int, mode: str) -> int:
    """The windows `mode` scores at `length` (the training mode's: the run's train.eval_tokens // length, as
    train.py counts them); a UsageError naming --lengths when the split holds none."""
    if mode == "training":
        if length + 1 <= n_val:
            with suppress(ConfigError):  # train.eval_tokens shorter than one window
                return eval_window_count(train, length)
        raise UsageError(f"--lengths={length} --mode training: training's eval set, train.eval_tokens="
                         f"{train.eval_tokens} tokens of a val split of {n_val:,}, holds no window of {length}")
    if length + 1 > n_stream:
        raise UsageError(f"--lengths={length}: the val split's first --max-tokens={args.max_tokens} hold "
                         f"{n_stream:,} tokens, fewer than a window of {length:,} + 1")
    return window_count(n_stream, length, mode, stride(args, length))


def stride(args, length: int) -> int:
    return args.stride or max(1, length // 2)


def evaluate_and_write(argv: list[str] | None) -> None:
    args = parse_args(argv)
    with torch.no_grad(), autocast_for(torch.device(args.device)):  # training's eval precision
        result = evaluate(args)
    writes = [(args.json, lambda path: write_json(path, result)),
              (args.plot, lambda path: atomic_write(path, lambda f: f.write(png(loss_by_position(result)))))]
    for path, write in writes:
        if path is None:
            continue
        try:
            with writing(path):
                write(path)
        except UsageError:  # a full disk: the file is as it was, and the results are not lost
            if path == args.json or args.json is None:
                print(json.dumps(result, indent=2))
            raise
