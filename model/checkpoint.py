"""A checkpoint directory: everything needed to rebuild the model and its tokenizer.

    ckpt/config.json         {"format_version": 1, "model": {ModelConfig fields}}
    ckpt/model.safetensors   the state dict (a tied LM head is stored once, as tok_emb.weight)
    ckpt/tokenizer.model     the SentencePiece model the run trained
    ckpt/<extra files>       e.g. train_state.pt, written by training for resume

load_checkpoint also reads a transformers LLaMA directory (config.json with model_type "llama",
model.safetensors or its shards, tokenizer.model), through model/hf_interop.py.

The directory is written next to its final place and renamed into it, so a kill at any
moment leaves either the previous checkpoint or the new one, never a mix.
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import load_file, save_file

from model.config import ConfigError, ModelConfig
from model.hf_interop import InteropError, check_vocab, load_hf_state_dict, model_config_from_hf, read_hf_weights
from model.transformer import Transformer

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt or of another format; the message says which."""


def resolve_ckpt_dir(path: str | Path) -> Path:
    """Accept a run dir (holding ckpt/) or a ckpt dir itself."""
    path = Path(path)
    for candidate in (path / "ckpt", path):
        if (candidate / "config.json").is_file():
            return candidate
        # a save killed between its two renames leaves only the previous checkpoint, as .old
        old = candidate.with_name(candidate.name + ".old")
        if (old / "config.json").is_file() and not candidate.exists():
            return old
    raise CheckpointError(f"no checkpoint at {path}: expected {path}/config.json or {path}/ckpt/config.json")


@contextmanager
def atomic_dir(final_dir: str | Path) -> Iterator[Path]:
    """Yields an empty sibling directory to fill; when the block succeeds it replaces final_dir."""
    final_dir = Path(final_dir)
    tmp, old = final_dir.with_name(final_dir.name + ".tmp"), final_dir.with_name(final_dir.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final_dir.exists():
        shutil.rmtree(old, ignore_errors=True)
        final_dir.rename(old)
    tmp.rename(final_dir)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(ckpt_dir: str | Path, model: Transformer, tokenizer_file: str | Path,
                    write_extra: Callable[[Path], None] | None = None) -> Path:
    """Write atomically to ckpt_dir; write_extra(tmp_dir) may add files (e.g. training state)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")
    with atomic_dir(ckpt_dir) as tmp:
        save_file(state, tmp / "model.safetensors")
        shutil.copyfile(tokenizer_file, tmp / "tokenizer.model")
        if write_extra is not None:
            write_extra(tmp)
        (tmp / "config.json").write_text(json.dumps({"format_version": FORMAT_VERSION,
                                                     "model": model.cfg.to_dict()}, indent=2))
    return Path(ckpt_dir)


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Path]:
    """Returns (model in eval mode, ckpt dir). The tokenizer is ckpt_dir / 'tokenizer.model'.
    ckpt dir may also be a transformers LLaMA directory."""
    ckpt_dir = resolve_ckpt_dir(path)
    try:
        meta = json.loads((ckpt_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None
    if isinstance(meta, dict) and "model_type" in meta:
        return _load_transformers_dir(ckpt_dir, meta, device), ckpt_dir
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {ckpt_dir} has format_version={version!r}; "
                              f"this nanollama reads format_version={FORMAT_VERSION}")
    try:
        cfg = ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ConfigError) as e:
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None
    model = Transformer(cfg)
    try:
        state = load_file(ckpt_dir / "model.safetensors", device=str(device))
    except Exception as e:  # safetensors raises its own error types for truncated or foreign files
        raise CheckpointError(f"corrupt weights {ckpt_dir / 'model.safetensors'}: {e}") from None
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"weights in {ckpt_dir} do not match its config: "
                              f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    if not (ckpt_dir / "tokenizer.model").is_file():
        raise CheckpointError(f"checkpoint {ckpt_dir} has no tokenizer.model")
    return model.to(device).eval(), ckpt_dir


def _load_transformers_dir(hf_dir: Path, config: dict, device: str | torch.device) -> Transformer:
    if not (hf_dir / "tokenizer.model").is_file():
        raise CheckpointError(f"transformers directory {hf_dir} has no tokenizer.model (the SentencePiece model)")
    try:
        cfg = model_config_from_hf(config)
        check_vocab(cfg, hf_dir / "tokenizer.model")
        model = Transformer(cfg)
        load_hf_state_dict(model, read_hf_weights(hf_dir))
    except (InteropError, ConfigError) as e:
        raise CheckpointError(f"transformers directory {hf_dir}: {e}") from None
    return model.to(device).eval()
