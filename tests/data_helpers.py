"""Shared by the data tests: the real configs/data/*.yaml, composed by Hydra, as plain dicts."""
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def data_settings(name: str, cache_dir, **changes) -> dict:
    """configs/data/<name>.yaml with data.cache_dir=cache_dir and `changes` applied."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        data = compose(config_name="config", overrides=[f"data={name}"]).data
    settings = OmegaConf.to_container(data, resolve=True)
    settings.update(cache_dir=str(cache_dir), **changes)
    return settings


def documents(stream, tokenizer) -> list[str]:
    """A token stream cut at its BOS/EOS marks back into decoded documents."""
    starts = np.flatnonzero(stream == tokenizer.bos_id)
    ends = np.flatnonzero(stream == tokenizer.eos_id)
    assert len(starts) == len(ends) and starts[0] == 0 and ends[-1] == len(stream) - 1
    return [tokenizer.decode(stream[s + 1 : e]) for s, e in zip(starts, ends)]
