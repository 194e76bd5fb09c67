"""Training runs as compare.py reads them: a run dir's config, metrics and summary, whether it is complete, and
the sweep it belongs to."""
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from model.config import ModelConfig
from training.multirun import RECORDS


# settings that change how a run is logged, how many cores it used, where its link is: not what it trains
NOT_COMPARED = ("wandb.", "train.threads", "train.resume", "latest_link")
SEED = ("train.seed",)
# what an eval measures, compared between variants: a text run's bits per byte (lower is better), a synthetic
# task's accuracy (higher)
MEASURES = {"val_bpb": "bpb", "val_acc": "acc"}
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
        return [m for m in self.metrics if any(key in m for key in MEASURES)]


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
        elif not any(key in m for m in metrics for key in MEASURES):
            problem = f"no {' or '.join(MEASURES)} in metrics.jsonl"
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


def sweep_of(run_dir: Path) -> Path | None:
    """The multirun a run is a job of (train.py -m, a sweep.py study): the nearest dir above it that holds a
    multirun's records (training/multirun.py), else None for a run of its own. Two sweeps of one config are two
    sets of runs, not seeds of one: each may hold a seed 0."""
    return next((folder for folder in run_dir.resolve().parents if (folder / RECORDS).is_dir()), None)


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


def measure_of(variants: list[Variant]) -> str:
    """The key the variants are compared by: val_acc where every complete run's last eval has it (a task's runs),
    else val_bpb."""
    complete = [run for variant in variants for run in variant.complete]
    return "val_acc" if complete and all("val_acc" in run.evals[-1] for run in complete) else "val_bpb"
