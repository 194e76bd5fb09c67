"""The settings' schema, and the one place that composes configs/ outside @hydra.main.

configs/config.yaml lists `schema` first in its defaults, so every YAML file and command-line
override is merged into these dataclasses: a value of the wrong type (train.lr=abc, model.bias=3)
or a key that does not exist is rejected at composition, with the key named. What a type cannot say
(betas in [0, 1), seed >= 0, context_length >= 2, ...) is checked in code: training/config.py for
train.*, model/config.py for model.*.
"""
import sys
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Optional, Union, get_type_hints

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import MISSING, DictConfig
from omegaconf.errors import OmegaConfBaseException

from tasks import SET_SETTINGS, task_setting_names
from errors import ConfigError
from model.config import ModelConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException)  # a bad override, key, value or group option
CLUSTER_LAUNCHERS = ("joblib", "submitit_local", "submitit_slurm")  # Hydra's plugins in pyproject's [cluster] extra


@dataclass
class TrainSettings:  # the meaning of each key: configs/config.yaml
    time_budget: Optional[str] = MISSING  # seconds or "10m", "1h30m": training/budget.py
    max_steps: Optional[int] = MISSING
    batch_size: int = MISSING
    micro_batch_size: Optional[int] = MISSING
    lr: float = MISSING
    min_lr: float = MISSING
    optimizer: str = MISSING  # the optim group's (configs/optim/): adamw or muon (training/optim.py)
    muon_lr: Optional[float] = MISSING  # Muon's peak lr (configs/optim/muon.yaml); null under adamw
    warmup_fraction: float = MISSING
    decay_fraction: Optional[float] = MISSING  # null: the cosine; a share of the run: WSD (training/optim.py)
    lr_decay_steps: Optional[int] = MISSING
    weight_decay: float = MISSING
    betas: tuple[float, float] = MISSING  # AdamW's (beta1, beta2); their range: training/config.py
    grad_clip: float = MISSING
    eval_interval: int = MISSING
    eval_tokens: int = MISSING
    log_interval: int = MISSING
    ckpt_interval: int = MISSING
    sample_interval: int = MISSING
    sample_tokens: int = MISSING
    sample_temperature: float = MISSING
    sample_prompt: str = MISSING
    diagnostics: bool = MISSING
    seed: int = MISSING
    resume: Optional[Union[bool, str]] = MISSING  # true, false, auto; null: auto in a multirun's job, else false
    init_from: Optional[str] = MISSING
    compile: bool = MISSING
    device: str = MISSING
    threads: Optional[int] = MISSING
    reference_tokens_per_s: Optional[float] = MISSING


def model_settings() -> type:
    """model.*'s schema: ModelConfig's fields, types and defaults (llama_tiny's), so that a size is written once,
    less vocab_size (the prepared tokenizer's: data.vocab_size), plus the names of the preset and of the attention
    group (ModelConfig derives its attention from n_kv_heads; the name stays for W&B and compare.py)."""
    types = get_type_hints(ModelConfig)
    own = [(f.name, types[f.name], field(default=f.default)) for f in fields(ModelConfig) if f.name != "vocab_size"]
    return make_dataclass("ModelSettings", [("name", str, field(default=MISSING)),
                                            ("attention", str, field(default=MISSING))] + own)


ModelSettings = model_settings()


def data_settings() -> type:
    """data.*'s schema: configs/data_common.yaml's keys, each corpus's own (configs/data/), and a synthetic task's
    (configs/data/task.yaml): the task, its sets, and each task's own settings, named by its class (tasks/),
    each null unless set (null: the task's default; a level setting takes a value or a list)."""
    own = [(name, Any, field(default=None)) for name in task_setting_names()]
    return make_dataclass("DataSettings", [
        ("name", str, field(default=MISSING)),
        ("source", str, field(default=MISSING)),
        ("vocab_size", Optional[int], field(default=MISSING)),  # null: the vocabulary rule (a task: its own)
        ("val_fraction", float, field(default=MISSING)),
        ("num_proc", int, field(default=MISSING)),
        ("cache_dir", str, field(default=MISSING)),
        ("path", Any, field(default=None)),  # data=text: a file, a glob or a list of them
        ("repo", Optional[str], field(default=None)),  # Hub corpora: the dataset, its revision, its files and split
        ("revision", Optional[str], field(default=None)),
        ("data_files", Optional[dict[str, str]], field(default=None)),
        ("split", Optional[str], field(default=None)),
        ("task", Optional[str], field(default=None))]  # data=task: the task (tasks/), its sets' settings below
        + [(name, Optional[int], field(default=None)) for name in SET_SETTINGS] + own)


