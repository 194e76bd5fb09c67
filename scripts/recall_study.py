"""The recall study: the Gated DeltaNet study's lines trained on multi-query associative recall itself (MQAR,
data/recall.py; Zoology's protocol, Arora et al. 2023), each for the same seconds, then their accuracy at 4 to 32
pairs: where a fixed-size state and a cache that keeps every position part ways (Jelassi et al. 2024).

    python scripts/recall_study.py --out multirun/recall_mqar --variants baseline gdn_hybrid gdn_all \
        --seconds 180 --lrs 0.001 0.003 0.01 --seeds 3 -- model.d_model=64 model.n_heads=4 train.batch_size=64
    python scripts/recall_study.py --out multirun/recall_mqar_steps --variants baseline gdn_hybrid gdn_all \
        --steps 1000 --lrs-of multirun/recall_mqar --seeds 3 -- model.d_model=64 model.n_heads=4 train.batch_size=64

Each run is a line's model and optimizer as the ablation has them (`+experiment=ablation ablation=<variant>` and the
overrides after --) with a vocabulary of --vocab tokens, trained on batches of MQAR sequences with a number of pairs
drawn uniformly from the smallest --pairs to the largest per batch (as Zoology trains at the numbers it scores: from
1 pair, attention was still at 0.05 after 800 steps, where from 4 it was at 0.5 after 600), the loss at the answers
only and the gradient clipped as train.py clips it, for --seconds of training (or --steps: the budget, which the
schedule spans), one run at a time. Then its accuracy, the share of queries whose most likely next token is their
answer, on the same held-out sequences for every run at each --pairs.

The learning rate: the line's own train.lr (its best for bits per byte); or a grid, --lrs, whose every rate trains
the first seed (min_lr in the line's ratio to lr) and the other seeds at the line's best rate there, by its accuracy
over every number of pairs; or --lrs-of another study's grid, each line at its best rate there (the same lines at
another budget). A run's result is OUT/<variant>/lr<lr>/seed<seed>/result.json, written when it ends; a rerun trains
only the runs without one.
"""
import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli import ascii_numbers  # noqa: E402  (after the path: run as a script from anywhere)
from data.recall import IGNORE, recall_batch  # noqa: E402
from errors import UsageError  # noqa: E402
from model import Transformer  # noqa: E402
from scripts.recall_probe import recall_accuracy  # noqa: E402
from settings import compose_config  # noqa: E402
from storage.files import write_json  # noqa: E402
from study.launch import run_main  # noqa: E402
from study.tables import fmt_mean_std  # noqa: E402
from training.config import model_config  # noqa: E402
from training.optim import lr_at, make_optimizer, set_lr  # noqa: E402

VARIANTS = ["baseline", "gdn_hybrid", "gdn_all"]
PAIRS = [4, 8, 16, 32]
# what a stop keeps: each run trains in this process and writes its result.json at its end, and has no checkpoint
RESUMES = ("a run in progress is dropped; the same command resumes the study (runs with a result.json are kept, the "
           "others train from the start)")


def parse_args(argv):
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--out", type=Path, required=True, help="the study's dir: a dir per run")
    parser.add_argument("--variants", nargs="+", default=VARIANTS, help="configs/ablation/ lines")
    parser.add_argument("--seeds", type=int, default=3)
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--seconds", type=float, help="training time per run")
    budget.add_argument("--steps", type=int, help="training steps per run")
    rates = parser.add_mutually_exclusive_group()
    rates.add_argument("--lrs", type=float, nargs="+", help="the peak learning rates of the grid, at the first seed; "
                       "the other seeds at each line's best (default: the line's own train.lr)")
    rates.add_argument("--lrs-of", type=Path, help="each line at its best learning rate in this finished study")
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
    if args.lrs and min(args.lrs) <= 0:
        raise UsageError(f"--lrs {' '.join(map(str, args.lrs))}: each must be > 0")
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
        pairs = int(torch.randint(min(args.pairs), max(args.pairs) + 1, (1,), generator=generator))
        inputs, targets = recall_batch(cfg.train.batch_size, pairs, tokens, generator)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip or math.inf)  # as train.py does
        optimizer.step()
        losses.append(loss.item())
        step_s = time.perf_counter() - clock
        step, trained_s = step + 1, trained_s + step_s
    model.eval()
    accuracy = {p: recall_accuracy(model, p, tokens, args.sequences) for p in args.pairs}
    return {"variant": variant, "seed": seed, "lr": cfg.train.lr, "steps": step, "trained_s": trained_s,
            "num_params": model.num_params(), "last_loss": statistics.fmean(losses[-20:]), "accuracy": accuracy}


