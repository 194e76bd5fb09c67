"""The KV-cache memory estimator: model/kv_cache.py's formula for any model, no tensors allocated.

    bytes = per_position * positions held * batch * bytes_per_element
    per_position: what one position costs in one layer, as the attention kind says (its PER_POSITION):
                  2 (K and V) * n_kv_heads * head_dim (model/attention.py), or MLA's latent and RoPE key (model/mla.py)
    positions held: n_layers * seq_len, except that local layers (a window W) hold min(W, seq_len) each, and
                    linear layers (Gated DeltaNet, model/gated_deltanet.py) none: each holds a fixed state instead,
                    H_v d_h d_h + (2 H_k + H_v) d_h (K - 1) numbers at any seq

    python -m generation.kv_memory --layers 32 --kv-heads 32 --head-dim 128 --seq 4096 --dtype fp16   # LLaMA-2-7B
    python -m generation.kv_memory --layers 32 --kv-rank 512 --rope-head-dim 64 --seq 4096   # its sizes with MLA
    python -m generation.kv_memory --ckpt outputs/<run>            # this repo's checkpoint (S = its context)
    python -m generation.kv_memory --hf-config config.json --kv-heads 8   # a transformers config, flags override it
    python -m generation.kv_memory --layers 32 --kv-heads 8 --head-dim 128 --seq 32768 --window 4096   # Mistral-7B
    python -m generation.kv_memory --layers 48 --linear-layers 36 --kv-heads 2 --head-dim 256 \
        --linear-key-heads 16 --linear-value-heads 32 --linear-head-dim 128 --seq 262144   # Qwen3-Next's 3:1
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

from cli import Parser, run_command
from errors import UsageError
from interop.hf import hf_head_dim, hf_layer_types
from interop.load import load_model
from model.attention import Attention
from model.block import ATTENTION_KINDS, attention_class
from model.kv_cache import PerPosition, positions_held
from model.mla import LatentAttention
from storage.checkpoint import CheckpointError

BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def kv_projections(new_tokens: int, prompt_tokens: int = 1) -> tuple[int, int]:
    """(without a cache, with a cache), per layer; see the module docstring."""
    without = new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2
    return without, prompt_tokens + new_tokens - 1


def dims_from_hf_config(path: str) -> dict:
    """num_hidden_layers, max_position_embeddings and the cache's widths of a transformers config.json: MLA's latent
    and RoPE key (DeepSeek-V2/V3's kv_lora_rank, qk_rope_head_dim), or num_key_value_heads (default:
    num_attention_heads) and head_dim (as transformers reads it: interop.hf.hf_head_dim), with its window."""
    try:
        config = json.loads(Path(path).read_text())
        seq = config.get("max_position_embeddings")
        if "kv_lora_rank" in config:  # DeepSeek-V2/V3's multi-head latent attention
            return cache_dims(config["num_hidden_layers"], seq, LatentAttention, config["kv_lora_rank"],
                              config["qk_rope_head_dim"])
        heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
        return cache_dims(layers, seq, Attention, config.get("num_key_value_heads") or heads,
                          hf_head_dim(config)) | hf_local_layers(config, layers)
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
    return {"layers": cfg.n_layers, "seq": cfg.context_length, "linear_layers": linear_layers(cfg)} | \
        attention_class(cfg).cache_dims(cfg) | ({"window": cfg.window, "local_layers": cfg.n_local_layers}
                                                if cfg.window else {})


def linear_layers(cfg) -> int:
    """The layers of a model of these settings whose cache is a fixed state (their kind's state_terms)."""
    return sum(bool(attention_class(cfg, layer).PER_POSITION.state_terms) for layer in range(cfg.n_layers))


def cache_dims(layers: int, seq: int | None, kind, *widths: int) -> dict:
    """The estimator's flags one model gives: its layers and length, and its cache's widths per token and layer,
    in the order the attention kind's PER_POSITION names them."""
    return {"layers": layers, "seq": seq} | dict(zip((field.name for field in kind.PER_POSITION.fields), widths))


def estimated_bytes(kind: PerPosition, dims: dict, batch: int, bytes_per_element: int) -> int:
    """model/kv_cache.py's formula from the estimator's dims: what one position costs in a layer of this kind, times
    the positions the layers hold (local_layers of them min(window, seq); none without a window; linear_layers of them
    none), plus each linear layer's fixed state."""
    window, linear = dims["window"] or None, dims.get("linear_layers") or 0
    held = positions_held(dims["layers"] - linear, dims["seq"], window, dims["local_layers"] if window else 0)
    per_position = kind.elements(dims) if held else 0  # an all-linear model's attention widths may be unknown
    return (per_position * held + kind.state_elements(dims) * linear) * batch * bytes_per_element


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def chosen_kind(dims: dict) -> PerPosition:
    """The cache of the widths given: a kind other than the first (K/V heads) where one of the widths that it needs
    and the first has not is given."""
    kinds = [kind.PER_POSITION for kind in ATTENTION_KINDS]
    first = {field.name for field in kinds[0].fields}
    return next((kind for kind in kinds[1:] if any(dims[field.name] is not None for field in kind.fields
                                                   if field.default is None and field.name not in first)), kinds[0])


def estimate(argv: list[str] | None = None) -> str:
    """The estimator's report for command-line flags argv; raises UsageError on bad input."""
    kinds = [kind.PER_POSITION for kind in ATTENTION_KINDS]
    fields = list({field.name: field for kind in kinds for field in kind.fields}.values())  # a width kinds share, once
    parser = Parser(prog="python -m generation.kv_memory", description=(
        "KV-cache bytes = layers x seq x batch x bytes_per_element x what one position costs in a layer: "
        + "; ".join(f"{kind.formula()} ({kind.label})" for kind in kinds)
        + ". Local layers hold min(window, seq) positions. Flags override what --ckpt or --hf-config give."))
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ckpt", help="a nanollama run dir or ckpt dir")
    source.add_argument("--hf-config", help="a transformers config.json")
    for name in ("--layers", "--seq"):
        parser.add_argument(name, type=int)
    for field in fields:
        parser.add_argument(flag(field.name), type=int, help=field.help or None)
    parser.add_argument("--window", type=int, help="a sliding window: local layers hold min(window, seq) positions")
    parser.add_argument("--local-layers", type=int, help="how many layers are local (default: all, with --window)")
    parser.add_argument("--linear-layers", type=int, help="how many layers hold a fixed state instead of positions "
                        "(Gated DeltaNet; default: all, with its widths)")
    parser.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    parser.add_argument("--dtype", choices=BYTES_PER_ELEMENT, default="fp16", help="default fp16")
    parser.add_argument("--new-tokens", type=int, help="also count K/V projections for this many new tokens")
    parser.add_argument("--prompt-tokens", type=int, default=1, help="prompt length for --new-tokens (default 1)")
    args = parser.parse_args(argv)
    least = {"layers": 1, "seq": 1, "batch": 1, "new_tokens": 1, "prompt_tokens": 1, "window": 1, "local_layers": 0,
             "linear_layers": 0}
    least |= {field.name: field.least for field in fields}
    for key, smallest in least.items():
        value = getattr(args, key)
        if value is not None and value < smallest:
            raise UsageError(f"{flag(key)}={value} must be a {'positive' if smallest else 'non-negative'} integer")

    dims = {key: None for key in ("layers", *(field.name for field in fields), "seq", "window", "local_layers",
                                  "linear_layers")}
    if args.ckpt:
        dims |= dims_from_checkpoint(args.ckpt)
    elif args.hf_config:
        dims |= dims_from_hf_config(args.hf_config)
    dims |= {key: getattr(args, key) for key in dims if getattr(args, key) is not None}
    if args.local_layers is not None and dims["window"] is None:
        raise UsageError(f"--local-layers={args.local_layers} says how many layers have a window, and there is none: "
                         f"give --window")
    kind = chosen_kind(dims)
    if dims["linear_layers"] and not kind.state_terms:
        raise UsageError(f"--linear-layers={dims['linear_layers']}: a {kind.label} cache has no fixed state; give a "
                         f"linear layer's widths ({', '.join(flag(f.name) for k in kinds if k.state_terms for f in k.fields)})")
    lines = []
    wants_bytes = any(value is not None for value in dims.values()) or args.new_tokens is None
    if wants_bytes:
        if dims["linear_layers"] is None:  # a fixed state's widths: every layer linear unless said
            dims["linear_layers"] = dims["layers"] if kind.state_terms and dims["layers"] else 0
        per_position = {name for _, names in kind.terms for name in names}  # widths an all-linear model needs not
        needed = ("layers", *(field.name for field in kind.fields if field.default is None and (
            field.name not in per_position or dims["layers"] is None or dims["linear_layers"] < dims["layers"])),
                  "seq")
        missing = ", ".join(flag(key) for key in needed if dims[key] is None)
        if missing:
            raise UsageError(f"give {missing} (or --ckpt / --hf-config)")
        dims |= {field.name: field.default for field in kind.fields if dims[field.name] is None}
        size = BYTES_PER_ELEMENT[args.dtype]
        layers, seq, window = dims["layers"], dims["seq"], dims["window"]
        local = (layers if dims["local_layers"] is None else dims["local_layers"]) if window else 0
        if local > layers:
            given = f"--local-layers={local}" if args.local_layers is not None else f"the config's {local} local layers"
            raise UsageError(f"{given} must be at most --layers={layers}")
        linear = dims["linear_layers"]
        if linear > layers:
            raise UsageError(f"--linear-layers={linear} must be at most --layers={layers}")
        if window and kind.window_refusal:
            raise UsageError(f"--window={window} with {flag(kind.fields[0].name)}: {kind.window_refusal}")
        total = estimated_bytes(kind, dims | {"local_layers": local}, args.batch, size)
        full = layers - linear - local
        parts = [f"{full} layers x {seq} tokens" if full or not (local or linear) else "",
                 f"{local} local layers x {min(window, seq)} tokens of a {window}-token window" if local else "",
                 f"{linear} linear layers' fixed state" if linear else ""]
        held = " + ".join(part for part in parts if part)
        held = f"({held})" if "+" in held else held
        lines.append(f"{kind.title}: {kind.describe(dims)} x {held} x batch {args.batch} x {size} bytes ({args.dtype})")
        lines.append(f"  = {total:,} bytes = {total / 1e9:.3f} GB ({total / 2**30:.3f} GiB); "
                     f"{total // (seq * args.batch):,} bytes per token per sequence")
    if args.new_tokens is not None:
        without, with_cache = kv_projections(args.new_tokens, args.prompt_tokens)
        lines.append(f"K/V projections per layer for {args.new_tokens} new tokens after a {args.prompt_tokens}-token "
                     f"prompt: {without:,} without a cache, {with_cache:,} with one")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_command(lambda: print(estimate(argv)))


if __name__ == "__main__":
    sys.exit(main())