DataSettings = data_settings()


@dataclass
class WandbSettings:
    mode: Optional[str] = None
    project: str = MISSING
    group: Optional[str] = None
    name: Optional[str] = None
    dir: Optional[str] = None


@dataclass
class Settings:
    train: TrainSettings = field(default_factory=TrainSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    wandb: WandbSettings = field(default_factory=WandbSettings)
    latest_link: Optional[str] = None  # a symlink to the newest run dir
    variant: Optional[str] = None  # +experiment=ablation: the swapped component's name


ConfigStore.instance().store(name="schema", node=Settings)


def flatten(config: dict, prefix: str = "") -> dict:
    """A nested config (a plain dict) as {"train.lr": 0.001, ...}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def ablation_variants() -> list[str]:
    """The ablation's variants (`+experiment=ablation ablation=<variant>`): a variant is its file in
    configs/ablation/, so adding one is adding its file. The baseline first, the rest by name."""
    return sorted((path.stem for path in (CONFIG_DIR / "ablation").glob("*.yaml")), key=lambda v: (v != "baseline", v))


def compose_config(overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """configs/config.yaml with these command-line overrides, as train.py would see it. A mistyped key or
    value or an unknown group option is a ConfigError of one line; its __cause__ is Hydra's own error."""
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)
    except COMPOSITION_ERRORS as err:
        raise ConfigError(composition_error(err)) from err


def check_command_line(argv: list[str]) -> None:
    """Composes the config from these overrides as @hydra.main will, so that a mistyped key or value,
    an unknown group option (attention=foo) or a launcher that is not installed is one `error:` line and
    exit 2 rather than Hydra's multi-line message and exit 1, before anything is written. With -m, every
    value of every swept key is composed once (see sample_jobs). Hydra's other flags (--cfg, --help, ...)
    are left to Hydra."""
    flags = {arg for arg in argv if arg.startswith("-")}
    if flags - {"-m", "--multirun"}:
        return
    overrides = [arg for arg in argv if not arg.startswith("-")]
    try:
        for job in sample_jobs(overrides) if flags else [overrides]:
            compose_config(job, return_hydra_config=True)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def sample_jobs(overrides: list[str]) -> list[list[str]]:
    """A multirun's overrides as the fewest jobs that give each swept key each of its values: job k takes every
    key's k-th value (or its last). Keys are checked one by one, so these jobs find any value that cannot be
    composed; a glob or an interval, whose values only a sweeper can list, is left to Hydra."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        values = [[f"{o.get_key_element()}={value}" for value in o.sweep_string_iterator()]
                  if o.is_choice_sweep() or o.is_range_sweep() else [o.input_line] for o in parsed]
    except HydraException as err:
        raise ConfigError(composition_error(err)) from err
    return [[choices[min(k, len(choices) - 1)] for choices in values]
            for k in range(max(map(len, values), default=1))]


def composition_error(err: Exception) -> str:
    """A composition error as one line: Hydra's message without its search path, and the schema's reason
    (e.g. "Value 'abc' of type 'str' could not be converted to Float") when there is one."""
    message = str(err).split("Config search path")[0]
    if isinstance(err.__cause__, OmegaConfBaseException):
        message += ": " + str(err.__cause__).splitlines()[0]
    for launcher in CLUSTER_LAUNCHERS:
        if f"Could not find 'hydra/launcher/{launcher}'" in message:
            return f"hydra/launcher={launcher}: its plugin is not installed; pip install -e \".[cluster]\" installs it"
    return " ".join(message.split())
