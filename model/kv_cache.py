"""The KV cache: keys and values of past tokens, preallocated once per generation, one buffer per layer.

    layer l: k: [batch, heads, slots_l, key_dim],  v: [batch, heads, slots_l, value_dim]
    slots_l = max_len                    a full layer: position p in slot p
            = min(W, max_len)            a local layer of window W (model/attention.py): a rolling buffer
                                         (Mistral), position p in slot p mod W, the last W positions kept
            = S + (max_len - S)          streaming (StreamingLLM, sink_tokens S): the first S positions in
                                         slots 0 .. S - 1 for good, the others rolling through the rest
                                         (S = 0: the window alone, every position rolling)
    bytes = sum_l slots_l * heads * (key_dim + value_dim) * batch * bytes_per_element
          = 2 (K and V) * n_layers * n_kv_heads * head_dim * seq_len * ...   every layer full (MHA, GQA, MQA)
          = n_layers * (d_c + d_R) * ...                                     MLA (model/mla.py)

It stores n_kv_heads heads, not n_heads, so GQA and MQA shrink it by n_heads / n_kv_heads. MLA stores one
"head" per token: its latent c_kv and RoPE key k_R as the key [c_kv, k_R], whose c_kv part is also the value,
so value_dim = 0 and nothing is stored twice (ModelConfig.cache_layout says what a model's layers hold).
Each forward writes its new K/V in place at their slots and attends over what the layer holds: no
reallocation. A rolling or streaming layer takes positions past max_len, so a generation of a windowed model,
or one with sink tokens, goes on without re-prefilling (generation/engine.py).

Streaming keeps RoPE's distances as StreamingLLM assigns them within the cache: the newest query is the cache's
last position, max_len - 1, and sink token j is position j. The recent keys are rotated at their own positions,
whose distances to the query are already those; the sinks' distances grow by one each step, so each step
rotates them on to positions offset + j, offset = p + 1 - max_len for the query at p (RoPE rotations compose).
The memory estimator for any model is generation/kv_memory.py.
"""
import torch

from model.positions import Rotary


def kv_cache_bytes(n_layers: int, heads: int, key_dim: int, seq_len: int, batch: int = 1,
                   bytes_per_element: int = 2, value_dim: int | None = None, window: int | None = None,
                   local_layers: int = 0) -> int:
    """The formula above: what a cache of these sizes holds, for any model (generation/kv_memory.py). value_dim:
    key_dim unless given (K and V heads of one width); local_layers of the n_layers hold min(window, seq_len)."""
    value_dim = key_dim if value_dim is None else value_dim
    slots = (n_layers - local_layers) * seq_len + local_layers * min(window or seq_len, seq_len)
    return heads * (key_dim + value_dim) * slots * batch * bytes_per_element


