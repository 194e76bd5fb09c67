"""The W&B run a checkpoint was trained in, and report.py's figures and tables logged into it."""
import json
from pathlib import Path

import torch

from errors import UsageError
from storage.checkpoint import run_dir_of


def run_name(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "summary.json").read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return run_dir.name


def wandb_run_of(ckpt_dir: Path, path: str) -> dict:
    """The W&B run train.py logged this checkpoint to: its project (config.yaml) and id (train_state.pt)."""
    from omegaconf import OmegaConf

    from training.state import STATE_FILE, progress_from

    run_dir = run_dir_of(ckpt_dir)
    if not (run_dir / "config.yaml").is_file() or not (ckpt_dir / STATE_FILE).is_file():
        raise UsageError(f"--wandb: --ckpt {path} is not a train.py run's checkpoint (no {run_dir / 'config.yaml'} "
                         f"or {ckpt_dir / STATE_FILE}), so it has no W&B run to log to")
    try:
        project = OmegaConf.load(run_dir / "config.yaml").wandb.project
        wandb_id = progress_from(torch.load(ckpt_dir / STATE_FILE, weights_only=True)["progress"]).wandb_id
    except Exception as e:  # a damaged config.yaml or train_state.pt, whichever way it fails
        raise UsageError(f"--wandb: --ckpt {path}: cannot read its W&B run: {e}") from None
    return {"project": project, "id": wandb_id, "name": run_name(run_dir), "dir": wandb_dir_of(run_dir, wandb_id)}


def wandb_dir_of(run_dir: Path, wandb_id: str) -> Path:
    """Where train.py wrote the run's W&B files: the run dir, or for a multirun's job the sweep dir above it."""
    return next((folder for folder in (run_dir, *run_dir.parents) if any((folder / "wandb").glob(f"*-{wandb_id}"))),
                run_dir)


def log_to_wandb(runs: list[dict], folder: Path, pngs: list[str], tables: dict) -> None:
    """The report's figures (wandb.Image, as report/<figure>) and tables (wandb.Table, as report/table/<name>),
    into each checkpoint's run."""
    import wandb

    from training.tracking import wandb_mode

    for run in runs:
        with wandb.init(project=run["project"], id=run["id"], name=run["name"], dir=run["dir"], resume="allow",
                        mode=wandb_mode(None)) as logged:
            logged.log({f"report/{name.removesuffix('.png')}": wandb.Image(str(folder / name)) for name in pngs}
                       | {f"report/table/{name}": wandb.Table(columns=t["columns"], data=t["rows"])
                          for name, t in tables.items()})
