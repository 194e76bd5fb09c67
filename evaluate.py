"""Score a checkpoint's val split at any length, past its trained context too, chunked and with a sliding window.

    python evaluate.py --ckpt outputs/<date>/<time> --lengths 128,256,512,1024 --json lengths.json
    python evaluate.py --ckpt RUN --lengths 512 --rope-scaling yarn --rope-factor 4 --stride 64
    python evaluate.py --ckpt RUN --lengths 128 --mode training     # training's eval set: the run's last val bpb
    python evaluate.py --ckpt RUN --lengths 1024 --mode streaming --sink-tokens 4   # StreamingLLM, 8x the context

For each length L and mode (chunked, sliding; both by default), the val bits per byte over the scored tokens and
per bucket of positions inside the window (insight/lengths.py says what each mode scores). The val split is the
run's own (its config.yaml's data settings, the token cache training used); every length scores the same first
--max-tokens of it, except --mode training, which scores training's own eval windows (train.eval_tokens // L of
them, spread over the whole split) as train.py does, under its autocast (bf16 on CUDA). --rope-scaling and
--rope-factor read the weights under a RoPE scaling (model/rope_scaling.py), the checkpoint's context as the
original one. Writes --json (the results) and a figure of bpb against position (--plot, default: the JSON's name
with .png), each whole or not at all. docs/long_context.md has the study this serves.

It prints the run dir it loaded (resolved: outputs/latest's target, not the link). Bad input is one `error:` line
and exit 2 before any scoring: a length longer than the split, sizes whose position tables and logits would not
fit in memory, an output path no write could succeed at. A write that fails anyway (a full disk) prints the
results to stdout first, then its `error: cannot write <file>: <reason>` line.
"""
import sys

from cli import run_command
from insight.evaluation import evaluate_and_write


def main(argv: list[str] | None = None) -> int:
    return run_command(lambda: evaluate_and_write(argv))


if __name__ == "__main__":
    sys.exit(main())