class KVCache:
    def __init__(self, n_layers: int, batch: int, heads: int, max_len: int, key_dim: int, value_dim: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 windows: list[int | None] | None = None, sink_tokens: int | None = None,
                 rotary: Rotary | None = None):
        """windows: each layer's window (None: full; default: every layer full). sink_tokens S (not None) makes the
        full layers streaming ones (StreamingLLM; S = 0 the window alone), which needs the model's rotary (or none,
        without RoPE). A local layer whose window is not shorter than max_len holds every position, as a full one."""
        windows = windows or n_layers * [None]
        if sink_tokens is not None and not 0 <= sink_tokens < max_len:
            raise ValueError(f"sink_tokens={sink_tokens} must be in [0, the cache's {max_len} positions)")
        self.max_len, self.sink_tokens, self.rotary = max_len, sink_tokens, rotary
        local = [window is not None and window < max_len for window in windows]
        # each layer's rolling part, (its first slot, its length), or None: a window's buffer, or a streaming layer's
        # slots after its sink tokens
        self.rolling = [(0, window) if is_local else (sink_tokens, max_len - sink_tokens) if sink_tokens is not None
                        else None for is_local, window in zip(local, windows)]
        self.streaming = [not is_local and sink_tokens is not None for is_local in local]
        self.layers = [(torch.zeros(batch, heads, self.slots(i), key_dim, dtype=dtype, device=device),
                        torch.zeros(batch, heads, self.slots(i), key_dim if value_dim is None else value_dim,
                                    dtype=dtype, device=device))
                       for i in range(n_layers)]
        # streaming: the sinks' keys as the prefill wrote them, which each step past max_len rotates on
        self.sink_keys = n_layers * [None]

    def slots(self, layer: int) -> int:
        rolling = self.rolling[layer]
        return self.max_len if rolling is None else sum(rolling)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0][0].dtype

    @property
    def nbytes(self) -> int:  # what is allocated, which tests hold to kv_cache_bytes()
        return sum(t.nelement() * t.element_size() for layer in self.layers for t in layer)

    def fill_prefix(self, source: "KVCache", repeats: int = 1, length: int | None = None) -> None:
        """Copies source's positions [0, length) (default: all it holds) here, each of its rows into `repeats` rows
        in a row (row b into rows b * repeats .. (b + 1) * repeats - 1): one prompt's prefill serves every sample.
        A rolling layer's slots are copied whole once the prompt has filled them."""
        for layer, ((mine_k, mine_v), (theirs_k, theirs_v)) in enumerate(zip(self.layers, source.layers)):
            n = min(length or theirs_k.shape[2], theirs_k.shape[2])
            for mine, theirs in ((mine_k, theirs_k), (mine_v, theirs_v)):
                # [B * repeats, ...] seen as [B, repeats, ...]: a view, so the copy broadcasts in place
                mine.unflatten(0, (theirs.shape[0], repeats))[:, :, :, :n].copy_(theirs[:, :, :n].unsqueeze(1))
            self.keep_sinks(layer, n)

    def keep_sinks(self, layer: int, end: int) -> None:
        """A streaming layer's sink keys, kept once positions [0, S) are written (end: the positions written so far)."""
        if self.streaming[layer] and self.sink_tokens and self.sink_keys[layer] is None and end >= self.sink_tokens:
            self.sink_keys[layer] = self.layers[layer][0][:, :, :self.sink_tokens].clone()

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Writes k: [batch, heads, T, key_dim] and v: [..., value_dim], positions [start, start + T); returns the
        keys and values the new queries attend over and their positions: a tensor of one per key, or None where the
        keys are the positions up to start + T - 1 in order (model.attention.visible_keys), or held in some order
        and all visible to the one new query (a rolling layer's decode step)."""
        keys, values = self.layers[layer]
        T, end = k.shape[2], start + k.shape[2]
        if end <= keys.shape[2]:  # every position so far in its own slot, in order
            keys.narrow(2, start, T).copy_(k)
            values.narrow(2, start, T).copy_(v)
            self.keep_sinks(layer, end)
            return keys.narrow(2, 0, end), values.narrow(2, 0, end), None
        if self.rolling[layer] is None:
            raise ValueError(f"KV cache overflow: position {end} > max_len {self.max_len}")
        if self.streaming[layer]:  # one token at a time, the sinks rotated on to their distance from it
            return self.stream(layer, start, k, v)
        length = self.rolling[layer][1]
        if T == 1:  # the new position replaces the one leaving the window: the buffer is the query's window
            keys[:, :, start % length].copy_(k[:, :, 0])
            values[:, :, start % length].copy_(v[:, :, 0])
            return keys, values, None
        # several new positions: those still in the window before them, gathered, then theirs (a copy, for a prefill)
        held = torch.arange(max(0, start - length), start, device=k.device)
        keys_seen = torch.cat([keys.index_select(2, held % length), k], dim=2)
        values_seen = torch.cat([values.index_select(2, held % length), v], dim=2)
        kept = torch.arange(max(start, end - length), end, device=k.device)  # the new positions the buffer keeps
        keys.index_copy_(2, kept % length, k[:, :, -len(kept):])
        values.index_copy_(2, kept % length, v[:, :, -len(kept):])
        return keys_seen, values_seen, torch.cat([held, torch.arange(start, end, device=k.device)])

    def stream(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """A streaming layer's step past max_len: the new key replaces the oldest recent one, and the sinks move
        to positions offset .. offset + S - 1 (the module docstring)."""
        if k.shape[2] != 1:
            raise ValueError(f"a streaming cache takes one token at a time past its {self.max_len} positions, "
                             f"not {k.shape[2]}")
        keys, values = self.layers[layer]
        S, recent = self.rolling[layer]
        slot = S + (start - S) % recent
        keys[:, :, slot].copy_(k[:, :, 0])
        values[:, :, slot].copy_(v[:, :, 0])
        if S and self.rotary is not None:  # each sink rotated by the same offset: RoPE over a sequence of one
            offset = start + 1 - self.max_len
            keys[:, :, :S].copy_(self.rotary(self.sink_keys[layer].unsqueeze(-2), offset).squeeze(-2))
        return keys, values, None
