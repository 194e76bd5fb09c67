"""compare.py's plots: val bpb against tokens or seconds, and final val bpb against the learning rate."""
import statistics
from pathlib import Path

from storage.files import atomic_write, writing
from study.lr import LRLine
from study.runs import Variant


def lr_plot(lines: list[LRLine], init: float, unigram: float | None, path: Path) -> None:
    """Final val bpb against peak learning rate (log x), one line per variant: Wortsman et al.'s figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    for line in lines:
        lrs = sorted(line.curve)
        (drawn,) = ax.plot(lrs, [min(line.curve[lr], init) for lr in lrs], marker="o", label=line.name,
                           linestyle="--" if line.name.endswith("nowarmup") else "-")
        gone = [lr for lr in lrs if lr in line.diverged]
        ax.plot(gone, [init] * len(gone), "x", color=drawn.get_color(), markersize=9)
        seeds = line.best.final("val_bpb")
        if len(seeds) > 1:
            ax.errorbar([line.best_lr], [statistics.mean(seeds)], yerr=[statistics.stdev(seeds)],
                        color=drawn.get_color(), capsize=4)
    if unigram is not None:
        ax.axhline(unigram, color="gray", linestyle=":", linewidth=1)
        ax.annotate("unigram level", (ax.get_xlim()[0], unigram), fontsize=8, color="gray",
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final val bits per byte (seed 0; x: diverged, at the loss at init)")
    ax.set_title("final val bpb vs learning rate (bars: ± std over seeds at the best lr)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def save_png(fig, path: Path) -> None:
    """The figure as a PNG in path (its folder made if missing), replacing it whole or not at all."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"))


def bpb_curve(variant: Variant, x: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """x (each eval's "tokens" or "elapsed_s", averaged), and the mean, min and max val bpb over the variant's
    runs: the evals at a step that every run reached are one point, and so are the runs' last evals, which
    budgeted runs reach at different steps (a step only some runs reached would average a subset)."""
    points: dict = {}
    runs = [[m for m in run.evals if x in m] for run in variant.runs]
    runs = [evals for evals in runs if evals]
    for evals in runs:
        for i, m in enumerate(evals):
            points.setdefault("last" if i == len(evals) - 1 else m["step"], []).append(m)
    ordered = sorted((ms for ms in points.values() if len(ms) == len(runs)),
                     key=lambda ms: statistics.mean(m[x] for m in ms))
    bpbs = [[m["val_bpb"] for m in ms] for ms in ordered]
    return ([statistics.mean(m[x] for m in ms) for ms in ordered], [statistics.mean(b) for b in bpbs],
            [min(b) for b in bpbs], [max(b) for b in bpbs])


def plot(variants: list[Variant], path: Path, x: str = "tokens") -> None:
    """val bpb against training tokens, or against training seconds (x="elapsed_s") for an equal-time comparison."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    scale, label = (1e6, "training tokens (M)") if x == "tokens" else (1.0, "training seconds")
    # Left: whole runs. Right: the second half, where the variants separate; the first evals'
    # high bpb would otherwise flatten every difference that matters.
    fig, (whole, tail) = plt.subplots(1, 2, figsize=(13, 5))
    curves = [(variant, bpb_curve(variant, x)) for variant in variants]
    curves = [(variant, curve) for variant, curve in curves if curve[0]]
    last_x = max((curve[0][-1] for _, curve in curves), default=0)
    shown = [(lo, hi) for _, (xs, _, low, high) in curves for v, lo, hi in zip(xs, low, high) if v >= last_x / 2]
    for variant, (xs, mean, low, high) in curves:
        scaled = [v / scale for v in xs]
        name = variant.name if len(variant.name) <= 60 else variant.name[:59] + "…"
        for ax in (whole, tail):  # a run with one eval is one point: drawn large enough to see
            (line,) = ax.plot(scaled, mean, marker="o", markersize=4 if len(xs) > 1 else 7,
                              label=f"{name} (n={len(variant.runs)})")
            ax.fill_between(scaled, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    for ax in (whole, tail):
        ax.set_xlabel(label)
        ax.set_ylabel("val bits per byte")
        ax.grid(alpha=0.3)
    whole.set_title(f"val bpb vs {label.split(' (')[0]} (line: mean over seeds, band: min-max)")
    if shown:  # the points of the second half fill the panel (one point alone: 1% of its value either side)
        tail_lo, tail_hi = min(lo for lo, _ in shown), max(hi for _, hi in shown)
        tail.set_xlim(last_x / 2 / scale, last_x * 1.02 / scale)
        margin = max(0.05 * (tail_hi - tail_lo), 0.01 * abs(tail_hi))
        tail.set_ylim(tail_lo - margin, tail_hi + margin)
    tail.set_title("second half, zoomed")
    for ax in (whole, tail):
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
