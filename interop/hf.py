"""transformers' files for this repo's model, both ways: config.json, the safetensors weights (export.py writes them;
load.py reads a transformers directory through load_transformers_dir). Which family a model or a config.json is, and
everything that family does otherwise than LLaMA, comes from the registry (families/); this module writes and reads
the keys and tensors every family has.

Nothing here imports transformers: export and import read and write its files as plain JSON and safetensors, so
neither needs it installed.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from errors import ConfigError
from interop import InteropError
from interop.families import family_for, family_of, reader_for
from interop.families.base import hf_rope
from model.config import ModelConfig
from model.transformer import Transformer
from storage.checkpoint import CheckpointError, check_vocab


# ---------------------------------------------------------------- export: this repo -> transformers

def hf_config(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
    """transformers' config.json for a model of one of the families (families/); refuses any other with every
    offending switch."""
    family = family_of(cfg)
    family.check(cfg, "transformers")
    rope, max_positions = hf_rope(cfg)
    scaled = ({"rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}}
              if rope["rope_type"] != "default" else {})
    return {
        "architectures": [family.class_name],
        "model_type": family.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_width,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        **family.head_keys(cfg),
        "max_position_embeddings": max_positions,
        **family.expert_keys(cfg),
        **family.window_keys(cfg),
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope | family.rope_keys(cfg),
        # transformers 4.x reads rope_theta, rope_scaling and torch_dtype; 5.x reads rope_parameters and dtype
        # (and rope_scaling before rope_parameters: the two are the same scaling).
        "rope_theta": rope["rope_theta"],
        **scaled,
        "torch_dtype": "float32",
        "dtype": "float32",
        **family.fixed_for(family.sparse(cfg)),
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, split into their separate matrices."""
    family = family_of(model.cfg)
    ours = family.to_hf(model.state_dict(), model)
    out = {}
    for name, parts in family.weight_names(model).items():
        pieces = ours[name].split([rows for _, rows in parts], dim=0)
        out.update({hf_name: piece.detach().contiguous().cpu() for (hf_name, _), piece in zip(parts, pieces)})
    return out | family.extra_tensors(model)


# ---------------------------------------------------------------- import: transformers -> this repo

def model_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig for a config.json of one of the families; refuses features this repo does not have."""
    family = family_for(hf)
    return family.model_config(family.read(hf))


def hf_head_dim(hf: dict) -> int:
    """A transformers config.json's head dim as transformers reads it: its head_dim, else its family's default
    (Qwen3's 128), else hidden_size / num_attention_heads. KeyError where those are missing."""
    return reader_for(hf).head_dim(hf)


def hf_layer_types(hf: dict, n_layers: int) -> tuple[int | None, list[str]]:
    """(the sliding window, each layer's attention) as transformers reads a config.json: layer_types where given,
    else its family's default (a window in every layer; Qwen's only with use_sliding_window, Qwen2's and Qwen3's
    from max_window_layers on; gpt-oss's in every other layer from the first)."""
    family = reader_for(hf)
    return family.layer_types(family.read(hf), n_layers)


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, or every shard that model.safetensors.index.json lists."""
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError) as e:
            raise InteropError(f"corrupt {index}: {e!r}") from None
    elif (hf_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise InteropError(f"{hf_dir} has no model.safetensors or model.safetensors.index.json")
    state = {}
    for file in files:
        try:
            state.update(load_file(hf_dir / file))
        except Exception as e:  # safetensors raises its own error types for missing, truncated or foreign files
            raise InteropError(f"cannot read weights {hf_dir / file}: {e}") from None
    return state


def load_hf_state_dict(model: Transformer, hf_state: dict[str, torch.Tensor], config: dict) -> None:
    """Copy transformers-named weights into the model, checking that every name and shape matches; config: the
    config.json they came with (its family lays them out)."""
    family = family_for(config)
    names = family.weight_names(model)
    extra = family.extra_tensors(model)  # laid out once: the names to expect, and what from_hf checks
    expected = {hf_name for parts in names.values() for hf_name, _ in parts} | set(extra)
    # Older transformers saved the RoPE frequencies; ours are recomputed from rope_base. A tied checkpoint may still
    # store lm_head.weight: transformers ignores it, and so do we. DeepseekV3 without shared experts still holds their
    # [0, d] projections: empty, as ours are absent.
    ignored = {n for n in hf_state if n.endswith("rotary_emb.inv_freq") or n == "lm_head.weight"
               or hf_state[n].numel() == 0}
    missing, unexpected = sorted(expected - set(hf_state)), sorted(set(hf_state) - expected - ignored)
    if missing or unexpected:
        raise InteropError(f"weights do not match config.json: missing {missing[:3]}, unexpected {unexpected[:3]}")
    ours = family.to_hf(model.state_dict(), model)
    state = {}
    for name, parts in names.items():
        state[name] = torch.cat([hf_state[hf_name] for hf_name, _ in parts], dim=0)
        if state[name].shape != ours[name].shape:
            raise InteropError(f"weights do not match config.json: {' + '.join(n for n, _ in parts)} make "
                               f"{list(state[name].shape)}, the config implies {list(ours[name].shape)}")
    if model.cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    state = family.from_hf(state, model, hf_state, config, extra)
    for i in model.moe_layers():  # the bias of a family that has none (Mixtral, Qwen3-MoE): zeros, as it routes
        state.setdefault(f"blocks.{i}.ffn.bias", torch.zeros(model.cfg.n_experts))
    model.load_state_dict(state)


def load_transformers_dir(hf_dir: Path, config: dict, device: str | torch.device = "cpu") -> Transformer:
    """The model (in eval mode) of a transformers directory of one of the families whose config.json is `config`:
    model.safetensors or its shards, and tokenizer.model, checked against the vocab size."""
    if not (hf_dir / "tokenizer.model").is_file():
        raise CheckpointError(f"transformers directory {hf_dir} has no tokenizer.model (the SentencePiece model)")
    try:
        cfg = model_config_from_hf(config)
        check_vocab(cfg, hf_dir / "tokenizer.model")
        model = Transformer(cfg)
        load_hf_state_dict(model, read_hf_weights(hf_dir), config)
    except (InteropError, ConfigError, CheckpointError) as e:
        raise CheckpointError(f"transformers directory {hf_dir}: {e}") from None
    return model.to(device).eval()
