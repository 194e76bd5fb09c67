"""Compare training runs without W&B: a markdown table and a plot of val bpb against tokens.

    python compare.py multirun/ablation/2025-01-01_12-00-00 [more dirs...] --plot docs/ablation.png

Each DIR is a run dir or any folder above run dirs (a multirun dir); a run dir is a folder
holding the metrics.jsonl or config.yaml that train.py writes. Runs are grouped into variants:
runs whose resolved configs are equal apart from train.seed and the wandb node (logging only)
are seeds of one variant. A variant is named by its config's `variant` key (the ablation sets
it), else by the settings in which it differs from the other variants.

Per variant: final val loss and val bpb as mean ± sample std over its complete runs (n), and
the difference in bpb from the baseline variant (--baseline), which counts as beyond seed noise when

    |Δ| > 2 · sqrt(s_v² / n_v + s_b² / n_b)

(two standard errors of the difference of two means; "n/a" when either side has one run).
bpb alone is compared: every run reads the same tokenizer, so loss and bpb differ by a constant.
A run whose metrics.jsonl is missing, has a line that is not JSON (killed mid-write), has no
val_bpb, or stops before train.max_steps (or whose summary.json gives a stop_reason other than
completed: a NaN loss, a signal) is reported as incomplete and left out of the means.
"""
import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from data.files import atomic_write

NOT_COMPARED = ("wandb",)  # config nodes that change how a run is logged, not what it trains


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
        elif max_steps is not None and metrics[-1].get("step", 0) < max_steps:
            problem = f"stopped at step {metrics[-1].get('step')} of train.max_steps={max_steps}"
    return Run(run_dir, config, metrics, summary, problem)


def flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def variant_key(run: Run) -> str:
    flat = flatten({k: v for k, v in run.config.items() if k not in NOT_COMPARED})
    flat.pop("train.seed", None)
    return json.dumps(flat, sort_keys=True, default=str) if run.config else str(run.path)


def group_runs(runs: list[Run]) -> list[Variant]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(variant_key(run), []).append(run)
    flats = [flatten(group[0].config) for group in groups.values()]
    named = [flat for flat in flats if flat]
    differing = sorted({k for flat in named for k in flat
                        if len({json.dumps(f.get(k), default=str) for f in named}) > 1
                        and k not in ("variant", "train.seed") and not k.startswith(NOT_COMPARED)})
    variants = []
    for group, flat in zip(groups.values(), flats):
        if not flat:  # no config to name it by
            name = str(group[0].path)
        else:
            name = flat.get("variant") or ", ".join(f"{k}={flat.get(k)}" for k in differing) or group[0].path.name
        variants.append(Variant(name, group))
    return variants


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


def median_tokens_per_s(run: Run) -> float | None:
    """The median of the logged tokens_per_s: robust to the slower steps that evaluate or save."""
    rates = [m["tokens_per_s"] for m in run.metrics if "tokens_per_s" in m]
    return statistics.median(rates) if rates else None


def summary_value(variant: Variant, key: str) -> str:
    values = {r.summary[key] for r in variant.runs if key in r.summary}
    return ", ".join(f"{v:,}" for v in sorted(values)) or "?"


def markdown_table(variants: list[Variant], baseline: Variant | None) -> str:
    lines = ["| variant | runs (n) | params | val loss | val bpb | Δ bpb vs baseline | beyond seed noise? "
             "| tokens/s | KV cache bytes/token |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for variant in variants:
        n_incomplete = len(variant.runs) - len(variant.complete)
        runs = f"{len(variant.complete)}" + (f" + {n_incomplete} incomplete" if n_incomplete else "")
        rates = [r for r in map(median_tokens_per_s, variant.complete) if r is not None]
        speed = f"{statistics.mean(rates):,.0f}" if rates else "?"
        delta, beyond = difference(variant, baseline)
        lines.append(f"| {variant.name} | {runs} | {summary_value(variant, 'num_params')} "
                     f"| {fmt_mean_std(variant.final('val_loss'))} | {fmt_mean_std(variant.final('val_bpb'))} "
                     f"| {delta} | {beyond} | {speed} | {summary_value(variant, 'kv_cache_bytes_per_token')} |")
    return "\n".join(lines)


def bpb_curve(variant: Variant) -> tuple[list[int], list[float], list[float], list[float]]:
    """tokens, and the mean, min and max val bpb over the variant's runs that evaluated at those tokens."""
    by_tokens: dict[int, list[float]] = {}
    for run in variant.runs:
        for m in run.evals:
            by_tokens.setdefault(m["tokens"], []).append(m["val_bpb"])
    tokens = sorted(by_tokens)
    return (tokens, [statistics.mean(by_tokens[t]) for t in tokens],
            [min(by_tokens[t]) for t in tokens], [max(by_tokens[t]) for t in tokens])


def plot(variants: list[Variant], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    # Left: whole runs. Right: the second half, where the variants separate; the first evals'
    # high bpb would otherwise flatten every difference that matters.
    fig, (whole, tail) = plt.subplots(1, 2, figsize=(13, 5))
    tail_lo, tail_hi, last_tokens = math.inf, -math.inf, 0
    for variant in variants:
        tokens, mean, low, high = bpb_curve(variant)
        if not tokens:
            continue
        millions = [t / 1e6 for t in tokens]
        for ax in (whole, tail):
            (line,) = ax.plot(millions, mean, marker=".", label=f"{variant.name} (n={len(variant.runs)})")
            ax.fill_between(millions, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        last_tokens = max(last_tokens, tokens[-1])
        half = [i for i, t in enumerate(tokens) if t >= tokens[-1] / 2]
        tail_lo = min(tail_lo, *(low[i] for i in half))
        tail_hi = max(tail_hi, *(high[i] for i in half))
    for ax in (whole, tail):
        ax.set_xlabel("training tokens (M)")
        ax.set_ylabel("val bits per byte")
        ax.grid(alpha=0.3)
    whole.set_title("val bpb vs tokens (line: mean over seeds, band: min-max)")
    if tail_lo < tail_hi:
        tail.set_xlim(last_tokens / 2 / 1e6, last_tokens * 1.02 / 1e6)
        margin = 0.05 * (tail_hi - tail_lo)
        tail.set_ylim(tail_lo - margin, tail_hi + margin)
    tail.set_title("second half, zoomed")
    tail.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs or folders above them (a multirun dir)")
    parser.add_argument("--plot", type=Path, help="write val bpb vs tokens to this PNG")
    parser.add_argument("--baseline", default="baseline", help="the variant the others are compared with")
    args = parser.parse_args(argv)

    run_dirs = []
    for root in args.dirs:
        found = find_run_dirs(root) if root.is_dir() else []
        if not found:
            print(f"error: DIR {root}: no run there (a run dir holds metrics.jsonl or config.yaml)", file=sys.stderr)
            sys.exit(2)
        run_dirs += found
    variants = group_runs([load_run(d) for d in dict.fromkeys(run_dirs)])
    baseline = next((v for v in variants if v.name == args.baseline), None)
    variants.sort(key=lambda v: v is not baseline)  # the baseline row first, the rest as found

    print(markdown_table(variants, baseline))
    if baseline is None:
        print(f"\nno variant named {args.baseline!r}, so no differences: pass --baseline with one of "
              f"{', '.join(repr(v.name) for v in variants)}")
    incomplete = [r for v in variants for r in v.runs if r.problem]
    if incomplete:
        print("\nincomplete runs, left out of the means:")
        for run in incomplete:
            print(f"- {run.path}: {run.problem}")
    if args.plot:
        plot(variants, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
