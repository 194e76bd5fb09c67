"""A length study's evaluations (scripts/long_context.py, scripts/window_lengths.py): every checkpoint scored by
evaluate.py's work (insight/evaluation.py), its JSON kept so that the same command scores nothing twice; and the mean and std
over seeds of each row, length and mode."""
import json
import statistics
from pathlib import Path

from cli import run_command
from insight.evaluation import evaluate_and_write

SEEDS = (0, 1, 2)  # a length study's seeds
MAX_TOKENS = 32768  # the val split's first tokens each evaluation scores


def evaluate_all(out: Path, eval_dir: Path, jobs: list[tuple[str, int, Path, list[str]]],
                 max_tokens: int = MAX_TOKENS) -> list[dict]:
    """Every evaluation's JSON under eval_dir, one row per length and mode; jobs as evaluations() gives them (their
    checkpoints under out), each scoring the val split's first max_tokens. A JSON is kept from an earlier call
    where its name says it scored the same checkpoint, row, flags and tokens."""
    rows = []
    for row, seed, ckpt, flags in jobs:
        file = eval_dir / ckpt.relative_to(out) / f"{row}-{'-'.join(flags[1::2][:2])}-{max_tokens}.json"
        if not file.exists():
            file.parent.mkdir(parents=True, exist_ok=True)
            flags = ["--ckpt", str(ckpt), *flags, "--max-tokens", str(max_tokens), "--json", str(file),
                     "--plot", str(file.with_suffix(".png"))]
            if run_command(lambda: evaluate_and_write(flags)):
                raise SystemExit(f"evaluate.py failed on {ckpt}")
        result = json.loads(file.read_text())
        rows += [{"row": row, "seed": seed, "rope_factor": result["rope_factor"], **r} for r in result["results"]]
    return rows


def table(rows: list[dict]) -> list[dict]:
    """Mean and sample std over seeds of each (row, length, mode)."""
    cells = {}
    for r in rows:
        cells.setdefault((r["row"], r["length"], r["mode"]), []).append(r["val_bpb"])
    return [{"row": row, "length": length, "mode": mode, "seeds": len(v), "mean": statistics.mean(v),
             "std": statistics.stdev(v) if len(v) > 1 else 0.0} for (row, length, mode), v in cells.items()]
