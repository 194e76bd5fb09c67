"""Runs grouped into variants (seeds of one config, in one sweep), and each variant's name."""
import functools
import json
import os
from collections import Counter
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from errors import UsageError
from settings import CONFIG_DIR, compose_config, flatten
from study.runs import NOT_COMPARED, SEED, Run, Variant, sweep_of


def variant_key(run: Run, ignored: tuple[str, ...]) -> str:
    """What makes a variant: the run's sweep and its settings, less NOT_COMPARED and the `ignored` keys."""
    flat = {k: v for k, v in flatten(run.config).items() if not k.startswith(NOT_COMPARED)}
    if "train.lr" in ignored and flat.get("train.muon_lr") is not None:
        # a sweep's Muon lr moves with train.lr (optim=muon's default): the variant is their ratio, not the value
        flat["train.muon_lr"] = flat["train.muon_lr"] / flat["train.lr"]
    for key in ignored:
        flat.pop(key, None)
    return json.dumps([str(sweep_of(run.path)), flat], sort_keys=True, default=str) if run.config else str(run.path)


def group_runs(runs: list[Run], ignored: tuple[str, ...] = SEED) -> list[Variant]:
    """Runs of one sweep (or runs of their own) whose configs are equal apart from the `ignored` keys (and
    NOT_COMPARED) form one variant."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(variant_key(run, ignored), []).append(run)
    return [Variant(name, group) for name, group in zip(variant_names(list(groups.values()), ignored), groups.values())]


def variant_names(groups: list[list[Run]], ignored: tuple[str, ...]) -> list[str]:
    """Each variant's name: its config's `variant` key, else the settings in which it differs from what most
    variants have (a setting they split on evenly names every variant), written as the overrides of its preset that
    give them where its config names one (`ffn=moe`, `model=moe_tiny`; its preset's name when it has none: see
    overrides_name), else where its runs are (its sweep dir, or its run dir). A name that several variants share
    (two sweeps of one config) gets where each is added."""
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
    owns = [{key: flat.get(key) for key in differing if json.dumps(flat.get(key), default=str) != usual.get(key)}
            for flat in flats]
    names = [group[0].config.get("variant") or overrides_name(flat, own)
             or ", ".join(f"{key}={value}" for key, value in own.items())
             for group, flat, own in zip(groups, flats, owns)]
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


def overrides_name(flat: dict, own: dict) -> str | None:
    """The variant's own settings (`own`, of its flat config) as the command line that gives them: `model=<preset>`
    where its preset differs from the others', then a config group's option (`ffn=moe`) for each own setting that
    one names, then `key=value` for each own setting that none of these gives (the composed config decides which). A
    variant whose own settings its preset gives is its preset alone, named by it (`llama_tiny`, `moe_tiny`); a
    config that names no preset of configs/model/ (an older run's) has no such name: None."""
    preset = flat.get("model.name")
    if not isinstance(preset, str) or not (CONFIG_DIR / "model" / f"{preset}.yaml").is_file():
        return None
    overrides = [f"model={preset}"]
    rest = unexplained(own, overrides)
    overrides += [f"{key.split('.')[-1]}={value}" for key, value in rest.items()
                  if (CONFIG_DIR / key.split(".")[-1] / f"{value}.yaml").is_file()]
    rest = unexplained(rest, overrides)
    given = {key: f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in rest.items()}
    # a setting that follows from another one (train.muon_lr from train.lr) is not an override of its own
    given = {key: override for key, override in given.items()
             if unexplained({key: rest[key]}, [*overrides, *(o for k, o in given.items() if k != key)])}
    if overrides == [f"model={preset}"] and not given:  # the preset alone
        return preset
    return ", ".join([*(o for o in overrides if o != f"model={preset}" or "model.name" in own), *given.values()])


def unexplained(settings: dict, overrides: list[str]) -> dict:
    """The settings that the config composed from these overrides does not have (all of them where it cannot be
    composed: a run of a group option since removed)."""
    try:
        config = composed(tuple(overrides))
    except UsageError:
        return settings
    return {key: value for key, value in settings.items() if not composes_to(config, key, value)}


@functools.cache
def composed(overrides: tuple[str, ...]) -> DictConfig:
    """compose_config's config, composed once per process: naming the variants and weighing their speeds ask for
    the same few many times."""
    return compose_config(list(overrides))


def composes_to(composed: DictConfig, key: str, value) -> bool:
    try:
        found = OmegaConf.select(composed, key)  # an interpolation resolved, as the run's config.yaml holds it
    except OmegaConfBaseException:  # one that only a running Hydra resolves
        return False
    if isinstance(found, (DictConfig, ListConfig)):
        found = OmegaConf.to_container(found, resolve=True)
    return json.dumps(found, default=str) == json.dumps(value, default=str)


def default_baseline(variants: list[Variant]) -> str:
    """The variant the others are compared with when --baseline names none: the ablation's `baseline`, else the line
    with no switch from its preset, named by its preset (overrides_name). Of several such lines (presets side by
    side, or one preset's switches beside another preset's run), the one whose preset the most lines train: the
    others are switches of it; of a tie, configs/config.yaml's own preset where it is one, else the first found.
    Else `baseline` (no such variant: the table says which there are)."""
    presets = Counter(v.runs[0].config.get("model", {}).get("name") for v in variants if v.runs)
    alone = [v.name for v in variants if v.runs and v.name == v.runs[0].config.get("model", {}).get("name")]
    if "baseline" in {v.name for v in variants} or not alone:
        return "baseline"
    most = [name for name in alone if presets[name] == max(presets[name] for name in alone)]
    if len(most) == 1:
        return most[0]
    return default if (default := compose_config([]).model.name) in most else most[0]
