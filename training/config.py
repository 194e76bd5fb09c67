"""Checks of the train.* settings, run before any data is loaded, each failing with one line; the device,
the precision and the model config they give; a resumed run's settings (its own, and what the command line
may change of them).

The batch arithmetic lives here: train.batch_size is the GLOBAL batch in sequences per optimizer
step, whatever the number of processes, so

    accumulation_steps = batch_size / (world_size * micro_batch_size)

and each process runs that many forward/backward passes of micro_batch_size sequences per step.
train.micro_batch_size=null (the default) picks the largest divisor of batch_size / world_size that is
at most MAX_MICRO_BATCH sequences, so any batch size trains.
"""
import functools
import math
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from errors import ConfigError
from model.config import ModelConfig
from model.transformer import validate as validate_model
from settings import flatten
from storage.checkpoint import CheckpointError, resolve_ckpt_dir, run_dir_of
from training.budget import parse_duration
from training.optim import OPTIMIZERS

POSITIVE_INTS = ("batch_size", "eval_interval", "eval_tokens", "log_interval", "ckpt_interval",
                 "sample_interval", "sample_tokens")
MAX_MICRO_BATCH = 16  # sequences per forward/backward per process when train.micro_batch_size=null


def check_train_config(train: DictConfig, world_size: int) -> tuple[int, int]:
    """The ranges of train.* (their types the schema has checked, settings.py). Returns the
    micro-batch size and the gradient accumulation steps per optimizer step."""
    for key in POSITIVE_INTS:
        if train[key] <= 0:
            raise ConfigError(f"train.{key}={train[key]} must be a positive integer")
    budget = parse_duration(train.time_budget)
    for key in ("max_steps", "lr_decay_steps"):
        if train[key] is None and budget is None:
            raise ConfigError(f"train.{key}=null needs a train.time_budget: a run must end by steps or by time")
        if train[key] is not None and train[key] <= 0:
            raise ConfigError(f"train.{key}={train[key]} must be a positive integer")
    if not 0 <= train.warmup_fraction < 1:
        raise ConfigError(f"train.warmup_fraction={train.warmup_fraction} must be a number in [0, 1)")
    if train.decay_fraction is not None and not 0 < train.decay_fraction <= 1 - train.warmup_fraction:
        raise ConfigError(f"train.decay_fraction={train.decay_fraction} must be null (the cosine) or a number in "
                          f"(0, 1 - train.warmup_fraction = {1 - train.warmup_fraction:g}]")
    if not 0 < train.lr < math.inf:
        raise ConfigError(f"train.lr={train.lr} must be a positive number")
    if train.optimizer not in OPTIMIZERS:
        raise ConfigError(f"train.optimizer={train.optimizer!r} must be one of {', '.join(OPTIMIZERS)} (optim=muon "
                          f"chooses Muon)")
    if train.optimizer == "muon" and not (train.muon_lr is not None and 0 < train.muon_lr < math.inf):
        raise ConfigError(f"train.muon_lr={train.muon_lr} must be a positive number: Muon's peak learning rate")
    if train.optimizer != "muon" and train.muon_lr is not None:
        raise ConfigError(f"train.muon_lr={train.muon_lr} does nothing with train.optimizer={train.optimizer}; "
                          f"choose optim=muon")
    if not 0 <= train.min_lr <= train.lr:
        raise ConfigError(f"train.min_lr={train.min_lr} must be a number in [0, train.lr={train.lr}]")
    if train.reference_tokens_per_s is not None and not 0 < train.reference_tokens_per_s < math.inf:
        raise ConfigError(f"train.reference_tokens_per_s={train.reference_tokens_per_s} must be a positive number "
                          f"or null")
    for key in ("weight_decay", "grad_clip", "sample_temperature"):
        if not 0 <= train[key] < math.inf:
            raise ConfigError(f"train.{key}={train[key]} must be a number >= 0")
    betas = list(train.betas)
    if not (len(betas) == 2 and all(0 <= b < 1 for b in betas)):
        raise ConfigError(f"train.betas={betas} must be two numbers in [0, 1), e.g. [0.9, 0.95]")
    if train.seed < 0:
        raise ConfigError(f"train.seed={train.seed} must be an integer >= 0")
    if train.threads is not None and train.threads < 1:
        raise ConfigError(f"train.threads={train.threads} must be a positive integer or null")
    if train.batch_size % world_size:
        raise ConfigError(f"train.batch_size={train.batch_size} must be a multiple of the {world_size} processes")
    per_process = train.batch_size // world_size
    fits = [d for d in range(1, per_process + 1) if per_process % d == 0]
    micro = train.micro_batch_size
    if micro is None:
        micro = max(d for d in fits if d <= MAX_MICRO_BATCH)
    elif micro not in fits:
        raise ConfigError(f"train.batch_size={train.batch_size} must be a multiple of {world_size} processes x "
                          f"train.micro_batch_size={micro}; set train.micro_batch_size to one of "
                          f"{', '.join(map(str, fits))}, or null to choose")
    return micro, per_process // micro


