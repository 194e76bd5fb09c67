"""See inside a checkpoint: the chapter's demos (the KV cache, MHA / GQA / MQA, RoPE, the norms, the FFN) and
QK-norm's effect on the attention logits, measured on your own trained model, in one self-contained page and,
with --wandb, in the run's W&B run.

    python report.py --ckpt outputs/latest                               # writes outputs/latest/report/
    python report.py --ckpt runs/default --ckpt runs/post --out docs/report   # side by side, labelled by what differs
    python report.py --ckpt outputs/latest --prompt "JULIET:" --wandb    # also to the checkpoint's W&B run

DIR (--out, default: the first checkpoint's run dir / report) gets index.html (figures embedded, nothing fetched:
open it from disk), every figure as a PNG, and report.json with every number the figures and tables show.
The measurements are in insight/ (one module per part of the chapter); docs/report.md explains each section.
Bad input (a missing or corrupt checkpoint, an empty --prompt or one longer than a model's context, checkpoints
of different vocabularies, --wandb on a checkpoint without a W&B run, an --out that is not a report) is one
`error: ...` line and exit 2, before anything is written. Then each checkpoint's run dir is printed by its real
path (outputs/latest's target, not the link, which the next run moves), and the report is written beside DIR and
renamed into place: a write that fails (a full disk) is one `error: cannot write DIR: <reason>` line, exit 2, and
an earlier report in DIR is kept whole.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from cli import Parser, run_command
from data.tokenizer import Tokenizer
from errors import UsageError
from generation.kv_memory import BYTES_PER_ELEMENT, estimated_bytes, linear_layers
from insight import attention, blocks, decode, experts, figures, lengths, page, positions
from model.attention import Attention
from model.block import attention_class
from model.gated_deltanet import GatedDeltaNet
from model.mla import LatentAttention
from insight.wandb_run import log_to_wandb, run_name, wandb_run_of
from model.transformer import Transformer
from interop.load import load_model, loaded_line
from storage.checkpoint import CheckpointError, check_vocab, run_dir_of
from storage.files import atomic_dir, write_bytes, write_json, writing

DEFAULT_PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?"


def preset(name: str, kind, widths: tuple[int, ...], layers: int, seq: int, dtype: str, window: int = 0,
           local_layers: int = 0, linear_layers: int = 0) -> tuple[dict, type]:
    """One of the estimator's presets, with its attention kind: a model's sizes and its cache's widths, in the order
    the kind's PER_POSITION names them (window 0: none; linear_layers: those with a fixed state)."""
    widths = dict(zip((field.name for field in kind.PER_POSITION.fields), widths, strict=True))
    return {"name": name, "cache": kind.PER_POSITION.name, "layers": layers, **widths, "seq": seq, "batch": 1,
            "dtype": dtype, "window": window, "local_layers": local_layers, "linear_layers": linear_layers}, kind


LLAMA_2_7B = preset("LLaMA-2-7B", Attention, (32, 128), 32, 4096, "fp16")
# Mistral-7B-v0.1 at its full 32,768 positions: every layer a 4,096-position window, an eighth of the positions held
MISTRAL_7B = preset("Mistral-7B", Attention, (8, 128), 32, 32768, "fp16", window=4096, local_layers=32)
# the chapter's fourth row: LLaMA-2-7B's layers and context with DeepSeek's latent (512) and RoPE key (64); and
# DeepSeek-V3's own 61 layers (70,272 bytes per token at bf16)
LATENT_PRESETS = [preset("LLaMA-2-7B with MLA", LatentAttention, (512, 64), 32, 4096, "fp16"),
                  preset("DeepSeek-V3", LatentAttention, (512, 64), 61, 4096, "bf16")]
