"""A checkpoint directory: everything needed to rebuild the model and its tokenizer.

    ckpt/config.json         {"format_version": 2, "model": {ModelConfig fields}, "sha256": {file: digest}}
    ckpt/model.safetensors   the state dict (a tied LM head is stored once, as tok_emb.weight)
    ckpt/tokenizer.model     the SentencePiece model the run trained
    ckpt/<extra files>       e.g. train_state.pt, written by training for resume

config.json is written last and holds the sha256 of every other file, so every load proves the
directory is the one that was saved: a flipped byte anywhere is refused, not generated from. A load
also checks the parts against each other before building anything (each tensor's shape against the
config, the tokenizer's size against model.vocab_size) and refuses non-finite weights, which are
never saved either. Each refusal is a CheckpointError naming the file and both values.

A transformers LLaMA directory is read by interop/load.py, which hands this repo's own to load_checkpoint:
resuming or generating from a native checkpoint never imports the transformers mapping.

The directory is written next to its final place and renamed into it, so a kill at any
moment leaves either the previous checkpoint or the new one, never a mix.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load, save
from data.tokenizer import Tokenizer
from errors import ConfigError, UsageError
from model.config import ModelConfig
from model.transformer import Transformer
from storage.files import atomic_dir, sha256, write_bytes, write_json

FORMAT_VERSION = 2


class CheckpointError(UsageError):
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


def run_dir_of(ckpt_dir: Path) -> Path:
    """The run dir that holds a checkpoint dir (ckpt/, or ckpt.old/ after a killed save), else the dir itself."""
    return ckpt_dir.parent if ckpt_dir.name in ("ckpt", "ckpt.old") else ckpt_dir


def non_finite(state: dict[str, torch.Tensor]) -> list[str]:
    return [name for name, t in state.items() if t.is_floating_point() and not t.isfinite().all()]


def save_checkpoint(ckpt_dir: str | Path, model: Transformer, tokenizer_file: str | Path,
                    write_extra: Callable[[Path], None] | None = None) -> Path:
    """Write atomically to ckpt_dir; write_extra(tmp_dir) may add files (e.g. training state).
    Files are written from bytes in memory, so a full disk is an OSError naming the file."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")
    if bad := non_finite(state):
        raise CheckpointError(f"not saving {ckpt_dir}: the model has non-finite weights in {', '.join(bad[:3])}")
    with atomic_dir(ckpt_dir) as tmp:
        write_bytes(tmp / "model.safetensors", save(state))
        write_bytes(tmp / "tokenizer.model", Path(tokenizer_file).read_bytes())
        if write_extra is not None:
            write_extra(tmp)
        digests = {f.name: sha256(f) for f in sorted(tmp.iterdir())}
        write_json(tmp / "config.json", {"format_version": FORMAT_VERSION, "model": model.cfg.to_dict(),
                                         "sha256": digests})
    return Path(ckpt_dir)


def verify_files(ckpt_dir: Path, digests) -> None:
    if not isinstance(digests, dict) or not {"model.safetensors", "tokenizer.model"} <= digests.keys():
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: no sha256 of its files")
    for name, digest in digests.items():
        path = ckpt_dir / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {ckpt_dir} is missing {name}, which its config.json lists")
        if sha256(path) != digest:
            raise CheckpointError(f"checkpoint file {path} does not match the sha256 in its config.json: "
                                  f"it changed or was corrupted after it was saved")


def check_shapes(ckpt_dir: Path, model: Transformer, state: dict[str, torch.Tensor]) -> None:
    expected = model.state_dict()
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(f"weights in {ckpt_dir} do not match its config: "
                              f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, want in expected.items():  # in the model's order: the embedding first
        if state[name].shape != want.shape:
            sizes = ", ".join(f"{k}={getattr(model.cfg, k)}" for k in ("vocab_size", "d_model", "n_layers", "n_heads",
                                                                        "n_kv_heads", "ffn"))
            raise CheckpointError(f"{ckpt_dir}: {name} is {list(state[name].shape)} in model.safetensors but "
                                  f"{list(want.shape)} for the model its config.json describes ({sizes})")


def read_config(ckpt_dir: Path) -> dict:
    """ckpt_dir/config.json: this repo's checkpoint config or a transformers model config ({} for JSON that
    is not an object, which then fails the format_version check by name)."""
    try:
        meta = json.loads((ckpt_dir / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None
    return meta if isinstance(meta, dict) else {}


def check_vocab(cfg: ModelConfig, tokenizer_file: Path) -> Tokenizer:
    """The tokenizer, after checking it has exactly one piece per row of the embedding."""
    try:
        tokenizer = Tokenizer(tokenizer_file)
    except (OSError, RuntimeError) as e:  # what sentencepiece raises for a file it cannot parse
        raise CheckpointError(f"cannot read tokenizer {tokenizer_file}: {e}") from None
    if tokenizer.vocab_size != cfg.vocab_size:
        raise CheckpointError(f"vocab mismatch: the model has vocab_size={cfg.vocab_size} but its tokenizer "
                              f"{tokenizer_file} has {tokenizer.vocab_size} pieces")
    return tokenizer


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Path]:
    """Returns (model in eval mode, ckpt dir). The tokenizer is ckpt_dir / 'tokenizer.model'."""
    ckpt_dir = resolve_ckpt_dir(path)
    meta = read_config(ckpt_dir)
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {ckpt_dir} has format_version={version!r}; "
                              f"this nanollama reads format_version={FORMAT_VERSION}")
    verify_files(ckpt_dir, meta.get("sha256"))
    try:
        cfg = ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ConfigError) as e:
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None
    try:
        check_vocab(cfg, ckpt_dir / "tokenizer.model")
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {ckpt_dir}: {e}") from None
    try:
        state = load((ckpt_dir / "model.safetensors").read_bytes())
    except Exception as e:  # safetensors raises its own error types for truncated or foreign files
        raise CheckpointError(f"corrupt weights {ckpt_dir / 'model.safetensors'}: {e}") from None
    if bad := non_finite(state):
        raise CheckpointError(f"checkpoint {ckpt_dir} has non-finite weights in {', '.join(bad[:3])}")
    model = Transformer(cfg)
    if cfg.tie_embeddings and "tok_emb.weight" in state:
        state["lm_head.weight"] = state["tok_emb.weight"]
    check_shapes(ckpt_dir, model, state)
    model.load_state_dict(state)
    return model.to(device).eval(), ckpt_dir