def eval_window_count(train: DictConfig, context_length: int) -> int:
    """The val set's windows of context_length tokens: train.eval_tokens of them, rounded down."""
    if train.eval_tokens < context_length:
        raise ConfigError(f"train.eval_tokens={train.eval_tokens} must be at least one window of "
                          f"model.context_length={context_length} tokens")
    return train.eval_tokens // context_length


PROVISIONAL_VOCAB = 512  # data.vocab_size=null: the model is checked with it until the data's tokenizer says


def model_config(cfg: DictConfig, vocab_size: int | None = None) -> ModelConfig:
    """The model of a composed config: its `model` node, with this vocab size (the tokenizer's), else the data
    settings' (data.vocab_size=null: the vocabulary rule picks it with the data, so a provisional one checks the rest)."""
    vocab = vocab_size or cfg.data.vocab_size or PROVISIONAL_VOCAB
    model = ModelConfig.from_settings({**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": vocab})
    validate_model(model)  # each kind's own rules, before any data is read
    return model


def autocast_for(device: torch.device) -> AbstractContextManager:
    """The forward pass's precision: bf16 autocast on CUDA, fp32 on CPU (on CPUs without bf16 units,
    bf16 matmuls are far slower than fp32)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def resolve_device(setting: str) -> torch.device:
    """train.device: auto (cuda when available, else cpu), cpu, cuda or cuda:N."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(setting)
    except (RuntimeError, TypeError):
        raise ConfigError(f"train.device={setting!r} must be auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={setting!r} but torch sees no CUDA device here; use train.device=cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"train.device={setting!r} must be auto, cpu, cuda or cuda:N")
    return device


# What a resumed run may change (python train.py hydra.run.dir=D train.resume=true <these>): how long it goes on,
# how often it reports, where and how fast it runs. Anything else would change what its checkpoint is.
RESUME_MAY_CHANGE = frozenset({
    "train.time_budget", "train.max_steps", "train.lr_decay_steps", "train.batch_size", "train.micro_batch_size",
    "train.eval_interval", "train.log_interval", "train.ckpt_interval", "train.sample_interval", "train.sample_tokens",
    "train.sample_temperature", "train.sample_prompt", "train.diagnostics", "train.compile", "train.device",
    "train.threads", "train.reference_tokens_per_s", "latest_link"})


def resume_settings(cfg: DictConfig, run_dir: Path) -> list[str]:
    """train.resume=true: cfg becomes the run's own settings, with what the command line may change of them
    (settings_to_resume), which it returns as `key=new (was old)`. A run dir without a config.yaml holds no run to
    resume: the checkpoint's check (training/state.py) then says what is missing."""
    config_file = run_dir / "config.yaml"
    if not config_file.exists():
        return []
    overrides = list(HydraConfig.get().overrides.task)
    base = settings_of(cfg)
    return settings_to_resume(cfg, OmegaConf.load(config_file), compose("config"),
                              lambda: named_settings(overrides, base))


# What a run started from another run's weights (train.init_from) sets for itself (its command line's, else the
# defaults): the context it trains at, how RoPE reads positions past the old one, dropout. The rest of model.* and
# data.* made the weights and the tokenizer, so they are the source run's.
INIT_MAY_CHANGE = frozenset({"model.context_length", "model.rope_scaling", "model.rope_factor", "model.dropout"})


def init_settings(cfg: DictConfig, source: str) -> Path:
    """train.init_from: cfg's model.* and data.* become the source run's (its config.yaml), but for the
    INIT_MAY_CHANGE settings; any other the command line names differently is a ConfigError. RoPE's original
    context becomes the source's. Returns the source's checkpoint dir."""
    try:
        ckpt_dir = resolve_ckpt_dir(source)
    except CheckpointError as e:
        raise ConfigError(f"train.init_from={source}: {e}") from None
    config_file = run_dir_of(ckpt_dir) / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"train.init_from={source}: no config.yaml in {config_file.parent}; give a training run's dir")
    saved = settings_of(OmegaConf.load(config_file))
    now = settings_of(cfg)
    named = named_settings(list(HydraConfig.get().overrides.task), now)
    for key, value in saved.items():
        if not key.startswith(("model.", "data.")) or key in INIT_MAY_CHANGE:
            continue
        if key in named and now.get(key) != value:
            raise ConfigError(f"{key}={now.get(key)}: train.init_from={source} was trained with {key}={value}, which "
                              f"its weights or tokenizer depend on; a run from its weights may change only "
                              f"{', '.join(sorted(INIT_MAY_CHANGE))}")
        OmegaConf.update(cfg, key, value, merge=False)
    original = saved.get("model.rope_original_context") or saved["model.context_length"]
    OmegaConf.update(cfg, "model.rope_original_context", original, merge=False)
    return ckpt_dir


def settings_of(cfg: DictConfig) -> dict:
    """A composed config, resolved, as {"train.lr": 0.001, ...}."""
    return flatten(OmegaConf.to_container(cfg, resolve=True))


def named_settings(overrides: list[str], base: dict) -> set[str]:
    """The settings a command line names: a key override its key; a group option (norm=rmsnorm, +experiment=quick)
    every setting that another option of its group would set otherwise, so that naming the default option names
    them too. base: the command line's own settings (settings_of). Composed as train.py's main composes, inside it."""
    named = set()
    for i, override in enumerate(OverridesParser.create().parse_overrides(overrides)):
        options = GlobalHydra.instance().config_loader().get_group_options(override.key_or_group)
        if not options:
            named.add(override.key_or_group)
        for option in options:
            try:
                other = settings_of(compose("config", overrides=[
                    *overrides[:i], f"{override.get_key_element()}={option}", *overrides[i + 1:]]))
            except ConfigCompositionException:  # an option the rest cannot go with (+experiment=quick, ablation=X)
                continue
            named |= {key for key in base.keys() | other.keys() if base.get(key) != other.get(key)}
    return named


def settings_to_resume(cfg: DictConfig, saved: DictConfig, defaults: DictConfig,
                       named_on_command_line: Callable[[], set[str]]) -> list[str]:
    """A resumed run is the run it continues: cfg (the command line's composition) takes the run's own settings
    (`saved`, its config.yaml) in place. A setting the command line changes (a key it names, or one that a
    group option or preset moved from `defaults`) stays where RESUME_MAY_CHANGE allows it, returned as
    `key=new (was old)` for the notice line, and is a ConfigError elsewhere. wandb.* (how the run is logged) is
    the command line's where it sets one. Settings newer than the run (absent from its config.yaml) keep the
    command line's. named_on_command_line (named_settings, a composition per option of each group named) is
    called only where a setting differs from the run's: the same command again composes nothing more."""
    now, before, default = settings_of(cfg), settings_of(saved), settings_of(defaults)
    # a setting that follows another (train.lr_decay_steps: ${train.max_steps}) is named when the other is, where the
    # run's own followed it too: a run that fixed its own (to train in pieces) keeps it
    follows = {key: match[1] for key, value in flatten(OmegaConf.to_container(cfg)).items()
               if isinstance(value, str) and (match := re.fullmatch(r"\$\{([\w.]+)\}", value))}

    @functools.cache
    def named() -> set[str]:
        keys = named_on_command_line()
        return keys | {key for key, source in follows.items()
                       if source in keys and before.get(key) == before.get(source)}

    changed = []
    # what the checkpoint is (model.*, data.*) is checked first: a preset names the train.* it sets too, and a
    # refused `model=X` should say that the model differs
    for key, value in sorted(now.items(), key=lambda item: not item[0].startswith(("model.", "data."))):
        if key == "train.resume" or key not in before or value == before[key]:
            continue
        if key.startswith("wandb."):  # how the run is logged, not what it is: the command line's, where it sets one
            if value is None:
                OmegaConf.update(cfg, key, before[key], merge=False)
            continue
        if key == "train.init_from":  # the weights the run started from (resolved); a resume reads its checkpoint
            OmegaConf.update(cfg, key, before[key], merge=False)
            continue
        if (value == default.get(key) or key in follows) and key not in named():
            OmegaConf.update(cfg, key, before[key], merge=False)
        elif key in RESUME_MAY_CHANGE:
            changed.append(f"{key}={value} (was {before[key]})")
        else:
            raise ConfigError(f"{key}={value}: the run being resumed has {key}={before[key]}, and a resumed run keeps "
                              f"what its checkpoint was trained with; leave it out to resume the run, or start a new "
                              f"one in another hydra.run.dir")
    return changed
