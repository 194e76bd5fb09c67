"""Export a LLaMA-configured checkpoint as a transformers LlamaForCausalLM directory or a llama.cpp GGUF file
(with model.qk_norm=rmsnorm: Qwen3ForCausalLM, GGUF architecture qwen3; the other families of interop/families/,
e.g. Mistral for a window, Mixtral for experts, gpt-oss for sink logits, transformers only).

    python export.py --ckpt outputs/<date>/<time> --out llama_hf [--force]
    python export.py --ckpt outputs/<date>/<time> --format gguf --out model.gguf [--dtype f32|f16|q8_0] [--force]

transformers: config.json, model.safetensors, tokenizer.model and, when transformers' LlamaTokenizer
reproduces the SentencePiece ids exactly, tokenizer_config.json (interop/hf.py, interop/tokenizer.py).
gguf: one file with the LLaMA (or Qwen3) metadata, the weights in llama.cpp's layout and the SentencePiece
tokenizer (interop/gguf.py); --dtype f16 or q8_0 shrinks the matrices.
Either is written next to --out and renamed into place, so a failed export (a full disk: one `error: cannot
write --out: ...` line) leaves nothing behind and an existing --out whole. The first line printed is the
checkpoint read, by its real path (not outputs/latest, which the next run moves).

Refused with one error line and exit status 2, before anything is written: a checkpoint using any switch the
format has no counterpart for (model.ffn=relu2, say), naming each such switch; an --out inside a checkpoint dir
(a run's ckpt/, whose next save would delete the export, or any dir of this repo's checkpoint format), or one
holding a checkpoint, which --force never replaces.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save

from cli import Parser
from errors import UsageError
from interop.gguf import DTYPES, write_gguf
from interop.hf import hf_config, hf_state_dict
from interop.tokenizer import hf_tokenizer_config
from interop.load import load_model, loaded_line
from model.transformer import Transformer
from storage.checkpoint import check_vocab
from storage.files import atomic_dir, write_bytes, write_json, writing

# A run's checkpoint dir, and the dirs its save passes through (storage/files.py: atomic_dir): a save replaces them
CHECKPOINT_DIRS = ("ckpt", "ckpt.tmp", "ckpt.old")


def is_checkpoint(folder: Path) -> bool:
    """A dir of this repo's checkpoint format: its config.json has a format_version (transformers' has none)."""
    try:
        return "format_version" in json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError, TypeError):  # no config.json, or not one of ours
        return False


def check_out(out: Path, fmt: str, force: bool) -> None:
    """Refuses an --out that would lose what it replaces, before anything is read: a training checkpoint, or a
    place inside one (the run's next save replaces its checkpoint dir whole, the export with it), which --force
    never overrides; an existing file or non-empty dir without --force; the wrong kind for the format."""
    real = out.resolve()
    for folder in (real, *real.parents):
        if is_checkpoint(folder) or folder.name in CHECKPOINT_DIRS and (folder.parent / "config.yaml").is_file():
            where = "is" if folder == real else "is inside"
            raise UsageError(f"--out {out} {where} the checkpoint dir {folder}: a run's next save replaces that dir "
                             f"whole, and --force never replaces a checkpoint; choose an --out outside it")
    if real.is_dir() and (held := next((c.parent for c in real.rglob("config.json") if is_checkpoint(c.parent)), None)):
        raise UsageError(f"--out {out} holds the checkpoint {held}, which --force never replaces; choose another --out")
    if fmt == "gguf":
        if out.is_dir():
            raise UsageError(f"--out {out} is a directory; --format gguf writes one file")
        if out.exists() and not force:
            raise UsageError(f"--out {out} exists; pass --force to replace it")
    else:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} exists and is not a directory")
        if out.is_dir() and any(out.iterdir()) and not force:
            raise UsageError(f"--out {out} exists and is not empty; pass --force to replace it")


def export_transformers(model: Transformer, ckpt_dir: Path, out: Path) -> list[str]:
    """Writes the transformers directory; returns notes for the user (what could not be made faithful)."""
    tokenizer_file = ckpt_dir / "tokenizer.model"
    tokenizer = check_vocab(model.cfg, tokenizer_file)
    bos, eos = (i if i >= 0 else None for i in (tokenizer.bos_id, tokenizer.eos_id))  # SentencePiece says -1 for none
    config = hf_config(model.cfg, bos_id=bos, eos_id=eos)  # refuses switches with no counterpart, naming them all
    tokenizer_config, why_not = hf_tokenizer_config(tokenizer_file, model.cfg.context_length)
    tokenizer_bytes = tokenizer_file.read_bytes()
    with writing(out), atomic_dir(out) as tmp:
        write_json(tmp / "config.json", config)
        # transformers refuses safetensors files whose metadata does not say they hold torch tensors; written
        # as bytes, the file gets the mode of the others (safetensors' own writer makes it 0600)
        write_bytes(tmp / "model.safetensors", save(hf_state_dict(model), metadata={"format": "pt"}))
        write_bytes(tmp / "tokenizer.model", tokenizer_bytes)
        if tokenizer_config is not None:
            write_json(tmp / "tokenizer_config.json", tokenizer_config)
    return [] if tokenizer_config is not None else [f"no tokenizer_config.json: {why_not}"]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", required=True, help="a run dir (holding ckpt/) or a checkpoint dir")
    parser.add_argument("--out", required=True, help="the transformers directory or the .gguf file to write")
    parser.add_argument("--format", choices=("transformers", "gguf"), default="transformers")
    parser.add_argument("--dtype", choices=tuple(DTYPES), help="gguf only: the matrices' type (default f32)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists (and is not empty)")
    try:
        args = parser.parse_args(argv)
        if args.dtype is not None and args.format != "gguf":
            raise UsageError(f"--dtype={args.dtype} applies to --format gguf only; transformers' export is float32")
        out = Path(args.out)
        check_out(out, args.format, args.force)
        # read through the real path: a new run that moves outputs/latest meanwhile does not change what is exported
        model, ckpt_dir = load_model(Path(args.ckpt).resolve())  # checks the tokenizer against the vocab size too
        print(loaded_line(ckpt_dir), flush=True)
        if args.format == "gguf":
            notes = write_gguf(model, ckpt_dir / "tokenizer.model", out, args.dtype or "f32")
            how = (f"run it with llama.cpp: llama-completion -m {args.out}, "
                   f"or llama_cpp.Llama(model_path={str(args.out)!r})")
        else:
            notes = export_transformers(model, ckpt_dir, out)
            how = f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(args.out)!r})"
    except UsageError as e:  # a write that fails too (a full disk): an existing --out is kept whole
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {args.out}: {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
