"""Checkpoints that training can resume from: storage/checkpoint.py's directory plus train_state.pt.

    train_state.pt = {"progress": {step, tokens, elapsed_s, best_val_loss, last_val, wandb_id},
                      "optimizer": AdamW state (optim=muon: {"muon": ..., "adamw": ...}), "rng": {"torch": CPU state,
                      "cuda": [per-device states]}}

The learning rate is a function of the step (training/optim.py) and the batches of a step come
from a generator seeded by (train.seed, rank, step) (step_generator below), so the step is both
the scheduler state and the data position. The torch RNG states cover dropout. Everything in the file is
tensors and plain Python values, read back with torch.load(weights_only=True): no pickle.
"""
import io
import math
import os
import re
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from errors import ConfigError
from model.transformer import Transformer
from storage.checkpoint import CheckpointError, read_checkpoint, resolve_ckpt_dir, run_dir_of, save_checkpoint
from storage.files import write_bytes
from training.budget import parse_duration
from training.config import init_settings, resume_settings
from training.tracking import read_summary

STATE_FILE = "train_state.pt"


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    tokens: int = 0  # training tokens seen, over all processes
    elapsed_s: float = 0.0  # wall time of the training so far, over every resume
    best_val_loss: float | None = None
    last_val: dict = field(default_factory=dict)  # val_loss, val_bpb, val_ppl of the latest eval
    wandb_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # a resumed run continues its W&B run

    def advance(self, tokens: int, elapsed_s: float) -> None:
        """One optimizer step done, on `tokens` training tokens, `elapsed_s` into the training."""
        self.step, self.tokens, self.elapsed_s = self.step + 1, self.tokens + tokens, elapsed_s

    def record_eval(self, val: dict) -> dict:
        """Keeps an eval's numbers (the latest, the best loss) and passes them on."""
        self.last_val = val
        self.best_val_loss = min(val["val_loss"], self.best_val_loss or math.inf)
        return val


def wants_resume(resume: bool | str | None, run_dir: Path) -> bool:
    """train.resume as true or false: auto is whether the run dir holds a checkpoint (a multirun's job passes it
    for null, training/multirun.py); null, for a single run, is false."""
    if resume == "auto":
        try:
            return resolve_ckpt_dir(run_dir) is not None
        except CheckpointError:
            return False
    if resume not in (True, False, None):
        raise ConfigError(f"train.resume={resume} must be true, false or auto")
    return bool(resume)


def continue_settings(cfg: DictConfig, run_dir: Path) -> str | None:
    """train.resume, read before anything is written: cfg becomes the run's own settings, with what the command line
    may change of them (resume_settings; the changes named on one notice line). A run whose last session completed
    (summary.json's stop_reason) and that has reached its limits as they are now has nothing left to train: the line
    that says so, for a command that then writes nothing (a complete record is final: a rerun of a finished multirun
    leaves its jobs' files as they are). None where the run goes on."""
    changed = resume_settings(cfg, run_dir)
    summary = read_summary(run_dir)
    if summary.get("stop_reason") == "completed" and wants_resume("auto", run_dir) and \
            limits_reached(cfg.train, summary):
        return (f"{run_dir} is complete: {summary['steps']:,} steps, ended by train.{summary['ended_by']}; nothing "
                f"to do (to train it further, raise train.max_steps or train.time_budget)")
    if changed and int(os.environ.get("RANK", 0)) == 0:
        print(f"notice: resuming {run_dir} with its own settings, and {', '.join(changed)}")
    return None


def limits_reached(train: DictConfig, summary: dict) -> bool:
    """Whether a completed run (its summary) has reached train.max_steps or train.time_budget as set now: a larger
    one of the limit that ended it trains on."""
    if train.max_steps is not None and summary["steps"] >= train.max_steps:
        return True
    budget = parse_duration(train.time_budget)
    return budget is not None and summary["ended_by"] == "time_budget" and budget <= summary["time_budget_s"]