# transformers' Qwen3NextConfig: 48 layers, every 4th attention (2 K/V heads of 256), the others Gated DeltaNet (16 key
# and 32 value heads of 128, a conv of 4), at its 32,768 positions
QWEN3_NEXT = preset("Qwen3-Next (3:1)", GatedDeltaNet, (2, 256, 32, 16, 128, 3), 48, 32768, "bf16", linear_layers=36)
# Qwen3-Next's cache against the context, as it is and with every layer of one kind: its 12 attention layers' K and V
# grow with the context, its 36 linear layers' states do not (the KV section's second figure)
BY_CONTEXT = {"Qwen3-Next (3:1)": 36, "all linear": 48, "all full attention": 0}
CONTEXTS = [2 ** n for n in range(10, 18)]  # 1k .. 128k positions
REPORT_FILE = "report.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(description="Measure the chapter's demos on nanollama checkpoints: an HTML page, PNGs, JSON.")
    parser.add_argument("--ckpt", action="append", required=True,
                        help="a run dir or its ckpt/ dir; repeat it to compare checkpoints side by side")
    parser.add_argument("--prompt", help="text after BOS, read by every checkpoint (default "
                        f"{DEFAULT_PROMPT!r}, its first tokens where a model's context holds fewer)")
    parser.add_argument("--out", help="the report's folder (default: the first checkpoint's run dir / report)")
    parser.add_argument("--wandb", action="store_true", help="also log the figures and tables to each checkpoint's "
                        "W&B run (mode: $WANDB_MODE, else online with a login, else offline)")
    return parser.parse_args(argv)


def load(path: str) -> tuple[Transformer, Path, Tokenizer]:
    """The model, its dir and tokenizer, read through the real path: the report (its default --out included)
    stays with the run it measured while a new run moves outputs/latest."""
    try:
        model, ckpt_dir = load_model(Path(path).resolve())
        tokenizer = check_vocab(model.cfg, ckpt_dir / "tokenizer.model")
    except CheckpointError as e:
        raise UsageError(f"--ckpt {path}: {e}") from None
    return model, ckpt_dir, tokenizer


def pieces(tokenizer: Tokenizer) -> list[str]:
    return [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]


def one_vocabulary(tokenizers: list[Tokenizer], paths: list[str]) -> list[str]:
    """The checkpoints' common vocabulary, its pieces by id: side by side, the prompt must be the same tokens."""
    first = pieces(tokenizers[0])
    for path, tokenizer in zip(paths[1:], tokenizers[1:]):
        theirs = pieces(tokenizer)
        if theirs != first:
            sizes = f"{len(first)} and {len(theirs)} pieces" + (", not the same ones" if len(theirs) == len(first) else "")
            raise UsageError(f"--ckpt {paths[0]} and --ckpt {path} have different vocabularies ({sizes}): the prompt "
                             f"would not be the same tokens side by side")
    return first


def token_label(piece: str) -> str:
    """A piece as an axis label: SentencePiece's space mark as a visible space, a newline byte as ↵."""
    return {"<0x0A>": "↵", "<0x09>": "⇥"}.get(piece, piece.replace("\u2581", "␣"))


def prompt_ids(prompt: str | None, tokenizer: Tokenizer, models: list[Transformer],
               paths: list[str]) -> tuple[str, list[int]]:
    """The prompt read and BOS + its tokens: at least 3 (two positions for the stream's cosine, with their next
    tokens) and no more than any model's context. A --prompt longer than that is refused; the default (prompt None),
    which no one chose, is cut to the smallest context, with a line that says so."""
    text = DEFAULT_PROMPT if prompt is None else prompt
    ids = [tokenizer.bos_id] + tokenizer.encode(text)
    if len(ids) < 3:
        raise UsageError(f"--prompt={prompt!r} is {'empty' if not prompt else 'one token'}: the report compares "
                         f"positions and predicts the next token, so it needs at least 2 tokens after BOS")
    context, path = min(((model.cfg.context_length, path) for model, path in zip(models, paths)), key=lambda c: c[0])
    if len(ids) <= context:
        return text, ids
    if prompt is not None:
        raise UsageError(f"--prompt is {len(ids)} tokens with BOS, more than model.context_length={context} of "
                         f"--ckpt {path}; give a shorter one")
    if context < 3:
        raise UsageError(f"model.context_length={context} of --ckpt {path} holds fewer than the 3 tokens the report "
                         f"reads (BOS and 2 after it)")
    print(f"the default prompt is {len(ids)} tokens with BOS, more than model.context_length={context} of --ckpt "
          f"{path}: the report reads its first {context} (--prompt gives another)", flush=True)
    return tokenizer.decode(ids[1:context]), ids[:context]


