"""The KV cache's bytes written out by hand, the reference the tests hold the model's caches and estimators to."""


def kv_cache_bytes(n_layers: int, heads: int, key_dim: int, seq_len: int, batch: int = 1,
                   bytes_per_element: int = 2, value_dim: int | None = None, window: int | None = None,
                   local_layers: int = 0) -> int:
    """heads K/V heads of key_dim (value_dim: key_dim unless given) per position, over n_layers layers of which
    local_layers hold min(window, seq_len) positions and the others seq_len."""
    value_dim = key_dim if value_dim is None else value_dim
    slots = (n_layers - local_layers) * seq_len + local_layers * min(window or seq_len, seq_len)
    return heads * (key_dim + value_dim) * slots * batch * bytes_per_element
