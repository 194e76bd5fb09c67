"""compare.py's plots: val bpb (a task's: val acc) against tokens or seconds, and the final loss against the learning
rate."""
import math
import statistics
from pathlib import Path

from storage.files import atomic_write, writing
from study.lr import AXES, LRLine
from study.runs import MEASURES, Variant, measure_of
from study.tables import delta_and_noise


def lr_plot(lines: list[LRLine], init: float, unigram: float | None, path: Path) -> None:
    """Final val bpb (a task's: val loss) against peak learning rate (log x), one line per variant: Wortsman et al.'s
    figure."""
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
        seeds = line.best.final(line.axis)
        if len(seeds) > 1:
            ax.errorbar([line.best_lr], [statistics.mean(seeds)], yerr=[statistics.stdev(seeds)],
                        color=drawn.get_color(), capsize=4)
    if unigram is not None:
        ax.axhline(unigram, color="gray", linestyle=":", linewidth=1)
        ax.annotate("unigram level", (ax.get_xlim()[0], unigram), fontsize=8, color="gray",
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    unit = AXES[lines[0].axis]
    ax.set_ylabel(f"final val {unit} (seed 0; x: diverged, at the loss at init)")
    ax.set_title(f"final val {unit} vs learning rate (bars: ± std over seeds at the best lr)")
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


def measure_curve(variant: Variant, x: str, measure: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """x (each eval's "tokens" or "elapsed_s", averaged), and the mean, min and max measure (val bpb, or a task's
    val acc) over the variant's
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
    bpbs = [[m[measure] for m in ms] for ms in ordered]
    return ([statistics.mean(m[x] for m in ms) for ms in ordered], [statistics.mean(b) for b in bpbs],
            [min(b) for b in bpbs], [max(b) for b in bpbs])


def plot(variants: list[Variant], path: Path, x: str = "tokens", baseline: Variant | None = None) -> None:
    """val bpb (a task's runs: val acc) against training tokens, or against training seconds (x="elapsed_s") for an
    equal-time comparison; with a baseline, a panel below of each variant's final Δ against it (delta_panel)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    scale, label = (1e6, "training tokens (M)") if x == "tokens" else (1.0, "training seconds")
    measure = measure_of(variants)
    name = MEASURES[measure]
    deltas = [(v, measured) for v in variants if baseline is not None and v is not baseline
              and (measured := delta_and_noise(v, baseline, measure)) is not None]
    # Top left: whole runs. Top right: the second half, where the variants separate; the first evals'
    # high bpb would otherwise flatten every difference that matters.
    fig = plt.figure(figsize=(13, 5 + (1.5 + 0.35 * len(deltas) if deltas else 0)))
    grid = fig.add_gridspec(2 if deltas else 1, 2, height_ratios=[5, 1.5 + 0.35 * len(deltas)] if deltas else None)
    whole, tail = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    curves = [(variant, measure_curve(variant, x, measure)) for variant in variants]
    curves = [(variant, curve) for variant, curve in curves if curve[0]]
    last_x = max((curve[0][-1] for _, curve in curves), default=0)
    shown = [(lo, hi) for _, (xs, _, low, high) in curves for v, lo, hi in zip(xs, low, high) if v >= last_x / 2]
    colors = {}
    for variant, (xs, mean, low, high) in curves:
        scaled = [v / scale for v in xs]
        for ax in (whole, tail):  # a run with one eval is one point: drawn large enough to see
            (line,) = ax.plot(scaled, mean, marker="o", markersize=4 if len(xs) > 1 else 7,
                              label=f"{short(variant.name)} (n={len(variant.runs)})")
            ax.fill_between(scaled, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        colors[variant.name] = line.get_color()
    for ax in (whole, tail):
        ax.set_xlabel(label)
        ax.set_ylabel("val bits per byte" if name == "bpb" else "val accuracy at the answers")
        ax.grid(alpha=0.3)
    whole.set_title(f"val {name} vs {label.split(' (')[0]} (line: mean over seeds, band: min-max)")
    if shown:  # the points of the second half fill the panel (one point alone: 1% of its value either side)
        tail_lo, tail_hi = min(lo for lo, _ in shown), max(hi for _, hi in shown)
        tail.set_xlim(last_x / 2 / scale, last_x * 1.02 / scale)
        margin = max(0.05 * (tail_hi - tail_lo), 0.01 * abs(tail_hi))
        tail.set_ylim(tail_lo - margin, tail_hi + margin)
    tail.set_title("second half, zoomed")
    for ax in (whole, tail):
        ax.legend(fontsize=8)
    if deltas:
        delta_panel(fig.add_subplot(grid[1, :]), deltas, baseline.name, colors, name)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def short(name: str) -> str:
    return name if len(name) <= 60 else name[:59] + "…"


def delta_panel(ax, deltas: list[tuple[Variant, tuple[float, float | None]]], baseline: str, colors: dict,
                name: str) -> None:
    """Each variant's final Δ bpb (or acc: name) against the baseline as a bar, its error bar the table's seed noise:
    two standard errors of the difference (none where a side has one run), so a bar whose error bar crosses 0 is
    within it."""
    rows = range(len(deltas))[::-1]  # the table's order, top down
    for row, (variant, (delta, noise)) in zip(rows, deltas):
        ax.barh(row, delta, height=0.6, color=colors.get(variant.name, "gray"), alpha=0.7,
                xerr=noise, capsize=4, error_kw={"elinewidth": 1})
        end = delta + math.copysign(noise or 0, delta)  # the number goes past the error bar, on the bar's side
        ax.annotate(f"{delta:+.4f}" + (f" ± {noise:.4f}" if noise is not None else " (one run: no noise)"),
                    (end, row), xytext=(4 if delta >= 0 else -4, 0), textcoords="offset points",
                    ha="left" if delta >= 0 else "right", va="center", fontsize=8)
    ax.set_yticks(list(rows), [short(variant.name) for variant, _ in deltas], fontsize=8)
    ax.axvline(0, color="gray", linewidth=1)
    ax.use_sticky_edges = False  # room either side of 0 (bars would pin the axis there) and for the numbers
    ax.margins(x=0.3, y=0.5 / len(deltas))
    ax.set_xlabel(f"final val {name} minus {short(baseline)}'s ({'lower' if name == 'bpb' else 'higher'} is better)")
    ax.set_title(f"Δ {name} vs {short(baseline)} (bar: mean over seeds; error bar: ± 2σ, the table's seed noise)")
    ax.grid(alpha=0.3, axis="x")