def labels(configs: list[dict], names: list[str]) -> list[str]:
    """Each checkpoint's label: the model settings in which the checkpoints differ (e.g. norm_position=post), else
    its run's name; a number is added where two labels would be the same."""
    differing = [key for key in configs[0] if len({json.dumps(c[key]) for c in configs}) > 1]
    found = [", ".join(f"{key}={c[key]}" for key in differing) for c in configs] if differing else list(names)
    return [f"{label} #{i + 1}" if found.count(label) > 1 else label for i, label in enumerate(found)]


def out_dir(out: str | None, first_ckpt: Path) -> Path:
    """Where the report goes; a folder that exists must be an earlier report, since the new one replaces it whole."""
    folder = Path(out) if out else run_dir_of(first_ckpt) / "report"
    if folder.exists() and not (folder / REPORT_FILE).is_file():
        raise UsageError(f"--out {folder} exists and is not a report (no {REPORT_FILE} in it); the report replaces "
                         f"its folder whole, so choose a new or a report folder")
    return folder


def measure(model: Transformer, ids: list[int], first_token: int) -> dict:
    """Every section's numbers for one checkpoint."""
    tokens = torch.tensor([ids])
    element = model.tok_emb.weight.element_size()
    return {"kv_cache": decode.decode_times(model, first_token),
            "attention_wiring": {"reads": attention.kv_wiring(model, tokens),
                                 "cache_by_kv_heads": attention.cache_by_kv_heads(model.cfg, element)},
            "attention_maps": attention.attention_maps(model, tokens),
            "positions": {"shift_check": positions.shift_check(model, tokens),
                          "score_by_distance": positions.score_by_distance(model, tokens),
                          "table_similarity": positions.table_similarity(model)},
            "residual_stream": blocks.residual_stream(model, tokens),
            "ffn": blocks.ffn_activations(model, tokens)}


def on_val_split(model: Transformer, ckpt_dir: Path, tokens: torch.Tensor, pieces: list[str]) -> dict:
    """The numbers of sections 7, 8 and 9, read on the run's val split. A checkpoint outside a training run has none:
    section 7 says why, sections 8 and 9 read the prompt (tokens [1, T]) instead."""
    try:
        stream, bytes_per_token = lengths.run_val_split(ckpt_dir)
    except UsageError as e:
        past, windows = {"unavailable": str(e)}, torch.empty(0, 0, dtype=torch.long)
    else:
        with torch.no_grad():
            past = lengths.past_context(model, stream, bytes_per_token)
        windows = lengths.report_windows(stream, model.cfg.context_length)
    source, windows = ("val", windows) if len(windows) else ("prompt", tokens)
    routing = experts.routing(model, windows, pieces)
    return {"past_context": past,
            "qk_logits": {"source": source, "windows": len(windows), "window_tokens": windows.shape[1],
                          **attention.logit_scale(model, windows)},
            "experts": routing and {"source": source} | routing}


