"""The recall probe: how many key-value pairs the study's trained models recall from their context, zero-shot (MQAR,
tasks/mqar.py's sequences, in the models' own vocabulary).

    python scripts/recall_probe.py multirun/equal_time_gdn/runs --json docs/recall_gdn.json
    python scripts/recall_probe.py outputs/run_a outputs/run_b --pairs 2 4 8

Every run dir with a checkpoint under the paths given is one run; the seeds of one config are one line, named as
compare.py names its variants (study/variants.py). Every line gets the same held-out sequences, drawn from the
ordinary pieces of the one vocabulary they share (no control, unknown or byte piece); the accuracy is the share of
queries whose most likely next token is their answer. Chance is one in the number of pieces.
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli import ascii_numbers, run_command  # noqa: E402  (after the path: run as a script from anywhere)
from errors import UsageError  # noqa: E402
from storage.checkpoint import CheckpointError, read_checkpoint  # noqa: E402
from storage.files import write_json  # noqa: E402
from study.runs import find_run_dirs, load_run  # noqa: E402
from study.tables import fmt_mean_std  # noqa: E402
from study.variants import group_runs  # noqa: E402
from tasks.base import IGNORE  # noqa: E402
from tasks.mqar import MQAR  # noqa: E402

PAIRS = [4, 8, 16, 32]
SEED = 0  # the held-out sequences' generator
BATCH = 64  # sequences per forward pass


@torch.no_grad()
def recall_accuracy(model: torch.nn.Module, pairs: int, tokens: torch.Tensor, sequences: int) -> float:
    """The share of queries whose most likely next token is their answer, over `sequences` held-out sequences (MQAR's,
    each symbol one of `tokens`)."""
    task = MQAR({"pairs": pairs}, len(tokens), 4 * pairs, SEED)
    symbols, targets = task.generate(sequences, pairs, np.random.default_rng([SEED, pairs]))
    inputs, answered = tokens[torch.from_numpy(symbols)], torch.from_numpy(targets != IGNORE)
    answers = tokens[torch.from_numpy(targets)[answered]]
    predicted = torch.cat([model(inputs[start:start + BATCH]).argmax(-1) for start in range(0, sequences, BATCH)])
    return (predicted[answered] == answers).float().mean().item()


def ordinary_pieces(tokenizer_proto: bytes) -> torch.Tensor:
    sp = spm.SentencePieceProcessor(model_proto=tokenizer_proto)
    return torch.tensor([i for i in range(sp.vocab_size())
                         if not (sp.IsControl(i) or sp.IsUnknown(i) or sp.IsByte(i) or sp.IsUnused(i))])


def main(argv=None) -> int:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs, or folders of them")
    parser.add_argument("--pairs", type=int, nargs="+", default=PAIRS)
    parser.add_argument("--sequences", type=int, default=256, help="held-out sequences per number of pairs")
    parser.add_argument("--json", type=Path, help="write every run's accuracies here")
    args = parser.parse_args(argv)
    if min(args.pairs) < 1 or args.sequences < 1:
        parser.error(f"--pairs {' '.join(map(str, args.pairs))} --sequences {args.sequences}: each must be >= 1")
    return run_command(lambda: probe(args))


def probe(args) -> None:
    run_dirs = [d for path in args.paths for d in find_run_dirs(path) if (d / "ckpt").is_dir()]
    if not run_dirs:
        raise UsageError(f"{' '.join(map(str, args.paths))}: no run dir with a checkpoint (ckpt/) there")
    try:
        checkpoints = {d: read_checkpoint(d) for d in run_dirs}
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    if len({c.files["tokenizer.model"] for c in checkpoints.values()}) > 1:
        raise UsageError("the runs have different vocabularies: the probe gives them all the same sequences")
    shortest = min(c.model.cfg.context_length for c in checkpoints.values())
    if 4 * max(args.pairs) > shortest:
        raise UsageError(f"--pairs {max(args.pairs)}: its sequences of {4 * max(args.pairs)} tokens are longer than "
                         f"a run's context, {shortest}")
    tokens = ordinary_pieces(next(iter(checkpoints.values())).files["tokenizer.model"])
    lines, runs = group_runs([load_run(d) for d in run_dirs]), []
    for line in lines:
        for run in line.runs:
            accuracy = {p: recall_accuracy(checkpoints[run.path].model, p, tokens, args.sequences) for p in args.pairs}
            runs.append({"run": str(run.path), "line": line.name, "accuracy": accuracy})
            print(f"{run.path}: " + ", ".join(f"{a:.3f} at {p} pairs" for p, a in accuracy.items()), flush=True)
    print(f"\n{len(tokens)} pieces: chance is {1 / len(tokens):.4f}\n")
    print(f"| line | runs | {' | '.join(f'{p} pairs' for p in args.pairs)} |")
    print("|---|---:|" + "---:|" * len(args.pairs))
    for line in lines:
        cells = [fmt_mean_std([run["accuracy"][p] for run in runs if run["line"] == line.name]) for p in args.pairs]
        print(f"| {line.name} | {len(line.runs)} | {' | '.join(cells)} |")
    if args.json:
        write_json(args.json, {"pairs": args.pairs, "sequences": args.sequences, "pieces": len(tokens),
                               "runs": runs})


if __name__ == "__main__":
    sys.exit(main())
