"""compare.py's markdown tables: each variant's final loss and bpb against the baseline's, beyond seed noise or not,
what its runs trained, its routing, and a learning-rate sweep's lines."""
import math
import statistics

from study.lr import LRLine
from study.runs import MEASURES, Run, Variant, measure_of


def mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def fmt_mean_std(values: list[float]) -> str:
    if not values:
        return "incomplete"
    mean, std = mean_std(values)
    return f"{mean:.4f} ± {std:.4f}" if std is not None else f"{mean:.4f}"


def delta_and_noise(variant: Variant, baseline: Variant, measure: str) -> tuple[float, float | None] | None:
    """The variant's mean final val bpb (or another measure) less the baseline's, and two standard errors of that
    difference (None where either side has one run); None where either has no complete run."""
    ours, theirs = variant.final(measure), baseline.final(measure)
    if not ours or not theirs:
        return None
    (mean_v, std_v), (mean_b, std_b) = mean_std(ours), mean_std(theirs)
    if std_v is None or std_b is None:
        return mean_v - mean_b, None
    return mean_v - mean_b, 2 * math.sqrt(std_v ** 2 / len(ours) + std_b ** 2 / len(theirs))


def difference(variant: Variant, baseline: Variant | None, measure: str) -> tuple[str, str]:
    """(Δ of the measure from the baseline, whether it is beyond seed noise)"""
    if baseline is None:
        return "", ""
    if variant is baseline:
        return "(baseline)", ""
    if (measured := delta_and_noise(variant, baseline, measure)) is None:
        return "n/a", "n/a"
    delta, noise = measured
    if noise is None:
        return f"{delta:+.4f}", "n/a"
    return f"{delta:+.4f}", f"{'yes' if abs(delta) > noise else 'no'} (2σ {noise:.4f})"


def summary_value(variant: Variant, key: str) -> str:
    values = {r.summary[key] for r in variant.runs if key in r.summary}
    return ", ".join(f"{v:,}" for v in sorted(values)) or "?"


def span(values: list[float], fmt: str) -> str:
    """The one value, or the range lowest-highest, or ? for none."""
    values = sorted(set(values))
    if not values:
        return "?"
    return fmt.format(values[0]) if len(values) == 1 else f"{fmt.format(values[0])}-{fmt.format(values[-1])}"


def extent(run: Run) -> tuple[int, int, float] | None:
    """(steps, tokens, elapsed seconds) a complete run trained: the last metrics line, the summary's time."""
    if run.problem is not None or not run.metrics or "step" not in run.metrics[-1]:
        return None  # a recorded run (--recorded) keeps its final bpb only
    last = run.metrics[-1]
    return last["step"], last["tokens"], run.summary.get("elapsed_s", last.get("elapsed_s", math.nan))


def extent_cells(variant: Variant) -> str:
    """Steps, tokens and elapsed seconds of the variant's complete runs: what makes two rows comparable."""
    steps, tokens, seconds = zip(*extents) if (extents := [e for e in map(extent, variant.runs) if e]) else ([], [], [])
    return f"{span(steps, '{:,}')} | {span([t / 1e6 for t in tokens], '{:.2f}')} | {span(seconds, '{:.0f}')}"


def equal_time_budget(runs: list[Run]) -> float | None:
    """The one train.time_budget (s) that ended every complete run, or None: not an equal-wall-clock comparison."""
    complete = [r for r in runs if r.problem is None]
    budgets = {str(r.config.get("train", {}).get("time_budget")) for r in complete}
    if not complete or len(budgets) != 1 or any(r.summary.get("ended_by") != "time_budget" for r in complete):
        return None
    return complete[0].summary.get("time_budget_s")


