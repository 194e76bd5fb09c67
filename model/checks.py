"""Small value checks that ModelConfig and the kinds' own validate share (model/config.py, model/moe.py)."""
from errors import ConfigError


def is_number(value) -> bool:
    """An int or a float, not a bool (YAML's true is an int to Python)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value, least: int = 1) -> bool:
    """An int of at least `least`, not a bool (a size, a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def refuse_set(cfg, keys, owner: str, absent: str) -> None:
    """A kind not chosen: each of its settings `keys` left unset, else a ConfigError naming the first one set, whose
    kind it is (owner) and what this model lacks for it (absent)."""
    for key in keys:
        if getattr(cfg, key) is not None:
            raise ConfigError(f"model.{key}={getattr(cfg, key)!r} is a setting of {owner}, but this model has {absent}")
