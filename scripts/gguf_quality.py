"""How faithful the GGUF exports of a trained run are: llama.cpp (through llama-cpp-python) and transformers
(which dequantizes the file to float32 as it loads it) against this repo's model, for --dtype f32, f16 and q8_0.

    python scripts/gguf_quality.py --run outputs/<date>/<time> [--out-dir DIR] [--prompt "ROMEO:"] [--greedy-tokens 100]

Per dtype: the file's size and the val bpb of llama.cpp (with a float32 KV cache, and with its default f16 one)
and of transformers on the run's fixed val set (the train.eval_batches micro-batches of context_length tokens
that training evaluates), next to ours, which is the run's final val_bpb. For f32 also (float32 KV cache): the
largest logit difference from ours on that set, whether llama.cpp's greedy continuation of BOS + --prompt (its
own sampler at temperature 0) equals ours token for token, and whether llama.cpp tokenizes every val document
as data/tokenizer.py does. Needs llama-cpp-python (pip install llama-cpp-python).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import export  # noqa: E402  (the repo root)
from data import eval_batches, prepare_data  # noqa: E402
from generation.engine import Engine  # noqa: E402
from interop.gguf import DTYPES  # noqa: E402
from storage.checkpoint import load_checkpoint  # noqa: E402
from training.config import check_train_config  # noqa: E402
from bench_gguf import open_llama_cpp  # noqa: E402  (this folder)

THREADS = 2


def llama_cpp_logits(llm: llama_cpp.Llama, x: torch.Tensor) -> torch.Tensor:
    """[B, T] windows -> [B, T, V] float32 logits, each window from an empty KV cache."""
    out = []
    for window in x.tolist():
        llm.reset()
        llm.eval(window)
        out.append(torch.from_numpy(np.array(llm.scores[:len(window)], dtype=np.float32)))
    return torch.stack(out)


def bpb(logits_of, batches, bytes_per_token: float) -> float:
    """The mean next-token loss over the batches, in bits per byte (training/evaluate.py's val_bpb)."""
    loss = sum(F.cross_entropy(logits_of(x).flatten(0, 1).float(), y.flatten()).item() for x, y in batches)
    return loss / len(batches) / math.log(2) / bytes_per_token


def val_documents(stream: np.ndarray, bos: int, eos: int) -> list[list[int]]:
    starts, ends = np.flatnonzero(stream == bos), np.flatnonzero(stream == eos)
    return [stream[s + 1:e].tolist() for s, e in zip(starts, ends)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a run dir: its config.yaml gives the data and the val set")
    parser.add_argument("--out-dir", help="where the .gguf files go (default: a temporary folder)")
    parser.add_argument("--prompt", default="ROMEO:")
    parser.add_argument("--greedy-tokens", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    run = Path(args.run)
    cfg = OmegaConf.load(run / "config.yaml")
    model, _ = load_checkpoint(run)
    T = model.cfg.context_length
    micro_batch, _ = check_train_config(cfg.train, 1)
    data = prepare_data(cfg.data, T, micro_batch)
    batches = eval_batches(data.val, micro_batch, T, cfg.train.eval_batches)
    tok, bpt = data.tokenizer, data.bytes_per_token["val"]
    with torch.no_grad():
        ours = bpb(model, batches, bpt)
    print(f"{run}: {model.num_params():,} parameters, val set {len(batches)} x {micro_batch} x {T} tokens, "
          f"ours val bpb {ours:.6f}")

    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gguf_quality_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for dtype in DTYPES:
        path = out_dir / f"model-{dtype}.gguf"
        if export.main(["--ckpt", str(run), "--format", "gguf", "--dtype", dtype, "--out", str(path), "--force"]):
            return 2  # export printed why
        llm = open_llama_cpp(path, T, THREADS, n_batch=T, logits_all=True,
                             type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
        # llama.cpp's default KV cache, f16: what llama-cli runs
        default_cache = open_llama_cpp(path, T, THREADS, n_batch=T, logits_all=True)
        theirs = AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=path.name).eval()
        with torch.no_grad():
            rows.append((dtype, path.stat().st_size, bpb(lambda x: llama_cpp_logits(llm, x), batches, bpt),
                         bpb(lambda x: llama_cpp_logits(default_cache, x), batches, bpt),
                         bpb(lambda x: theirs(x).logits, batches, bpt)))
        if dtype != "f32":
            continue
        with torch.no_grad():
            diffs = [((model(x) - llama_cpp_logits(llm, x)).abs().max().item(), model(x).abs().max().item(),
                      (model(x) - theirs(x).logits).abs().max().item()) for x, _ in batches]
        print(f"f32 logits on the val set: max |ours - llama.cpp| {max(d[0] for d in diffs):.3g}, "
              f"max |ours - transformers| {max(d[2] for d in diffs):.3g}, max |logit| {max(d[1] for d in diffs):.3g}")
        prompt = [tok.bos_id] + tok.encode(args.prompt)
        n = min(args.greedy_tokens, T - len(prompt))
        expected = [int(s[0]) for s in Engine(model).generate([prompt], n, temperature=0, eos_id=None)]
        llm.reset()
        got = [t for t, _ in zip(llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True), range(n))]
        same = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        print(f"f32 greedy continuation of {args.prompt!r}, {n} tokens: "
              + ("equal token for token" if same is None else f"first difference at token {same}"))
        print(f"  {tok.decode(prompt + expected)!r}")
        docs = val_documents(np.asarray(data.val), tok.bos_id, tok.eos_id)
        differ = [i for i, ids in enumerate(docs)
                  if llm.tokenize(tok.decode(ids).encode(), add_bos=False, special=False) != ids]
        print(f"val text tokenization: {len(docs) - len(differ)} of {len(docs)} documents "
              f"({sum(map(len, docs)):,} tokens) tokenized by llama.cpp exactly as ours"
              + (f"; differing: documents {differ[:10]}" if differ else ""))

    print("\n| --dtype | file size | val bpb: llama.cpp, f32 KV cache | llama.cpp, f16 KV cache (its default) | "
          "transformers (dequantized to f32) |")
    print("|---|---|---|---|---|")
    for dtype, size, *values in rows:
        print(f"| {dtype} | {size:,} bytes | " + " | ".join(f"{v:.5f} ({v - ours:+.1e})" for v in values) + " |")
    print(f"\n(ours, float32 in torch: {ours:.5f}; in parentheses: the difference from it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
