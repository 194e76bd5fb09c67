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

The directory is written next to its final place and renamed into it, so a kill at any moment leaves either the
previous checkpoint or the new one, never a mix. A reader beside a run that saves (generate.py on outputs/latest
during training, a fine-tune's train.init_from) gets one save whole too: it reads config.json and every file that
lists once, into memory, through one open handle on the directory (read_save), so each file is of the save that
config.json describes even if a save renames the directory to ckpt.old meanwhile. A save that removes the directory
under the reader makes it read again from the start, one between its two renames is waited out (each a bounded
number of times), and only a checkpoint still in place that still misses a file is reported as missing.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sentencepiece as spm
import torch
from safetensors.torch import load, save

from data.tokenizer import Tokenizer
from errors import ConfigError, UsageError
from model.config import ModelConfig
from model.transformer import Transformer
from storage.files import atomic_dir, sha256, write_bytes, write_json

FORMAT_VERSION = 2
READ_ATTEMPTS = 20  # reads of a checkpoint that saves keep replacing under the reader, before it gives up
RENAME_WAIT_S = 0.005  # a reader that finds a save between its two renames waits this long before looking again


class CheckpointError(UsageError):
    """A checkpoint that is missing, corrupt or of another format; the message says which."""


def resolve_ckpt_dir(path: str | Path) -> Path:
    """Accept a run dir (holding ckpt/) or a ckpt dir itself. A save caught between its two renames, when neither
    name holds a checkpoint for an instant, is waited out (a bounded number of times)."""
    path = Path(path)
    for _ in range(READ_ATTEMPTS):
        saving = save_in_flight(path)  # before looking and after: a save may also start or end while we look
        for candidate in (path / "ckpt", path):
            if (candidate / "config.json").is_file():
                return candidate
            # a save killed between its two renames leaves only the previous checkpoint, as .old
            old = candidate.with_name(candidate.name + ".old")
            if (old / "config.json").is_file() and not candidate.exists():
                return old
        if not (saving or save_in_flight(path)):
            break
        time.sleep(RENAME_WAIT_S)
    raise CheckpointError(f"no checkpoint at {path}: expected {path}/config.json or {path}/ckpt/config.json")


def save_in_flight(path: Path) -> bool:
    """Whether a save is under way at `path`: atomic_dir's .tmp or .old beside its checkpoint dir."""
    return any(d.with_name(d.name + suffix).exists() for d in (path / "ckpt", path) for suffix in (".tmp", ".old"))


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


def verify_files(ckpt_dir: Path, files: dict[str, bytes], digests: dict) -> None:
    for name, digest in digests.items():
        if hashlib.sha256(files[name]).hexdigest() != digest:
            raise CheckpointError(f"checkpoint file {ckpt_dir / name} does not match the sha256 in its config.json: "
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


def read_config(path: str | Path) -> tuple[dict, Path]:
    """The config.json of the checkpoint at `path` (a run dir or a checkpoint dir), and the dir it was read in: this
    repo's checkpoint config or a transformers model config ({} for JSON that is not an object, which then fails the
    format_version check by name)."""
    for attempt in range(READ_ATTEMPTS):
        ckpt_dir = resolve_ckpt_dir(path)
        try:
            return parse_config(ckpt_dir, (ckpt_dir / "config.json").read_bytes()), ckpt_dir
        except OSError as e:
            # gone since it was found: a save renamed the dir, or removed the ckpt.old found, in between; look again
            if not isinstance(e, FileNotFoundError) or attempt == READ_ATTEMPTS - 1:
                raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None


def parse_config(ckpt_dir: Path, content: bytes) -> dict:
    try:
        meta = json.loads(content.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None
    return meta if isinstance(meta, dict) else {}


def read_at(dir_fd: int, name: str) -> bytes:
    """A file of the directory that dir_fd holds open, whatever that directory is called by now."""
    with open(os.open(name, os.O_RDONLY, dir_fd=dir_fd), "rb") as f:
        return f.read()


def still_in_place(path: Path, ckpt_dir: Path, dir_fd: int) -> bool:
    """Whether the directory read through dir_fd is still the checkpoint at `path` (not one a save has replaced).
    The open handle keeps its inode from being reused, so equal inodes are the same directory."""
    try:
        return resolve_ckpt_dir(path) == ckpt_dir and os.path.samestat(os.stat(ckpt_dir), os.fstat(dir_fd))
    except (CheckpointError, OSError):
        return False


def read_save(path: str | Path) -> tuple[Path, dict, dict[str, bytes]]:
    """(ckpt dir, its config.json, the bytes of every file config.json lists) of one save, whole, its format
    and sha256 digests checked: see the module's docstring for a save that happens meanwhile."""
    path = Path(path)
    for _ in range(READ_ATTEMPTS):
        ckpt_dir = resolve_ckpt_dir(path)
        try:
            dir_fd = os.open(ckpt_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # renamed away by a save since
            continue
        try:
            meta = parse_config(ckpt_dir, read_at(dir_fd, "config.json"))
            version = meta.get("format_version")
            if version != FORMAT_VERSION:
                raise CheckpointError(f"checkpoint {ckpt_dir} has format_version={version!r}; "
                                      f"this nanollama reads format_version={FORMAT_VERSION}")
            digests = meta.get("sha256")
            if not isinstance(digests, dict) or not {"model.safetensors", "tokenizer.model"} <= digests.keys():
                raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: no sha256 of its files")
            files = {name: read_at(dir_fd, name) for name in digests}
        except FileNotFoundError as e:  # removed by a save that replaced it, or really missing
            if still_in_place(path, ckpt_dir, dir_fd) and e.filename != "config.json":
                raise CheckpointError(f"checkpoint {ckpt_dir} is missing {e.filename}, which its config.json "
                                      f"lists") from None
            continue
        finally:
            os.close(dir_fd)
        verify_files(ckpt_dir, files, digests)
        return ckpt_dir, meta, files
    raise CheckpointError(f"checkpoint {path} was replaced by new saves {READ_ATTEMPTS} times while it was read; "
                          f"try again, or save less often (train.ckpt_interval)")


def check_vocab(cfg: ModelConfig, tokenizer_file: Path) -> Tokenizer:
    """The tokenizer, after checking it has exactly one piece per row of the embedding. One that a save took away
    (for the instant of its two renames, or with the ckpt.old/ the model was read from) is read from where the
    checkpoint is once the save is done: a run's saves all hold the same tokenizer."""
    tokenizer_file = Path(tokenizer_file)
    for attempt in range(READ_ATTEMPTS):
        try:
            tokenizer = Tokenizer(tokenizer_file)
            break
        except (OSError, RuntimeError) as e:  # what sentencepiece raises for a file it cannot find or parse
            # by the error, not by looking again: the next save may have put the file back since
            missing = isinstance(e, FileNotFoundError) or str(e).startswith("NOT_FOUND")
            if not missing or attempt == READ_ATTEMPTS - 1:
                raise CheckpointError(f"cannot read tokenizer {tokenizer_file}: {e}") from None
            time.sleep(RENAME_WAIT_S)
            try:
                tokenizer_file = resolve_ckpt_dir(run_dir_of(tokenizer_file.parent)) / tokenizer_file.name
            except CheckpointError:  # no checkpoint there for now: the next attempt looks again
                pass
    check_pieces(cfg, tokenizer_file, tokenizer.vocab_size)
    return tokenizer


def check_pieces(cfg: ModelConfig, tokenizer_file: Path, pieces: int) -> None:
    if pieces != cfg.vocab_size:
        raise CheckpointError(f"vocab mismatch: the model has vocab_size={cfg.vocab_size} but its tokenizer "
                              f"{tokenizer_file} has {pieces} pieces")


@dataclass
class Checkpoint:
    """One save of a checkpoint dir, read whole (read_checkpoint)."""
    dir: Path  # where it was read: ckpt/, or ckpt.old/ after a save killed between its renames
    model: Transformer  # in eval mode
    files: dict[str, bytes]  # every file its config.json lists (tokenizer.model, train_state.pt, ...), verified


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Path]:
    """Returns (model in eval mode, ckpt dir). The tokenizer is ckpt_dir / 'tokenizer.model'."""
    checkpoint = read_checkpoint(path, device)
    return checkpoint.model, checkpoint.dir


def read_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """The model of the checkpoint at `path` (a run dir or a ckpt dir) and its files, of one save."""
    ckpt_dir, meta, files = read_save(path)
    try:
        cfg = ModelConfig.from_dict(meta["model"])
    except (KeyError, TypeError, ConfigError) as e:
        raise CheckpointError(f"corrupt checkpoint config {ckpt_dir / 'config.json'}: {e}") from None
    tokenizer_file = ckpt_dir / "tokenizer.model"
    try:
        check_pieces(cfg, tokenizer_file, spm.SentencePieceProcessor(model_proto=files["tokenizer.model"]).vocab_size())
    except RuntimeError as e:  # what sentencepiece raises for bytes it cannot parse
        raise CheckpointError(f"checkpoint {ckpt_dir}: cannot read tokenizer {tokenizer_file}: {e}") from None
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {ckpt_dir}: {e}") from None
    try:
        state = load(files["model.safetensors"])
    except Exception as e:  # safetensors raises its own error types for truncated or foreign files
        raise CheckpointError(f"corrupt weights {ckpt_dir / 'model.safetensors'}: {e}") from None
    if bad := non_finite(state):
        raise CheckpointError(f"checkpoint {ckpt_dir} has non-finite weights in {', '.join(bad[:3])}")
    model = Transformer(cfg)
    if cfg.tie_embeddings and "tok_emb.weight" in state:
        state["lm_head.weight"] = state["tok_emb.weight"]
    check_shapes(ckpt_dir, model, state)
    model.load_state_dict(state)
    return Checkpoint(ckpt_dir, model.to(device).eval(), files)