def checkpoint_to_resume(run_dir: Path, resume: bool) -> Path | None:
    """The checkpoint train.resume=true continues; a fresh run refuses a run dir that holds one,
    rather than overwrite it."""
    try:
        found = resolve_ckpt_dir(run_dir)
    except CheckpointError:
        found = None
    if resume and found is None:
        raise CheckpointError(f"train.resume=true but there is no checkpoint in {run_dir} "
                              f"(no {run_dir / 'ckpt' / 'config.json'}); set hydra.run.dir to the run to resume")
    if not resume and found is not None:
        raise ConfigError(f"{run_dir} already holds a checkpoint; add train.resume=true to continue it, "
                          f"or choose another hydra.run.dir")
    return found


def save_training_checkpoint(ckpt_dir: Path, model: Transformer, tokenizer_file: Path,
                             optimizer: torch.optim.Optimizer, progress: Progress) -> None:
    state = {"progress": asdict(progress), "optimizer": optimizer.state_dict(),
             "rng": {"torch": torch.get_rng_state(),
                     "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}
    buffer = io.BytesIO()
    torch.save(state, buffer)  # to memory first: torch's own file writer turns a full disk into a RuntimeError
    save_checkpoint(ckpt_dir, model, tokenizer_file,
                    write_extra=lambda tmp: write_bytes(tmp / STATE_FILE, buffer.getbuffer()))


class RunCheckpoint:
    """The run dir's ckpt/ as training goes: saved from the live model, optimizer and progress, and the step
    it holds (None until the first save of a fresh run)."""

    def __init__(self, run_dir: Path, model: Transformer, tokenizer_file: Path, optimizer: torch.optim.Optimizer,
                 progress: Progress, resumed: bool):
        self.dir, self.model, self.tokenizer_file, self.optimizer = run_dir / "ckpt", model, tokenizer_file, optimizer
        self.progress = progress
        self.step = progress.step if resumed else None

    def save(self) -> None:
        save_training_checkpoint(self.dir, self.model, self.tokenizer_file, self.optimizer, self.progress)
        self.step = self.progress.step


@dataclass
class Start:
    """Where a run's weights start: the checkpoint it continues (train.resume), another run's weights
    (train.init_from, its resolved checkpoint dir), or none: freshly drawn."""
    resume_from: Path | None = None
    init_from: Path | None = None

    @property
    def resumed(self) -> bool:
        return self.resume_from is not None

    def load(self, model: Transformer, tokenizer_file: Path, optimizer: torch.optim.Optimizer) -> Progress:
        """Into the freshly built model and optimizer; the progress the run goes on from."""
        if self.resumed:
            return resume_training(self.resume_from, model, tokenizer_file, optimizer)
        if self.init_from is not None:  # another run's weights, this run's optimizer and schedule
            start_from(self.init_from, model, tokenizer_file)
        return Progress()

    def describe(self, progress: Progress) -> str:
        """For the run's first line."""
        if self.resumed:
            return f" | resumed at step {progress.step}"
        return f" | from the weights of {run_dir_of(self.init_from)}" if self.init_from is not None else ""


def run_start(cfg: DictConfig, run_dir: Path) -> Start:
    """Where the run starts: the checkpoint a resumed run continues (its settings set by continue_settings), or the
    run train.init_from names, whose model and data settings are set in cfg and which the run then records by its
    resolved path (so that its config.yaml never names a link that moves, as outputs/latest does: to this very run
    once it starts)."""
    resume_from = checkpoint_to_resume(run_dir, cfg.train.resume)
    if resume_from is not None:  # its settings are already the run's own (continue_settings)
        return Start(resume_from=resume_from)
    if not cfg.train.init_from:
        return Start()
    source = init_settings(cfg, cfg.train.init_from).resolve()
    cfg.train.init_from = str(run_dir_of(source))
    return Start(init_from=source)


def start_from(ckpt_dir: Path, model: Transformer, tokenizer_file: Path) -> None:
    """train.init_from: the source checkpoint's weights into the freshly built model (its settings came from the
    source: training/config.py's init_settings), read only: the source run is left as it is, and may be saving."""
    source = read_checkpoint(ckpt_dir)
    if source.files["tokenizer.model"] != Path(tokenizer_file).read_bytes():
        raise CheckpointError(f"train.init_from={ckpt_dir}: its tokenizer differs from the one the data settings "
                              f"give now ({tokenizer_file})")
    ours, theirs = model.state_dict(), source.model.state_dict()
    for name, tensor in theirs.items():
        if ours[name].shape != tensor.shape:  # only a learned position table changes shape with the context
            raise ConfigError(f"train.init_from={ckpt_dir}: {name} has {list(tensor.shape)}, this run's model "
                              f"{list(ours[name].shape)}: model.position={model.cfg.position} has no rows for "
                              f"model.context_length={model.cfg.context_length}")
    model.load_state_dict(theirs)


def resume_training(ckpt_dir: Path, model: Transformer, tokenizer_file: Path,
                    optimizer: torch.optim.Optimizer) -> Progress:
    """Loads weights, optimizer and RNG states into the freshly built model and optimizer."""
    saved = read_checkpoint(ckpt_dir)
    if saved.model.cfg != model.cfg:
        theirs = saved.model.cfg.to_dict()
        changed = ", ".join(f"model.{k}={v} (checkpoint: {theirs[k]})"
                            for k, v in model.cfg.to_dict().items() if theirs[k] != v)
        raise CheckpointError(f"cannot resume {ckpt_dir}: this run's config differs from the checkpoint's: {changed}")
    if saved.files["tokenizer.model"] != Path(tokenizer_file).read_bytes():
        raise CheckpointError(f"cannot resume {ckpt_dir}: its tokenizer differs from the one the data settings "
                              f"give now ({tokenizer_file})")
    if STATE_FILE not in saved.files:
        raise CheckpointError(f"cannot resume {ckpt_dir}: it has no {STATE_FILE} (weights only)")
    try:
        state = torch.load(io.BytesIO(saved.files[STATE_FILE]), weights_only=True)
        model.load_state_dict(saved.model.state_dict())
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        return progress_from(state["progress"])
    except Exception as e:  # a truncated file, one from another version of this code, one weights_only refuses
        raise CheckpointError(f"cannot resume {ckpt_dir}: unreadable {STATE_FILE}: {load_error(e)}") from None


def load_error(error: Exception) -> str:
    """torch.load's error in one line. weights_only's refusal of an object whose loading would run code is lines of
    advice around its reason, which is kept."""
    refused = re.search(r"WeightsUnpickler error: (.+?)(\.\s|$)", str(error), re.MULTILINE)
    if refused:
        return f"it holds more than tensors and plain values: {refused[1]}"
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


PROGRESS_TYPES = {"step": (int, "an integer"), "tokens": (int, "an integer"), "elapsed_s": ((int, float), "a number"),
                  "best_val_loss": ((int, float, type(None)), "a number or null"), "last_val": (dict, "a dict"),
                  "wandb_id": (str, "a string")}


def progress_from(values) -> Progress:
    """train_state.pt's progress, each field of the type Progress keeps, or a CheckpointError naming it."""
    if not isinstance(values, dict) or values.keys() != PROGRESS_TYPES.keys():
        raise CheckpointError(f"the progress in {STATE_FILE} has fields "
                              f"{sorted(values) if isinstance(values, dict) else values!r}, not {sorted(PROGRESS_TYPES)}")
    for name, (kinds, description) in PROGRESS_TYPES.items():
        if not isinstance(values[name], kinds) or isinstance(values[name], bool):
            raise CheckpointError(f"the progress in {STATE_FILE} has {name}={values[name]!r} "
                                  f"({type(values[name]).__name__}), which must be {description}")
    return Progress(**values)


def step_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator that draws the batches of one optimizer step on one process. Seeding it from
    (seed, rank, step) makes the step the data position: a resumed run draws the very batches the
    uninterrupted run would have, with no generator state to save. SeedSequence mixes the three
    numbers, so seeds 0 and 1 do not share shifted batch streams as seed + step would."""
    mixed = np.random.SeedSequence([seed, rank, step]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed))
