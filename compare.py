"""Compare training runs without W&B: a markdown table and a plot of val bpb against tokens.

    python compare.py multirun/ablation/2025-01-01_12-00-00 [more dirs...] --plot docs/ablation.png

Each DIR is a run dir or any folder above run dirs (a multirun dir); a run dir is a folder
holding the metrics.jsonl or config.yaml that train.py writes. Runs are grouped into variants:
runs of one sweep (a multirun's dir: train.py -m, a sweep.py study; or runs of their own) whose resolved
configs are equal apart from train.seed and what only changes how a run is logged or run (NOT_COMPARED:
wandb.*, train.threads, train.resume, latest_link) are seeds of one variant; two sweeps of one config stay two variants.
A variant is named by its config's `variant` key (the ablation sets it), else by the settings in which it
differs from what most variants have (`model.norm=layernorm`, `train.lr=0.003`; a setting the variants split
on evenly names each of them), else by where its runs are (its sweep dir or run dir, relative to the others'),
which is also added to a name that several variants share.

Per variant: final val loss and val bpb as mean ± sample std over its complete runs (n), and
the difference in bpb from the baseline variant (--baseline), which counts as beyond seed noise when

    |Δ| > 2 · sqrt(s_v² / n_v + s_b² / n_b)

(two standard errors of the difference of two means; "n/a" when either side has one run).
bpb alone is compared: every run reads the same tokenizer, so loss and bpb differ by a constant.
Each row also shows the steps, tokens and seconds its runs trained (a range where they differ), their tokens/s
(the mean of each run's own rate, summary.json's tokens_per_s, the one its last line prints), and a note
follows the table when runs trained unequal numbers of tokens, as budgeted runs on a busy machine do.
Runs trained for one train.time_budget each (an equal-wall-clock comparison) are expected to differ in
tokens: the table says so instead, and the plot's x axis is training seconds.

A learning-rate sweep whose run dirs are gone can be shown beside new runs from the JSON that --json wrote
(--recorded): each recorded line comes back as its final val bpb per learning rate (seed 0) and per seed at its
best learning rate, in the LR tables and the LR plot; a line in DIR replaces a recorded line of the same name.

A run whose metrics.jsonl is missing, has a line that is not JSON (killed mid-write), has no
val_bpb, or stops before train.max_steps (or whose summary.json gives a stop_reason other than
completed: a NaN loss, a signal) is reported as incomplete and left out of the means.
"""
import argparse
import json
import math
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from errors import UsageError
from model.config import ModelConfig
from settings import flatten
from storage.files import atomic_write, write_json, writing
from training.multirun import RECORDS

# settings that change how a run is logged, how many cores it used, where its link is: not what it trains
NOT_COMPARED = ("wandb.", "train.threads", "train.resume", "latest_link")
SEED = ("train.seed",)
LEARNING_RATE = ("train.lr", "train.min_lr")  # what a learning-rate sweep varies within one variant


@dataclass
class Run:
    path: Path
    config: dict
    metrics: list[dict]
    summary: dict
    problem: str | None  # why the run is incomplete, or None

    @property
    def evals(self) -> list[dict]:
        return [m for m in self.metrics if "val_bpb" in m]


@dataclass
class Variant:
    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def complete(self) -> list[Run]:
        return [r for r in self.runs if r.problem is None]

    def final(self, key: str) -> list[float]:
        return [r.evals[-1][key] for r in self.complete]


def find_run_dirs(root: Path) -> list[Path]:
    markers = [*root.rglob("metrics.jsonl"), *root.rglob("config.yaml")]
    # Hydra keeps its own copy of the unresolved config in .hydra/config.yaml: not a run dir.
    return sorted({m.parent for m in markers if m.parent.name != ".hydra"})


def read_metrics(path: Path) -> tuple[list[dict], str | None]:
    if not path.exists():
        return [], "no metrics.jsonl"
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            return records, f"metrics.jsonl line {number} is not JSON (truncated?)"
    return records, None


