"""The KV-cache memory estimator: model/kv_cache.py's formula (kv_cache_bytes) for any model, no tensors allocated.

    bytes = 2 (K and V) * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_element
    bytes = n_layers * (kv_rank + rope_head_dim) * seq_len * batch * bytes_per_element     MLA (model/mla.py)
    local layers (a window W, model/attention.py) hold min(W, seq_len) positions instead of seq_len

    python -m generation.kv_memory --layers 32 --kv-heads 32 --head-dim 128 --seq 4096 --dtype fp16   # LLaMA-2-7B
    python -m generation.kv_memory --layers 32 --kv-rank 512 --rope-head-dim 64 --seq 4096   # its sizes with MLA
    python -m generation.kv_memory --ckpt outputs/<run>            # this repo's checkpoint (S = its context)
    python -m generation.kv_memory --hf-config config.json --kv-heads 8   # a transformers config, flags override it
    python -m generation.kv_memory --layers 32 --kv-heads 8 --head-dim 128 --seq 32768 --window 4096   # Mistral-7B
    python -m generation.kv_memory --new-tokens 4                  # K/V projections with and without a cache

K/V projections count the tokens whose K and V one layer computes. New token i (i = 0 .. n - 1) after a
P-token prompt needs one forward: without a cache it runs over all P + i tokens so far; with a cache,
over the P prompt tokens for i = 0 and over the one newest token after that:
    without: sum_{i=0}^{n-1} (P + i) = nP + n(n - 1)/2     (P = 1: n(n + 1)/2, 10 for n = 4)
    with:    P + n - 1                                     (P = 1: n, 4 for n = 4)
"""
import json
import sys
from pathlib import Path

from cli import Parser
from errors import UsageError
from interop.hf import hf_head_dim, hf_layer_types
from interop.load import load_model
from model.kv_cache import kv_cache_bytes
from storage.checkpoint import CheckpointError

BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def kv_projections(new_tokens: int, prompt_tokens: int = 1) -> tuple[int, int]:
    """(without a cache, with a cache), per layer; see the module docstring."""
    without = new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2
    return without, prompt_tokens + new_tokens - 1


def dims_from_hf_config(path: str) -> dict:
    """num_hidden_layers, num_key_value_heads (default: num_attention_heads), head_dim (as transformers reads it:
    interop.hf.hf_head_dim) and max_position_embeddings of a transformers config.json."""
    try:
        config = json.loads(Path(path).read_text())
        seq = config.get("max_position_embeddings")
        if "kv_lora_rank" in config:  # DeepSeek-V2/V3's multi-head latent attention
            return cache_dims(config["num_hidden_layers"], seq, kv_rank=config["kv_lora_rank"],
                              rope_head_dim=config["qk_rope_head_dim"])
        heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
        return cache_dims(layers, seq, kv_heads=config.get("num_key_value_heads") or heads,
                          head_dim=hf_head_dim(config)) | hf_local_layers(config, layers)
    except OSError as e:
        raise UsageError(f"--hf-config {path}: cannot read it: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--hf-config {path}: not JSON: {e}") from None
    except (KeyError, TypeError) as e:
        raise UsageError(f"--hf-config {path}: not a transformers model config, missing {e}") from None


def hf_local_layers(config: dict, layers: int) -> dict:
    """The window and the number of local layers of a transformers config.json, as transformers reads them
    (interop.hf.hf_layer_types); nothing without a window."""
    window, types = hf_layer_types(config, layers)
    return {"window": window, "local_layers": types.count("sliding_attention")} if window else {}


def dims_from_checkpoint(path: str) -> dict:
    try:
        cfg = load_model(path)[0].cfg
    except CheckpointError as e:
        raise UsageError(f"--ckpt {path}: {e}") from None
    if cfg.attention == "mla":
        return cache_dims(cfg.n_layers, cfg.context_length, kv_rank=cfg.kv_rank, rope_head_dim=cfg.rope_dim)
    return cache_dims(cfg.n_layers, cfg.context_length, kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim) | (
        {"window": cfg.window, "local_layers": cfg.n_local_layers} if cfg.window else {})


def cache_dims(layers: int, seq: int | None, **widths: int) -> dict:
    """The estimator's flags one model gives: its layers and length, and its cache's widths per token and layer
    (kv_heads and head_dim, or MLA's kv_rank and rope_head_dim)."""
    return {"layers": layers, "seq": seq, **widths}


