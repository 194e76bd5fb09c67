"""The recall study: the Gated DeltaNet study's lines trained on multi-query associative recall itself (MQAR,
data/recall.py; Zoology's protocol, Arora et al. 2023), each for the same seconds, then their accuracy at 4 to 32
pairs: where a fixed-size state and a cache that keeps every position part ways (Jelassi et al. 2024).

    python scripts/recall_study.py --out multirun/recall --variants baseline gdn_hybrid gdn_all --seconds 120 \
        --seeds 3 -- model.d_model=64 model.n_heads=4 train.batch_size=64
    python scripts/recall_study.py --out multirun/recall_long --variants baseline --steps 3000 --seeds 3 \
        --json docs/recall_trained.json -- model.d_model=64 model.n_heads=4 train.batch_size=64 train.lr=0.003 \
        train.min_lr=0.003

Each run is a line's model and optimizer as the ablation has them (`+experiment=ablation ablation=<variant>` and the
overrides after --, its own peak learning rate and schedule) with a vocabulary of --vocab tokens, trained on batches
of MQAR sequences with a number of pairs drawn uniformly from 1 to the largest --pairs per batch and the loss at the
answers only, for --seconds of training (or --steps: the budget, which the schedule spans), one run at a time. Then
its accuracy, the share of queries whose most likely next token is their answer, on the same held-out sequences
for every run at each --pairs. A run's result is OUT/<variant>/seed<seed>/result.json, written when it ends; a rerun
trains only the runs without one.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli import ascii_numbers, run_command  # noqa: E402  (after the path: run as a script from anywhere)
from data.recall import IGNORE, recall_batch  # noqa: E402
from errors import UsageError  # noqa: E402
from model import Transformer  # noqa: E402
from scripts.recall_probe import recall_accuracy  # noqa: E402
from settings import compose_config  # noqa: E402
from storage.files import write_json  # noqa: E402
from study.tables import fmt_mean_std  # noqa: E402
from training.config import model_config  # noqa: E402
from training.optim import lr_at, make_optimizer, set_lr  # noqa: E402

VARIANTS = ["baseline", "gdn_hybrid", "gdn_all"]
PAIRS = [4, 8, 16, 32]


def parse_args(argv):
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--out", type=Path, required=True, help="the study's dir: a dir per run")
    parser.add_argument("--variants", nargs="+", default=VARIANTS, help="configs/ablation/ lines")
    parser.add_argument("--seeds", type=int, default=3)
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--seconds", type=float, help="training time per run")
    budget.add_argument("--steps", type=int, help="training steps per run")
    parser.add_argument("--vocab", type=int, default=128, help="the task's tokens (default 128)")
    parser.add_argument("--pairs", type=int, nargs="+", default=PAIRS, help="the numbers of pairs to score")
    parser.add_argument("--sequences", type=int, default=256, help="held-out sequences per number of pairs")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", type=Path, help="write every run's accuracies here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run's config, after --")
    args = parser.parse_args(argv)
    for name in ("seeds", "vocab", "sequences", "threads", "steps", "seconds"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name}={value} must be > 0")
    if min(args.pairs) < 1 or 2 * max(args.pairs) > args.vocab:
        raise UsageError(f"--pairs {' '.join(map(str, args.pairs))} with --vocab {args.vocab}: each at least 1, "
                         f"and 2 x the largest distinct tokens at most the vocabulary")
    return args


def train_run(variant: str, cfg, args, seed: int) -> dict:
    """One line at one seed: its model trained on MQAR for the budget, then its accuracy at each --pairs."""
    torch.manual_seed(seed)
    model = Transformer(model_config(cfg, args.vocab))
    optimizer = make_optimizer(model, cfg.train)
    tokens, generator = torch.arange(args.vocab), torch.Generator().manual_seed(seed)
    step, trained_s, step_s, losses = 0, 0.0, 0.0, []
    while (step < args.steps) if args.steps else (trained_s < args.seconds):
        clock = time.perf_counter()
        # the schedule's fraction done, and the share of the run this step takes (in time: the last step's)
        done, share = (step / args.steps, 1 / args.steps) if args.steps else (trained_s / args.seconds,
                                                                             step_s / args.seconds)
        set_lr(optimizer, lr_at(done, share, cfg.train))
        pairs = int(torch.randint(1, max(args.pairs) + 1, (1,), generator=generator))
        inputs, targets = recall_batch(cfg.train.batch_size, pairs, tokens, generator)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step_s = time.perf_counter() - clock
        step, trained_s = step + 1, trained_s + step_s
    model.eval()
    accuracy = {p: recall_accuracy(model, p, tokens, args.sequences) for p in args.pairs}
    return {"variant": variant, "seed": seed, "lr": cfg.train.lr, "steps": step, "trained_s": trained_s,
            "num_params": model.num_params(), "last_loss": statistics.fmean(losses[-20:]), "accuracy": accuracy}


def study(args) -> None:
    torch.set_num_threads(args.threads)
    configs = {variant: compose_config(["+experiment=ablation", f"ablation={variant}", *args.overrides])
               for variant in args.variants}  # bad input refused before any run
    shortest = min(cfg.model.context_length for cfg in configs.values())
    if 4 * max(args.pairs) > shortest:
        raise UsageError(f"--pairs {max(args.pairs)}: its sequences of {4 * max(args.pairs)} tokens are longer than "
                         f"a model's context, {shortest}")
    results = []
    for seed in range(args.seeds):
        for variant, cfg in configs.items():
            path = args.out / variant / f"seed{seed}" / "result.json"
            if not path.exists():
                print(f"{variant} seed {seed}: training", flush=True)
                result = train_run(variant, cfg, args, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json(path, result)
            result = json.loads(path.read_text())
            results.append(result)
            print(f"{variant} seed {seed}: {result['steps']} steps in {result['trained_s']:.0f} s, " + ", ".join(
                f"{result['accuracy'][str(p)]:.3f} at {p} pairs" for p in args.pairs), flush=True)
    print(f"\n{args.vocab} tokens: chance is {1 / args.vocab:.4f}\n")
    print(f"| line | lr | steps | {' | '.join(f'{p} pairs' for p in args.pairs)} |")
    print("|---|---:|---|" + "---:|" * len(args.pairs))
    for variant in configs:
        runs = [r for r in results if r["variant"] == variant]
        cells = [fmt_mean_std([r["accuracy"][str(p)] for r in runs]) for p in args.pairs]
        steps = " / ".join(str(r["steps"]) for r in runs)
        print(f"| {variant} | {runs[0]['lr']:g} | {steps} | {' | '.join(cells)} |")
    if args.json:
        write_json(args.json, {"vocab": args.vocab, "pairs": args.pairs, "sequences": args.sequences,
                               "overrides": args.overrides, "runs": results})


def main(argv=None) -> int:
    return run_command(lambda: study(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
