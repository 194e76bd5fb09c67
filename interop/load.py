"""A model from a directory of either kind: this repo's checkpoint (storage/checkpoint.py) or a transformers
directory of one of the families (interop/hf.py, interop/families/), told apart by config.json (transformers' names
a model_type, ours a format_version). The mapping is imported only for a transformers directory, so loading a native
checkpoint never imports it."""
from __future__ import annotations

from pathlib import Path

import torch

from model.transformer import Transformer
from storage.checkpoint import load_checkpoint, read_config, run_dir_of


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Path]:
    """Returns (model in eval mode, its dir); the tokenizer is dir / 'tokenizer.model'. `path` may be a run dir
    (holding ckpt/), a checkpoint dir or a transformers directory of one of the families."""
    config, ckpt_dir = read_config(path)
    if "model_type" in config:
        from interop.hf import load_transformers_dir  # here, not above: only this kind of dir needs it
        return load_transformers_dir(ckpt_dir, config, device), ckpt_dir
    return load_checkpoint(path, device)  # from `path` again: a save that replaces ckpt/ meanwhile is retried whole


def loaded_line(ckpt_dir: Path) -> str:
    """What a script prints of the model it loaded: its run dir's real path, not the link it was reached by
    (outputs/latest moves with the next run, so its name does not say which run was read)."""
    return f"checkpoint: {run_dir_of(Path(ckpt_dir)).resolve()}"