def load_run(run_dir: Path) -> Run:
    metrics, problem = read_metrics(run_dir / "metrics.jsonl")
    config_file, summary_file = run_dir / "config.yaml", run_dir / "summary.json"
    try:
        config = OmegaConf.to_container(OmegaConf.load(config_file)) if config_file.exists() else {}
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        config, summary = {}, {}
        problem = problem or f"unreadable config.yaml or summary.json ({type(err).__name__})"
    max_steps = config.get("train", {}).get("max_steps")
    if problem is None:
        if not config:
            problem = "no config.yaml"
        elif summary.get("stop_reason", "completed") != "completed":  # e.g. a NaN loss, a SIGTERM
            problem = f"stopped: {summary['stop_reason']}"
        elif not any("val_bpb" in m for m in metrics):
            problem = "no val_bpb in metrics.jsonl"
        elif (max_steps is not None and metrics[-1].get("step", 0) < max_steps
              and summary.get("ended_by") != "time_budget"):
            problem = f"stopped at step {metrics[-1].get('step')} of train.max_steps={max_steps}"
    return Run(run_dir, with_model_defaults(config), metrics, summary, problem)


def with_model_defaults(config: dict) -> dict:
    """The config with every model setting it lacks at ModelConfig's default: a setting added after the run (MoE's,
    say) builds from its default the model the run trained, so the run groups with newer runs of that model."""
    if isinstance(config.get("model"), dict):
        config["model"] = {f.name: f.default for f in fields(ModelConfig)} | config["model"]
    return config


def variant_key(run: Run, ignored: tuple[str, ...]) -> str:
    """What makes a variant: the run's sweep and its settings, less NOT_COMPARED and the `ignored` keys."""
    flat = {k: v for k, v in flatten(run.config).items() if not k.startswith(NOT_COMPARED)}
    if "train.lr" in ignored and flat.get("train.muon_lr") is not None:
        # a sweep's Muon lr moves with train.lr (optim=muon's default): the variant is their ratio, not the value
        flat["train.muon_lr"] = flat["train.muon_lr"] / flat["train.lr"]
    for key in ignored:
        flat.pop(key, None)
    return json.dumps([str(sweep_of(run.path)), flat], sort_keys=True, default=str) if run.config else str(run.path)


def sweep_of(run_dir: Path) -> Path | None:
    """The multirun a run is a job of (train.py -m, a sweep.py study): the nearest dir above it that holds a
    multirun's records (training/multirun.py), else None for a run of its own. Two sweeps of one config are two
    sets of runs, not seeds of one: each may hold a seed 0."""
    return next((folder for folder in run_dir.resolve().parents if (folder / RECORDS).is_dir()), None)


