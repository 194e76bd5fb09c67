"""Value embeddings (modded-nanogpt's records, nanochat): a second token embedding per chosen layer, added to that
layer's attention values, so that a head can copy what a token is as well as what the stream has made of it.

    tokens: [B, T] -> E_l[tokens]: [B, T, H_kv D]       E_l: [vocab, H_kv D], one table per chosen layer l
    v_l = x W_v + E_l[tokens]                           [B, H_kv, T, D] after the heads' split, before the cache

The cache holds v_l as it is, table included, so a cached generation reads the same values as the full sequence.
model.value_embeddings chooses the layers: all, or alternate (nanochat's: the last layer and every second one before
it); null: none. A table costs vocab x H_kv D parameters and a lookup, no multiply-add. The kind of a chosen layer
says whether it has values a table can add to (its value_width): attention by K/V heads does; MLA's values come out
of its latent and Gated DeltaNet's go into a state, so neither takes one.
"""
import torch
from torch import nn

from errors import ConfigError
from model.block import attention_class

PATTERNS = ("all", "alternate")


def value_embedding_layers(cfg) -> list[bool]:
    """Which blocks model.value_embeddings gives a table: none (null), all, or alternate, counted back from the last."""
    pattern = cfg.value_embeddings
    if pattern is None:
        return cfg.n_layers * [False]
    return [pattern == "all" or (cfg.n_layers - 1 - layer) % 2 == 0 for layer in range(cfg.n_layers)]


def validate_layers(cfg) -> None:
    """model.value_embeddings: one of PATTERNS or null, and each layer it chooses of a kind with values to add to."""
    if cfg.value_embeddings is not None and cfg.value_embeddings not in PATTERNS:
        raise ConfigError(f"model.value_embeddings={cfg.value_embeddings!r} must be one of {', '.join(PATTERNS)}, "
                          f"or null for none")
    for layer, chosen in enumerate(value_embedding_layers(cfg)):
        kind = attention_class(cfg, layer)
        if chosen and kind.value_width(cfg) is None:
            raise ConfigError(f"model.value_embeddings={cfg.value_embeddings} adds a table to layer {layer}'s values, "
                              f"but that layer is attention={cfg.attention}'s {kind.__name__}, which has none to add "
                              f"to; choose other layers or set it to null")


class ValueEmbeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_layers = cfg.n_layers
        self.tables = nn.ModuleDict({
            str(layer): nn.Embedding(cfg.vocab_size, attention_class(cfg, layer).value_width(cfg))
            for layer, chosen in enumerate(value_embedding_layers(cfg)) if chosen})

    def forward(self, tokens: torch.Tensor) -> list[torch.Tensor | None]:
        """Each block's E_l[tokens], [B, T, H_kv D], or None where it has no table: one list per forward."""
        return [self.tables[str(layer)](tokens) if str(layer) in self.tables else None
                for layer in range(self.n_layers)]