def at_lr(cfg, lr: float):
    """The line's config at peak learning rate lr, its floor min_lr in the line's own ratio to it."""
    cfg = copy.deepcopy(cfg)
    cfg.train.min_lr, cfg.train.lr = cfg.train.min_lr * lr / cfg.train.lr, lr
    return cfg


def score(result: dict) -> float:
    """A run's accuracy over every scored number of pairs: what the grid picks a line's learning rate by."""
    return statistics.fmean(result["accuracy"].values())


def finished(out: Path, variant: str) -> dict[float, dict]:
    """The first seed's result at each learning rate a study in `out` ran the line at, the lowest rate first."""
    results = (json.loads(path.read_text()) for path in (out / variant).glob("lr*/seed0/result.json"))
    return dict(sorted((result["lr"], result) for result in results))


def best_lr(runs: dict[float, dict]) -> float:
    return max(runs, key=lambda lr: score(runs[lr]))


def result_of(variant: str, cfg, args, seed: int) -> dict:
    """The run of the line at cfg's learning rate and this seed: trained unless a result of it is on disk."""
    path = args.out / variant / f"lr{cfg.train.lr:g}" / f"seed{seed}" / "result.json"
    if not path.exists():
        print(f"{variant} lr {cfg.train.lr:g} seed {seed}: training", flush=True)
        result = train_run(variant, cfg, args, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, result)
    result = json.loads(path.read_text())
    print(f"{variant} lr {cfg.train.lr:g} seed {seed}: {result['steps']} steps in {result['trained_s']:.0f} s, "
          + ", ".join(f"{result['accuracy'][str(p)]:.3f} at {p} pairs" for p in args.pairs), flush=True)
    return result


def study(args) -> None:
    torch.set_num_threads(args.threads)
    configs = {variant: compose_config(["+experiment=ablation", f"ablation={variant}", *args.overrides])
               for variant in args.variants}  # bad input refused before any run
    shortest = min(cfg.model.context_length for cfg in configs.values())
    if 4 * max(args.pairs) > shortest:
        raise UsageError(f"--pairs {max(args.pairs)}: its sequences of {4 * max(args.pairs)} tokens are longer than "
                         f"a model's context, {shortest}")
    grids = {variant: args.lrs or [cfg.train.lr] for variant, cfg in configs.items()}
    if args.lrs_of:
        done = {variant: finished(args.lrs_of, variant) for variant in configs}
        if missing := [variant for variant, runs in done.items() if not runs]:
            raise UsageError(f"--lrs-of={args.lrs_of}: no finished run of {', '.join(missing)} there")
        grids = {variant: [best_lr(runs)] for variant, runs in done.items()}
    grid = {variant: {lr: result_of(variant, at_lr(cfg, lr), args, 0) for lr in grids[variant]}
            for variant, cfg in configs.items()}
    best = {variant: best_lr(runs) for variant, runs in grid.items()}
    seeds = {variant: [grid[variant][best[variant]]] + [result_of(variant, at_lr(cfg, best[variant]), args, seed)
                                                         for seed in range(1, args.seeds)]
             for variant, cfg in configs.items()}
    print(f"\n{args.vocab} tokens: chance is {1 / args.vocab:.4f}\n")
    if any(len(lrs) > 1 for lrs in grids.values()):
        lrs = sorted({lr for lrs in grids.values() for lr in lrs})
        print("The first seed's accuracy over every number of pairs, at each peak learning rate:\n")
        print(f"| line | {' | '.join(f'{lr:g}' for lr in lrs)} |")
        print("|---|" + "---:|" * len(lrs))
        for variant, runs in grid.items():
            print(f"| {variant} | " + " | ".join(f"{score(runs[lr]):.4f}" if lr in runs else "" for lr in lrs) + " |")
        print()
    print(f"| line | lr | steps | {' | '.join(f'{p} pairs' for p in args.pairs)} |")
    print("|---|---:|---|" + "---:|" * len(args.pairs))
    for variant, runs in seeds.items():
        cells = [fmt_mean_std([r["accuracy"][str(p)] for r in runs]) for p in args.pairs]
        steps = " / ".join(str(r["steps"]) for r in runs)
        print(f"| {variant} | {best[variant]:g} | {steps} | {' | '.join(cells)} |")
    if args.json:
        write_json(args.json, {"vocab": args.vocab, "pairs": args.pairs, "sequences": args.sequences,
                               "overrides": args.overrides, "best_lr": best,
                               "grid": [run for runs in grid.values() for run in runs.values()],
                               "runs": [run for runs in seeds.values() for run in runs]})


def main(argv=None) -> None:
    run_main(lambda: study(parse_args(argv)), RESUMES)


if __name__ == "__main__":
    main()