def group_runs(runs: list[Run], ignored: tuple[str, ...] = SEED) -> list[Variant]:
    """Runs of one sweep (or runs of their own) whose configs are equal apart from the `ignored` keys (and
    NOT_COMPARED) form one variant."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(variant_key(run, ignored), []).append(run)
    return [Variant(name, group) for name, group in zip(variant_names(list(groups.values()), ignored), groups.values())]


def variant_names(groups: list[list[Run]], ignored: tuple[str, ...]) -> list[str]:
    """Each variant's name: its config's `variant` key, else the settings in which it differs from what most
    variants have (a setting they split on evenly names every variant), else where its runs are (its sweep dir,
    or its run dir). A name that several variants share (two sweeps of one config) gets where each is added."""
    flats = [{k: v for k, v in flatten(group[0].config).items()
              if k not in ("variant", *ignored) and not k.startswith(NOT_COMPARED)} for group in groups]
    named = [flat for flat in flats if flat]
    differing, usual = [], {}  # usual: a setting's value when more than half of the variants have it
    for key in sorted({k for flat in named for k in flat}):
        counts = Counter(json.dumps(flat.get(key), default=str) for flat in named).most_common()
        if len(counts) > 1:
            differing.append(key)
            if counts[0][1] > len(named) / 2:
                usual[key] = counts[0][0]
    names = [group[0].config.get("variant") or ", ".join(
        f"{key}={flat.get(key)}" for key in differing if json.dumps(flat.get(key), default=str) != usual.get(key))
        for group, flat in zip(groups, flats)]
    places = [sweep_of(group[0].path) or group[0].path.resolve() for group in groups]
    common = Path(os.path.commonpath(places)) if places else None
    labels = []
    for group, name, place in zip(groups, names, places):
        where = str(place.relative_to(common)) if place != common else place.name
        if not group[0].config:  # nothing to name it by but its path
            labels.append(str(group[0].path))
        elif not name:  # no setting of its own: the runs that hold what the others share, or a sweep like another
            labels.append(where)
        else:
            labels.append(name if names.count(name) == 1 else f"{name} ({where})")
    return labels


def mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def fmt_mean_std(values: list[float]) -> str:
    if not values:
        return "incomplete"
    mean, std = mean_std(values)
    return f"{mean:.4f} ± {std:.4f}" if std is not None else f"{mean:.4f}"


def difference(variant: Variant, baseline: Variant | None) -> tuple[str, str]:
    """(Δ bpb from the baseline, whether it is beyond seed noise)"""
    if baseline is None:
        return "", ""
    if variant is baseline:
        return "(baseline)", ""
    ours, theirs = variant.final("val_bpb"), baseline.final("val_bpb")
    if not ours or not theirs:
        return "n/a", "n/a"
    (mean_v, std_v), (mean_b, std_b) = mean_std(ours), mean_std(theirs)
    delta = mean_v - mean_b
    if std_v is None or std_b is None:
        return f"{delta:+.4f}", "n/a"
    noise = 2 * math.sqrt(std_v ** 2 / len(ours) + std_b ** 2 / len(theirs))
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


def unequal_training_note(runs: list[Run]) -> str | None:
    """A line when the complete runs trained different numbers of tokens, e.g. budgeted runs on a busy machine."""
    tokens = {e[1] for e in map(extent, runs) if e}
    if len(tokens) < 2:
        return None
    if (budget := equal_time_budget(runs)) is not None:
        return (f"equal wall-clock: every run trained for train.time_budget={budget:g} s, so the tokens differ "
                f"({min(tokens) / 1e6:.2f}-{max(tokens) / 1e6:.2f} M) by each variant's speed; the runs must have "
                f"shared the machine alike (one at a time) for the comparison to hold")
    return (f"note: the runs trained unequal numbers of tokens ({min(tokens) / 1e6:.2f}-{max(tokens) / 1e6:.2f} M): "
            f"runs of other lengths, or budgeted runs on a slower or busier machine (a budget is wall-clock); "
            f"compare like with like")


def markdown_table(variants: list[Variant], baseline: Variant | None) -> str:
    lines = ["| variant | runs (n) | params | steps | tokens (M) | elapsed s | val loss | val bpb | Δ bpb vs baseline "
             "| beyond seed noise? | tokens/s | KV cache bytes/token |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for variant in variants:
        n_incomplete = len(variant.runs) - len(variant.complete)
        runs = f"{len(variant.complete)}" + (f" + {n_incomplete} incomplete" if n_incomplete else "")
        # each run's own rate, the one its last line prints: summary.json's training tokens over its steps' time
        rates = [r.summary["tokens_per_s"] for r in variant.complete if r.summary.get("tokens_per_s")]
        speed = f"{statistics.mean(rates):,.0f}" if rates else "?"
        delta, beyond = difference(variant, baseline)
        lines.append(f"| {variant.name} | {runs} | {summary_value(variant, 'num_params')} | {extent_cells(variant)} "
                     f"| {fmt_mean_std(variant.final('val_loss'))} | {fmt_mean_std(variant.final('val_bpb'))} "
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


# -------- learning-rate sweeps: a variant's runs at several peak learning rates

def by_lr(variant: Variant) -> dict[float, Variant]:
    """The variant's runs split by train.lr, in increasing order: one Variant (of seeds) per lr."""
    groups: dict[float, Variant] = {}
    for run in variant.runs:
        groups.setdefault(run.config["train"]["lr"], Variant(variant.name)).runs.append(run)
    return dict(sorted(groups.items()))