def estimate(argv: list[str] | None = None) -> str:
    """The estimator's report for command-line flags argv; raises UsageError on bad input."""
    parser = Parser(prog="python -m generation.kv_memory", description=(
        "KV-cache bytes = 2 * layers * kv_heads * head_dim * seq * batch * bytes_per_element; with --kv-rank "
        "(MLA), layers * (kv_rank + rope_head_dim) * seq * batch * bytes_per_element. "
        "Flags override what --ckpt or --hf-config give."))
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ckpt", help="a nanollama run dir or ckpt dir")
    source.add_argument("--hf-config", help="a transformers config.json")
    for flag in ("--layers", "--kv-heads", "--head-dim", "--seq"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--kv-rank", type=int, help="MLA's latent dims per token and layer (d_c)")
    parser.add_argument("--rope-head-dim", type=int, help="MLA's shared RoPE key dims (d_R, default 0)")
    parser.add_argument("--window", type=int, help="a sliding window: local layers hold min(window, seq) positions")
    parser.add_argument("--local-layers", type=int, help="how many layers are local (default: all, with --window)")
    parser.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    parser.add_argument("--dtype", choices=BYTES_PER_ELEMENT, default="fp16", help="default fp16")
    parser.add_argument("--new-tokens", type=int, help="also count K/V projections for this many new tokens")
    parser.add_argument("--prompt-tokens", type=int, default=1, help="prompt length for --new-tokens (default 1)")
    args = parser.parse_args(argv)
    for key in ("layers", "kv_heads", "head_dim", "seq", "kv_rank", "batch", "new_tokens", "prompt_tokens", "window"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise UsageError(f"--{key.replace('_', '-')}={value} must be a positive integer")
    for key in ("rope_head_dim", "local_layers"):
        value = getattr(args, key)
        if value is not None and value < 0:
            raise UsageError(f"--{key.replace('_', '-')}={value} must be a non-negative integer")

    dims = {"layers": None, "kv_heads": None, "head_dim": None, "seq": None, "kv_rank": None, "rope_head_dim": None,
            "window": None, "local_layers": None}
    if args.ckpt:
        dims |= dims_from_checkpoint(args.ckpt)
    elif args.hf_config:
        dims |= dims_from_hf_config(args.hf_config)
    dims |= {key: getattr(args, key) for key in dims if getattr(args, key) is not None}
    if args.local_layers is not None and dims["window"] is None:
        raise UsageError(f"--local-layers={args.local_layers} says how many layers have a window, and there is none: "
                         f"give --window")
    latent = dims["kv_rank"] is not None  # MLA: a latent and a RoPE key per token, no K/V heads
    needed = ("layers", "kv_rank", "seq") if latent else ("layers", "kv_heads", "head_dim", "seq")

    lines = []
    wants_bytes = any(value is not None for value in dims.values()) or args.new_tokens is None
    if wants_bytes:
        missing = ", ".join("--" + key.replace("_", "-") for key in needed if dims[key] is None)
        if missing:
            raise UsageError(f"give {missing} (or --ckpt / --hf-config)")
        size = BYTES_PER_ELEMENT[args.dtype]
        window = dims["window"]
        local = (dims["layers"] if dims["local_layers"] is None else dims["local_layers"]) if window else 0
        if local > dims["layers"]:
            given = f"--local-layers={local}" if args.local_layers is not None else f"the config's {local} local layers"
            raise UsageError(f"{given} must be at most --layers={dims['layers']}")
        if latent and window:
            raise UsageError(f"--window={window} with --kv-rank: this repo's latent attention has no window")
        if latent:
            rope = dims["rope_head_dim"] or 0
            total = kv_cache_bytes(dims["layers"], 1, dims["kv_rank"] + rope, dims["seq"], args.batch, size,
                                   value_dim=0)
            lines.append(f"latent cache (MLA): ({dims['kv_rank']} latent + {rope} RoPE key) x {dims['layers']} "
                         f"layers x {dims['seq']} tokens x batch {args.batch} x {size} bytes ({args.dtype})")
        else:
            total = kv_cache_bytes(dims["layers"], dims["kv_heads"], dims["head_dim"], dims["seq"], args.batch, size,
                                   window=window, local_layers=local)
            heads = f"{dims['kv_heads']} KV heads x {dims['head_dim']} head dim"
            lines.append(f"KV cache: 2 (K, V) x {dims['layers']} layers x {heads} x {dims['seq']} tokens"
                         if not local else
                         f"KV cache: 2 (K, V) x {heads} x ({dims['layers'] - local} layers x {dims['seq']} tokens + "
                         f"{local} local layers x {min(window, dims['seq'])} tokens of a {window}-token window)")
            lines[-1] += f" x batch {args.batch} x {size} bytes ({args.dtype})"
        lines.append(f"  = {total:,} bytes = {total / 1e9:.3f} GB ({total / 2**30:.3f} GiB); "
                     f"{total // (dims['seq'] * args.batch):,} bytes per token per sequence")
    if args.new_tokens is not None:
        without, with_cache = kv_projections(args.new_tokens, args.prompt_tokens)
        lines.append(f"K/V projections per layer for {args.new_tokens} new tokens after a {args.prompt_tokens}-token "
                     f"prompt: {without:,} without a cache, {with_cache:,} with one")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        print(estimate(argv))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
