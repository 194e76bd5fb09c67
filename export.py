"""Export a LLaMA-configured checkpoint as a transformers LlamaForCausalLM directory or a llama.cpp GGUF file
(with model.qk_norm=rmsnorm: Qwen3ForCausalLM, GGUF architecture qwen3).

    python export.py --ckpt outputs/<date>/<time> --out llama_hf [--force]
    python export.py --ckpt outputs/<date>/<time> --format gguf --out model.gguf [--dtype f32|f16|q8_0] [--force]

transformers: config.json, model.safetensors, tokenizer.model and, when transformers' LlamaTokenizer
reproduces the SentencePiece ids exactly, tokenizer_config.json (interop/hf_llama.py).
gguf: one file with the LLaMA (or Qwen3) metadata, the weights in llama.cpp's layout and the SentencePiece
tokenizer (interop/gguf_llama.py); --dtype f16 or q8_0 shrinks the matrices.
Either is written next to --out and renamed into place, so a failed export leaves nothing behind and
an existing --out whole. A checkpoint using any switch the format has no counterpart for (model.ffn=relu2, say)
is refused with one error line and exit status 2, naming each such switch.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from safetensors.torch import save

from cli import Parser
from errors import UsageError
from interop.gguf_llama import DTYPES, write_gguf
from interop.hf_llama import hf_config, hf_state_dict, hf_tokenizer_config
from interop.load import load_model
from storage.checkpoint import check_vocab
from storage.files import atomic_dir, write_bytes, write_json


def export_transformers(ckpt: str | Path, out: str | Path, force: bool = False) -> list[str]:
    """Writes the transformers directory; returns notes for the user (what could not be made faithful)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out} exists and is not empty; pass --force to replace it")
    model, ckpt_dir = load_model(ckpt)
    tokenizer_file = ckpt_dir / "tokenizer.model"
    tokenizer = check_vocab(model.cfg, tokenizer_file)
    bos, eos = (i if i >= 0 else None for i in (tokenizer.bos_id, tokenizer.eos_id))  # SentencePiece says -1 for none
    config = hf_config(model.cfg, bos_id=bos, eos_id=eos)  # refuses switches with no counterpart, naming them all
    tokenizer_config, why_not = hf_tokenizer_config(tokenizer_file, model.cfg.context_length)
    with atomic_dir(out) as tmp:
        write_json(tmp / "config.json", config)
        # transformers refuses safetensors files whose metadata does not say they hold torch tensors; written
        # as bytes, the file gets the mode of the others (safetensors' own writer makes it 0600)
        write_bytes(tmp / "model.safetensors", save(hf_state_dict(model), metadata={"format": "pt"}))
        shutil.copyfile(tokenizer_file, tmp / "tokenizer.model")
        if tokenizer_config is not None:
            write_json(tmp / "tokenizer_config.json", tokenizer_config)
    return [] if tokenizer_config is not None else [f"no tokenizer_config.json: {why_not}"]


def export_gguf(ckpt: str | Path, out: str | Path, dtype: str = "f32", force: bool = False) -> list[str]:
    """Writes the GGUF file; returns notes for the user (tensors kept wider than dtype, tokenizer caveats)."""
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; --format gguf writes one file")
    if out.exists() and not force:
        raise UsageError(f"--out {out} exists; pass --force to replace it")
    model, ckpt_dir = load_model(ckpt)  # checks the tokenizer against the vocab size too
    return write_gguf(model, ckpt_dir / "tokenizer.model", out, dtype)  # refuses what has no counterpart, naming all


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
        if args.format == "gguf":
            notes = export_gguf(args.ckpt, args.out, args.dtype or "f32", args.force)
            how = (f"run it with llama.cpp: llama-completion -m {args.out}, "
                   f"or llama_cpp.Llama(model_path={str(args.out)!r})")
        else:
            notes = export_transformers(args.ckpt, args.out, args.force)
            how = f"load it with transformers.AutoModelForCausalLM.from_pretrained({str(args.out)!r})"
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {args.out}: {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