def init_bpb(runs: list[Run]) -> float | None:
    """The loss at initialisation in bpb: ln(vocab_size) nats, a uniform prediction (the initialised
    model's logits are near 0: 8.27 nats at step 0 against ln 4096 = 8.32), converted with the val
    split's bytes per token, which any eval gives as val_loss / val_bpb / ln 2."""
    for run in runs:
        if run.evals and "vocab_size" in run.summary:
            last = run.evals[-1]
            return math.log(run.summary["vocab_size"]) * last["val_bpb"] / last["val_loss"]
    return None


def final_bpb(run: Run, init: float) -> float | None:
    """A run's result on the learning-rate axis: its final val bpb, the loss at initialisation for a run
    that diverged (Wortsman et al.: a diverged run scores no better than an untrained one), None for a
    run that is missing or was stopped (no result, not a bad one)."""
    if run.problem is None:
        return run.evals[-1]["val_bpb"]
    return init if run.problem.startswith("stopped: diverged") else None


@dataclass
class LRLine:
    """One variant on the learning-rate axis."""
    name: str
    curve: dict[float, float]  # lr -> final val bpb of its lowest-seed run (seed 0), diverged at init
    diverged: set[float]
    best_lr: float | None
    best: Variant  # the runs (seeds) at best_lr
    sensitivity: float | None  # over the grid every line shares


def lr_line(variant: Variant, init: float, grid: list[float]) -> LRLine:
    at = by_lr(variant)
    curve, diverged = {}, set()
    for lr, at_lr in at.items():
        first = min(at_lr.runs, key=lambda r: r.config["train"].get("seed", 0))
        value = final_bpb(first, init)
        if value is not None:
            curve[lr] = value
            if first.problem is not None:
                diverged.add(lr)
    trained = {lr: v for lr, v in curve.items() if lr not in diverged}
    best_lr = min(trained, key=trained.get) if trained else None
    best = at[best_lr] if best_lr is not None else Variant(variant.name)
    shared = grid and all(lr in curve for lr in grid)  # no grid shared by every line: no sensitivity
    sensitivity = lr_sensitivity([curve[lr] for lr in grid], init) if shared else None
    return LRLine(variant.name, curve, diverged, best_lr, best, sensitivity)


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
    init = init_bpb([r for v in variants for r in v.runs])
    grid = sorted(set.intersection(*(set(by_lr(v)) for v in variants)))
    return [lr_line(v, init, grid) for v in variants], grid, init


