"""The KV cache: keys and values of every past token, preallocated once per generation.

    k: [n_layers, batch, heads, max_len, key_dim],  v: [n_layers, batch, heads, max_len, value_dim]
    bytes = n_layers * heads * (key_dim + value_dim) * max_len * batch * bytes_per_element
          = 2 (K and V) * n_layers * n_kv_heads * head_dim * ...      attention by K/V heads (MHA, GQA, MQA)
          = n_layers * (d_c + d_R) * ...                              MLA (model/mla.py)

It stores n_kv_heads heads, not n_heads, so GQA and MQA shrink it by n_heads / n_kv_heads. MLA stores one
"head" per token: its latent c_kv and RoPE key k_R as the key [c_kv, k_R], whose c_kv part is also the value,
so value_dim = 0 and nothing is stored twice (ModelConfig.cache_layout says what a model's layers hold).
Each forward writes its new K/V in place at [start, start + seq) and attends over [0, start + seq):
no concatenation, no reallocation. The memory estimator for any model is generation/kv_memory.py.
"""
import torch


def kv_cache_bytes(n_layers: int, heads: int, key_dim: int, seq_len: int, batch: int = 1,
                   bytes_per_element: int = 2, value_dim: int | None = None) -> int:
    """The formula above: what a cache of these sizes holds, for any model (generation/kv_memory.py). value_dim:
    key_dim unless given (K and V heads of one width)."""
    value_dim = key_dim if value_dim is None else value_dim
    return n_layers * heads * (key_dim + value_dim) * seq_len * batch * bytes_per_element


class KVCache:
    def __init__(self, n_layers: int, batch: int, heads: int, max_len: int, key_dim: int, value_dim: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (n_layers, batch, heads, max_len)
        self.k = torch.zeros(*shape, key_dim, dtype=dtype, device=device)
        self.v = torch.zeros(*shape, key_dim if value_dim is None else value_dim, dtype=dtype, device=device)
        self.max_len = max_len
        # Each layer's [batch, n_kv_heads, max_len, head_dim] views, made once: a decode step then costs
        # a narrow and a copy per tensor instead of indexing the layer dimension again.
        self.layers = list(zip(self.k.unbind(0), self.v.unbind(0)))

    @property
    def nbytes(self) -> int:  # what is allocated, which tests hold to kv_cache_bytes()
        return self.k.nelement() * self.k.element_size() + self.v.nelement() * self.v.element_size()

    def fill_prefix(self, source: "KVCache", repeats: int = 1, length: int | None = None) -> None:
        """Copies source's positions [0, length) (default: all it holds) here, each of its rows into `repeats` rows
        in a row (row b into rows b * repeats .. (b + 1) * repeats - 1): one prompt's prefill serves every sample."""
        length = length or source.max_len
        for mine, theirs in ((self.k, source.k), (self.v, source.v)):
            # [L, B * repeats, ...] seen as [L, B, repeats, ...]: a view, so the copy broadcasts in place
            mine.unflatten(1, (theirs.shape[1], repeats))[:, :, :, :, :length].copy_(theirs[:, :, :, :length].unsqueeze(2))

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Write k: [batch, heads, seq, key_dim] and v: [..., value_dim] at positions [start, start + seq);
        return the keys and values of positions [0, start + seq) as views."""
        end = start + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: position {end} > max_len {self.max_len}")
        keys, values = self.layers[layer]
        keys.narrow(2, start, k.shape[2]).copy_(k)
        values.narrow(2, start, v.shape[2]).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)