def estimator(models: list[Transformer], names: list[str]) -> dict:
    """The estimator's presets, each checkpoint's own (its full context, fp32) first, with their bytes by
    model/kv_cache.py's formula, which the page's script computes too: what one position costs in a layer, as the
    attention kind (`cache`) says from its widths, times the positions held, local layers (local_layers of them, a
    window of `window`, 0: none) holding min(window, seq)."""
    dtype_of = {size: name for name, size in reversed(BYTES_PER_ELEMENT.items())}  # 4 -> fp32, 2 -> fp16
    presets = []
    for m, name in zip(models, names):
        cfg, kind = m.cfg, attention_class(m.cfg)
        own = {"name": f"this model: {name}", "layers": cfg.n_layers, "seq": cfg.context_length, "batch": 1,
               "dtype": dtype_of[m.tok_emb.weight.element_size()], "window": cfg.window or 0,
               "local_layers": cfg.n_local_layers, "linear_layers": linear_layers(cfg)}
        presets.append((own | {"cache": kind.PER_POSITION.name} | kind.cache_dims(cfg), kind))
    presets += [LLAMA_2_7B, MISTRAL_7B, *LATENT_PRESETS, QWEN3_NEXT]
    qwen, qwen_kind = QWEN3_NEXT
    by_context = {label: [estimated_bytes(qwen_kind.PER_POSITION, qwen | {"seq": seq, "linear_layers": linear}, 1,
                                          BYTES_PER_ELEMENT[qwen["dtype"]]) for seq in CONTEXTS]
                  for label, linear in BY_CONTEXT.items()}
    return {"bytes_per_element": BYTES_PER_ELEMENT,
            "presets": [p | {"bytes": estimated_bytes(kind.PER_POSITION, p, p["batch"], BYTES_PER_ELEMENT[p["dtype"]])}
                        for p, kind in presets],
            "by_context": {"contexts": CONTEXTS, "bytes": by_context}}


def report(argv: list[str] | None = None) -> Path:
    """Measures, draws and writes the report; returns its folder. Raises UsageError on bad input."""
    args = parse_args(argv)
    try:
        (args.prompt or "").encode("utf-8")
    except UnicodeEncodeError as e:  # the shell passed bytes that are not UTF-8 (Python keeps them as surrogates)
        raise UsageError(f"--prompt is not UTF-8 text (at character {e.start})") from None
    loaded = [load(path) for path in args.ckpt]
    models, ckpt_dirs, tokenizers = zip(*loaded)
    vocabulary = one_vocabulary(tokenizers, args.ckpt)
    runs = [wandb_run_of(d, path) for d, path in zip(ckpt_dirs, args.ckpt)] if args.wandb else []
    folder = out_dir(args.out, ckpt_dirs[0])
    prompt, ids = prompt_ids(args.prompt, tokenizers[0], models, args.ckpt)  # the last check: it may print a line
    for ckpt_dir in ckpt_dirs:
        print(loaded_line(ckpt_dir), flush=True)

    names = [run_name(run_dir_of(d)) for d in ckpt_dirs]
    settings = [m.cfg.to_dict() | {"attention": m.cfg.attention} for m in models]  # the attention, named too
    checkpoint_labels = labels(settings, names)
    pieces = [token_label(piece) for piece in vocabulary]
    result = {"prompt": prompt, "token_ids": ids, "tokens": [pieces[i] for i in ids],
              "estimator": estimator(models, checkpoint_labels), "checkpoints": []}
    for model, ckpt_dir, label, model_settings in zip(models, ckpt_dirs, checkpoint_labels, settings):
        result["checkpoints"].append({"label": label, "path": str(ckpt_dir), "model": model_settings,
                                      "num_params": model.num_params(), **measure(model, ids, tokenizers[0].bos_id),
                                      **on_val_split(model, ckpt_dir, torch.tensor([ids]), pieces)})
    pngs = figures.draw(result)
    with writing(folder), atomic_dir(folder) as tmp:
        for name, data in pngs.items():
            write_bytes(tmp / name, data)
        write_bytes(tmp / "index.html", page.render(result, pngs).encode())
        write_json(tmp / REPORT_FILE, result)
    if runs:
        log_to_wandb(runs, folder, list(pngs), page.tables(result))
    return folder


def main(argv: list[str] | None = None) -> int:
    # One thread: these models' ops are too small to share, and on a busy machine a second thread makes each
    # step wait for both, so the decode timings would show the machine's load rather than the cache.
    torch.set_num_threads(1)
    # a write that fails (a full disk, a forbidden --out) is a UsageError too: an earlier report is intact
    return run_command(lambda: print(f"report: {report(argv) / 'index.html'}"))


if __name__ == "__main__":
    sys.exit(main())
