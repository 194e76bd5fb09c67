"""A variant on the learning-rate axis (Wortsman et al. 2023): its final loss at each peak learning rate, its best,
its LR sensitivity, and the learning rates at which it trains. The loss is a text run's val bpb, or a synthetic
task's val loss at its answers (nats; its accuracy compares the lines at their best rates: study/runs.py)."""
import math
import statistics
from dataclasses import dataclass

from study.runs import Run, Variant


def by_lr(variant: Variant) -> dict[float, Variant]:
    """The variant's runs split by train.lr, in increasing order: one Variant (of seeds) per lr."""
    groups: dict[float, Variant] = {}
    for run in variant.runs:
        groups.setdefault(run.config["train"]["lr"], Variant(variant.name)).runs.append(run)
    return dict(sorted(groups.items()))


AXES = {"val_bpb": "bpb", "val_loss": "loss"}  # the axis's key, and its unit as tables name it


def axis_of(runs: list[Run]) -> str:
    """The loss the learning-rate axis reads: val_bpb where every evaluated run has it, else (a task's runs)
    val_loss."""
    evaluated = [run for run in runs if run.evals]
    return "val_bpb" if all("val_bpb" in run.evals[-1] for run in evaluated) else "val_loss"


def init_loss(runs: list[Run]) -> float | None:
    """The loss at initialisation on the axis: ln(vocab_size) nats, a uniform prediction (the initialised
    model's logits are near 0: 8.27 nats at step 0 against ln 4096 = 8.32), in bpb converted with the val
    split's bytes per token, which any eval gives as val_loss / val_bpb / ln 2."""
    axis = axis_of(runs)
    for run in runs:
        if run.evals and "vocab_size" in run.summary:
            last = run.evals[-1]
            return math.log(run.summary["vocab_size"]) * last[axis] / last["val_loss"]
    return None


def final_loss(run: Run, init: float, axis: str) -> float | None:
    """A run's result on the learning-rate axis: its final val bpb (or val loss), the loss at initialisation for a
    run that diverged (Wortsman et al.: a diverged run scores no better than an untrained one), None for a run that
    is missing or was stopped (no result, not a bad one)."""
    if run.problem is None:
        return run.evals[-1][axis]
    return init if run.problem.startswith("stopped: diverged") else None


@dataclass
class LRLine:
    """One variant on the learning-rate axis."""
    name: str
    curve: dict[float, float]  # lr -> final val bpb (axis) of its lowest-seed run (seed 0), diverged at init
    diverged: set[float]
    best_lr: float | None
    best: Variant  # the runs (seeds) at best_lr
    sensitivity: float | None  # over the grid every line shares
    axis: str = "val_bpb"  # what the curve is: axis_of


def lr_line(variant: Variant, init: float, grid: list[float]) -> LRLine:
    at, axis = by_lr(variant), axis_of(variant.runs)
    curve, diverged = {}, set()
    for lr, at_lr in at.items():
        first = min(at_lr.runs, key=lambda r: r.config["train"].get("seed", 0))
        value = final_loss(first, init, axis)
        if value is not None:
            curve[lr] = value
            if first.problem is not None:
                diverged.add(lr)
    trained = {lr: v for lr, v in curve.items() if lr not in diverged}
    best_lr = min(trained, key=trained.get) if trained else None
    best = at[best_lr] if best_lr is not None else Variant(variant.name)
    shared = grid and all(lr in curve for lr in grid)  # no grid shared by every line: no sensitivity
    sensitivity = lr_sensitivity([curve[lr] for lr in grid], init) if shared else None
    return LRLine(variant.name, curve, diverged, best_lr, best, sensitivity, axis)


def lr_sensitivity(finals: list[float], init: float) -> float:
    """Wortsman et al. 2023: E over the grid of min(final loss, loss at initialisation) minus the best
    final loss on it. 0 when every learning rate of the grid does as well as the best one."""
    return statistics.mean(min(f, init) for f in finals) - min(finals)


def learning_rates_that_train(line: LRLine, threshold: float) -> list[float]:
    """The learning rates whose seed-0 run ended below `threshold` (the unigram level minus a margin) by itself."""
    return sorted(lr for lr, bpb in line.curve.items() if lr not in line.diverged and bpb < threshold)


def largest_lr_that_trains(line: LRLine, threshold: float) -> float | None:
    trained = learning_rates_that_train(line, threshold)
    return trained[-1] if trained else None


def grid_that_trains(line: LRLine, grid: list[float], threshold: float) -> str:
    """LR sensitivity's companion: how many of the shared grid's learning rates train, e.g. "2/7". It sees what
    the sensitivity cannot: a run stuck at the unigram level is far below the loss at initialisation, so it
    barely moves the sensitivity, but it does not train."""
    return f"{len(set(learning_rates_that_train(line, threshold)) & set(grid))}/{len(grid)}"


def lr_sweep_lines(variants: list[Variant]) -> tuple[list[LRLine], list[float], float] | None:
    """The lines of a learning-rate sweep and the grid they share, or None when no variant has runs at
    more than one learning rate (a plain comparison)."""
    if not any(len(by_lr(v)) > 1 for v in variants if all("train" in r.config for r in v.runs)):
        return None
    init = init_loss([r for v in variants for r in v.runs])
    grid = sorted(set.intersection(*(set(by_lr(v)) for v in variants)))
    return [lr_line(v, init, grid) for v in variants], grid, init