def lr_table(lines: list[LRLine], baseline: LRLine | None, trains: dict[str, float | None],
             grid_trains: dict[str, str]) -> str:
    rows = ["| variant | best lr | LR sensitivity | runs at best lr (n) | steps | tokens (M) | elapsed s "
            "| val bpb at best lr | Δ bpb vs baseline | beyond seed noise? | largest lr that trains | grid that trains "
            "| params | KV cache bytes/token |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for line in lines:
        delta, beyond = difference(line.best, baseline.best if baseline else None)
        if line is baseline:
            delta, beyond = "(baseline)", ""
        n_incomplete = len(line.best.runs) - len(line.best.complete)
        runs = f"{len(line.best.complete)}" + (f" + {n_incomplete} incomplete" if n_incomplete else "")
        rows.append(f"| {line.name} | {'none' if line.best_lr is None else f'{line.best_lr:g}'} | "
                    f"{'n/a' if line.sensitivity is None else f'{line.sensitivity:.4f}'} | {runs} "
                    f"| {extent_cells(line.best)} | {fmt_mean_std(line.best.final('val_bpb'))} | {delta} | {beyond} "
                    f"| {'none' if trains[line.name] is None else f'{trains[line.name]:g}'} | {grid_trains[line.name]} "
                    f"| {summary_value(line.best, 'num_params')} "
                    f"| {summary_value(line.best, 'kv_cache_bytes_per_token')} |")
    return "\n".join(rows)


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


def lr_curve_table(lines: list[LRLine]) -> str:
    """Every line's final val bpb (seed 0) at every learning rate tried: the numbers behind the LR plot."""
    lrs = sorted({lr for line in lines for lr in line.curve})
    rows = ["| variant | " + " | ".join(f"{lr:g}" for lr in lrs) + " |", "|---|" + "---:|" * len(lrs)]
    for line in lines:
        cells = ["diverged" if lr in line.diverged else f"{line.curve[lr]:.4f}" if lr in line.curve else ""
                 for lr in lrs]
        rows.append(f"| {line.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def recorded_variants(path: Path) -> list[Variant]:
    """The lines of a sweep's JSON (--json) as variants of runs that keep only their final val bpb: seed 0 at every
    learning rate, every seed at the best one (the JSON lists them in seed order)."""
    record = json.loads(path.read_text())
    variants = []
    for name, line in record["variants"].items():
        finals = {float(lr): [bpb] for lr, bpb in line["final_bpb_seed0"].items()}
        if line["best_lr"] is not None:
            finals[line["best_lr"]] = line["best_lr_val_bpb"]
        runs = [Run(path / name / f"lr{lr:g}" / f"seed{seed}", {"variant": name, "train": {"lr": lr, "seed": seed}},
                    [{"val_bpb": bpb}], {}, "stopped: diverged (recorded)" if lr in line["diverged"] else None)
                for lr, values in finals.items() for seed, bpb in enumerate(values)]
        variants.append(Variant(name, runs))
    return variants


def report_lr_sweep(runs: list[Run], sweep, baseline_name: str, margin: float, args) -> None:
    lines, grid, init = sweep
    baseline = next((line for line in lines if line.name == baseline_name), None)
    lines.sort(key=lambda line: line is not baseline)
    unigram = next((r.summary["unigram_val_bpb"] for r in runs if "unigram_val_bpb" in r.summary), None)
    trains = {line.name: largest_lr_that_trains(line, unigram - margin) if unigram is not None else None
              for line in lines}
    grid_trains = {line.name: grid_that_trains(line, grid, unigram - margin) if unigram is not None else "n/a"
                   for line in lines}
    print(lr_table(lines, baseline, trains, grid_trains))
    if routing := routing_table([line.best for line in lines]):
        print(f"\nThe routing at each line's best lr (last eval):\n\n{routing}")
    print(f"\nLR sensitivity: over the {len(grid)} learning rates every variant has ({', '.join(f'{lr:g}' for lr in grid)}), "
          f"with the loss at initialisation {init:.4f} bpb (ln vocab_size) for a diverged run or one worse than that.")
    if unigram is not None:
        print(f"Trains: final val bpb below the unigram level {unigram:.4f} - {margin:g} = {unigram - margin:.4f} (seed 0).")
    print("\nFinal val bpb (seed 0) at each learning rate:\n\n" + lr_curve_table(lines))
    if baseline is None:
        print(f"\nno variant named {baseline_name!r}, so no differences: pass --baseline with one of "
              f"{', '.join(repr(line.name) for line in lines)}")
    if args.plot:
        plot([line.best for line in lines if line.best.runs], args.plot)
        print(f"\nplot (each variant at its best lr): {args.plot}")
    if args.lr_plot:
        lr_plot(lines, init, unigram, args.lr_plot)
        print(f"plot (final val bpb vs learning rate): {args.lr_plot}")
    if args.json:
        numbers = {"grid": grid, "init_bpb": init, "unigram_val_bpb": unigram, "trains_margin": margin,
                   "variants": {line.name: {
                       "best_lr": line.best_lr, "lr_sensitivity": line.sensitivity,
                       "largest_lr_that_trains": trains[line.name], "grid_that_trains": grid_trains[line.name],
                       "final_bpb_seed0": {f"{lr:g}": bpb for lr, bpb in line.curve.items()},
                       "diverged": sorted(line.diverged),
                       "best_lr_val_bpb": line.best.final("val_bpb"),
                       **({"best_lr_max_vio": line.best.final("moe/max_vio")} if routes(line.best) else {})}
                       for line in lines}}
        with writing(args.json):
            write_json(args.json, numbers)
        print(f"numbers: {args.json}")


def report_comparison(variants: list[Variant], baseline_name: str, args) -> None:
    baseline = next((v for v in variants if v.name == baseline_name), None)
    variants.sort(key=lambda v: v is not baseline)  # the baseline row first, the rest as found
    print(markdown_table(variants, baseline))
    if routing := routing_table(variants):
        print(f"\nThe routing (last eval):\n\n{routing}")
    if baseline is None:
        print(f"\nno variant named {baseline_name!r}, so no differences: pass --baseline with one of "
              f"{', '.join(repr(v.name) for v in variants)}")
    if args.plot:
        x = "elapsed_s" if equal_time_budget([r for v in variants for r in v.runs]) is not None else "tokens"
        plot(variants, args.plot, x)
        print(f"\nplot (val bpb vs {'training seconds' if x == 'elapsed_s' else 'tokens'}): {args.plot}")


def main(argv=None) -> None:
    try:
        compare(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def compare(argv) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs or folders above them (a multirun dir)")
    parser.add_argument("--plot", type=Path, help="write val bpb vs tokens to this PNG")
    parser.add_argument("--lr-plot", type=Path, help="a learning-rate sweep: final val bpb vs lr to this PNG")
    parser.add_argument("--json", type=Path, help="a learning-rate sweep: its numbers to this JSON file")
    parser.add_argument("--trains-margin", type=float, default=0.1,
                        help="a run trains when its final val bpb is this far below the unigram level")
    parser.add_argument("--baseline", default="baseline", help="the variant the others are compared with")
    parser.add_argument("--recorded", type=Path,
                        help="a learning-rate sweep's JSON (--json) whose lines are shown beside the dirs' lines")
    args = parser.parse_args(argv)

    run_dirs = []
    for root in args.dirs:
        found = find_run_dirs(root) if root.is_dir() else []
        if not found:
            raise UsageError(f"DIR {root}: no run there (a run dir holds metrics.jsonl or config.yaml)")
        run_dirs += found
    runs = [load_run(d) for d in dict.fromkeys(run_dirs)]
    lines = group_runs(runs, SEED + LEARNING_RATE)
    if args.recorded:
        try:
            recorded = recorded_variants(args.recorded)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"--recorded {args.recorded}: not a sweep's JSON from compare.py --json "
                             f"({type(err).__name__}: {err})") from None
        lines += [v for v in recorded if v.name not in {line.name for line in lines}]
    sweep = lr_sweep_lines(lines)
    if sweep is None and (args.lr_plot or args.json):
        raise UsageError(f"--lr-plot/--json need a learning-rate sweep, but no variant in "
                         f"{' '.join(map(str, args.dirs))} has runs at more than one train.lr")
    try:
        if sweep is None:
            report_comparison(group_runs(runs), args.baseline, args)
        else:
            report_lr_sweep(runs, sweep, args.baseline, args.trains_margin, args)
    finally:  # a plot or JSON that cannot be written: what was read is printed whole, then the error line
        note = unequal_training_note(runs)
        if note:
            print(f"\n{note}")
        incomplete = [r for r in runs if r.problem]
        if incomplete:
            print("\nincomplete runs, left out of the means:")
            for run in incomplete:
                print(f"- {run.path}: {run.problem}")


if __name__ == "__main__":
    main()