def markdown_table(variants: list[Variant], baseline: Variant | None) -> str:
    """A row per variant, compared by its measure (runs/MEASURES: val bpb, or a task's val acc)."""
    measure = measure_of(variants)
    name = MEASURES[measure]
    lines = [f"| variant | runs (n) | params | steps | tokens (M) | elapsed s | val loss | val {name} | Δ {name} vs "
             f"baseline | beyond seed noise? | tokens/s | KV cache bytes/token |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for variant in variants:
        n_incomplete = len(variant.runs) - len(variant.complete)
        runs = f"{len(variant.complete)}" + (f" + {n_incomplete} incomplete" if n_incomplete else "")
        # each run's own rate, the one its last line prints: summary.json's training tokens over its steps' time
        rates = [r.summary["tokens_per_s"] for r in variant.complete if r.summary.get("tokens_per_s")]
        speed = f"{statistics.mean(rates):,.0f}" if rates else "?"
        delta, beyond = difference(variant, baseline, measure)
        lines.append(f"| {variant.name} | {runs} | {summary_value(variant, 'num_params')} | {extent_cells(variant)} "
                     f"| {fmt_mean_std(variant.final('val_loss'))} | {fmt_mean_std(variant.final(measure))} "
                     f"| {delta} | {beyond} | {speed} | {summary_value(variant, 'kv_cache_bytes_per_token')} |")
    return "\n".join(lines)


def routes(variant: Variant) -> bool:
    """Whether the variant's complete runs have experts: their evals log MaxVio (training/evaluate.py)."""
    return bool(variant.complete) and all("moe/max_vio" in r.evals[-1] for r in variant.complete)


def routing_table(variants: list[Variant]) -> str | None:
    """Each mixture-of-experts variant's balance at its runs' last eval (model/moe.py, training/evaluate.py):
    MaxVio (max load / mean load - 1, the mean over its MoE blocks) and its routers' entropy over ln E (the mean
    over the blocks), each mean ± std over the runs; None when no run has experts."""
    routed = [v for v in variants if routes(v)]
    if not routed:
        return None
    lines = ["| variant | MaxVio | router entropy / ln E |", "|---|---:|---:|"]
    for variant in routed:
        entropy = [statistics.mean(value for key, value in r.evals[-1].items() if key.startswith("moe/entropy/"))
                   for r in variant.complete]
        lines.append(f"| {variant.name} | {fmt_mean_std(variant.final('moe/max_vio'))} | {fmt_mean_std(entropy)} |")
    return "\n".join(lines)


def lr_table(lines: list[LRLine], baseline: LRLine | None, trains: dict[str, float | None],
             grid_trains: dict[str, str]) -> str:
    """Each line at its best lr, compared by its measure (val bpb, or a task's val acc: study/runs.py)."""
    measure = measure_of([line.best for line in lines])
    name = MEASURES[measure]
    rows = [f"| variant | best lr | LR sensitivity | runs at best lr (n) | steps | tokens (M) | elapsed s "
            f"| val {name} at best lr | Δ {name} vs baseline | beyond seed noise? | largest lr that trains "
            f"| grid that trains | params | KV cache bytes/token |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for line in lines:
        delta, beyond = difference(line.best, baseline.best if baseline else None, measure)
        if line is baseline:
            delta, beyond = "(baseline)", ""
        n_incomplete = len(line.best.runs) - len(line.best.complete)
        runs = f"{len(line.best.complete)}" + (f" + {n_incomplete} incomplete" if n_incomplete else "")
        rows.append(f"| {line.name} | {'none' if line.best_lr is None else f'{line.best_lr:g}'} | "
                    f"{'n/a' if line.sensitivity is None else f'{line.sensitivity:.4f}'} | {runs} "
                    f"| {extent_cells(line.best)} | {fmt_mean_std(line.best.final(measure))} | {delta} | {beyond} "
                    f"| {'none' if trains[line.name] is None else f'{trains[line.name]:g}'} | {grid_trains[line.name]} "
                    f"| {summary_value(line.best, 'num_params')} "
                    f"| {summary_value(line.best, 'kv_cache_bytes_per_token')} |")
    return "\n".join(rows)


def lr_curve_table(lines: list[LRLine]) -> str:
    """Every line's final val bpb (or a task's val loss: its axis, seed 0) at every learning rate tried: the numbers
    behind the LR plot."""
    lrs = sorted({lr for line in lines for lr in line.curve})
    rows = ["| variant | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---|" + "---:|" * len(lrs)]
    for line in lines:
        cells = ["diverged" if lr in line.diverged else f"{line.curve[lr]:.4f}" if lr in line.curve else ""
                 for lr in lrs]
        rows.append(f"| {line.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
