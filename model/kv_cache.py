"""The KV cache: keys and values of past tokens, preallocated once per generation, one cache per layer.

    a layer's cache: keys [batch, heads, slots, key_dim], values [batch, heads, slots, value_dim]
    FullCache       slots = max_len              position p in slot p
    RollingCache    slots = W < max_len          a local layer of window W (model/attention.py): a rolling buffer
                                                 (Mistral), position p in slot p mod W, the last W positions kept
    StreamingCache  slots = S + (max_len - S)    StreamingLLM's sink tokens S: the first S positions in slots
                                                 0 .. S - 1 for good, the others rolling through the rest (S = 0:
                                                 the window alone, every position rolling)
    StateCache      no slots: a Gated DeltaNet layer (model/gated_deltanet.py) holds its state S [batch, value
                    heads, d_k, d_v] and its conv's last K - 1 inputs [batch, channels, K - 1], the same at any length
    bytes = sum over layers of slots * heads * (key_dim + value_dim) * batch * bytes_per_element, plus each linear
            layer's fixed state: (value heads * d_k * d_v + channels * (K - 1)) * batch * bytes_per_element

Each layer's attention builds its own cache (new_cache) and says what it costs (cache_bytes, and per_position for
the estimators): MHA/GQA/MQA store n_kv_heads heads of K and V, so GQA and MQA shrink the cache by n_heads /
n_kv_heads; MLA (model/mla.py) stores one "head" per token whose value is part of its key, value_dim 0. A
generation's cache, KVCache, is the list of its layers' caches; each has the same small interface: update (write
the new positions, read what the queries see), nbytes, fill_from (copy a shared prompt's prefix), max_len.
Each forward writes its new K/V in place at their slots and attends over what the layer holds: no reallocation.
A rolling or streaming layer takes positions past max_len, so a generation of a windowed model, or one with sink
tokens, goes on without re-prefilling (generation/engine.py).

Streaming keeps RoPE's distances as StreamingLLM assigns them within the cache: the newest query is the cache's
last position, max_len - 1, and sink token j is position j. The recent keys are rotated at their own positions,
whose distances to the query are already those; the sinks' distances grow by one each step, so each step
rotates them on to positions offset + j, offset = p + 1 - max_len for the query at p (RoPE rotations compose).
The memory estimator for any model is generation/kv_memory.py.
"""
import math
from dataclasses import dataclass

import torch

from model.interfaces import LayerCache
from model.positions import Rotary


def positions_held(n_layers: int, seq_len: int, window: int | None = None, local_layers: int = 0) -> int:
    """The positions n_layers layers hold for a sequence of seq_len: local_layers of them min(window, seq_len)."""
    return (n_layers - local_layers) * seq_len + local_layers * min(window or seq_len, seq_len)


@dataclass(frozen=True)
class CacheField:
    """One width a kind's cache is sized by, as the estimators ask for it (a flag, a field of the report's page)."""
    name: str
    symbol: str  # in the formula
    label: str  # the page's
    help: str  # the estimator's flag's
    least: int = 1  # 0 where the width may be absent
    default: int | None = None  # None: the estimator needs it given


@dataclass(frozen=True)
class PerPosition:
    """What one position costs in one layer's cache, in elements, as an attention kind describes it to the
    estimators (generation/kv_memory.py, report.py and its page's script): a sum of terms, each a coefficient times
    a product of the kind's fields, so that a reader with no model (the page's JavaScript) computes it alike."""
    name: str  # the page's and report.json's `cache`
    label: str  # the page's choice
    title: str  # the estimator's line
    fields: tuple[CacheField, ...]
    terms: tuple[tuple[int, tuple[str, ...]], ...]
    text: str  # the terms with their widths, str.format'ed with the fields
    window_refusal: str | None = None  # why the kind takes no window (None: its layers may be local)
    row: str = ""  # the report's row of this model's cache, str.format'ed with the fields ("": K/V heads' own rows)
    # what a layer of the kind holds whatever the positions, in elements, terms as `terms` (a linear layer's state)
    state_terms: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def elements(self, dims: dict) -> int:
        return sum(coefficient * math.prod(dims[name] for name in names) for coefficient, names in self.terms)

    def state_elements(self, dims: dict) -> int:
        return sum(coefficient * math.prod(dims[name] for name in names) for coefficient, names in self.state_terms)

    def formula(self, times: str = " x ") -> str:
        """The terms in their fields' symbols, e.g. 2 x H_kv x d_head, and a fixed state's, per layer."""
        symbols = {field.name: field.symbol for field in self.fields}
        def written(terms):
            return " + ".join(times.join([str(coefficient)] * (coefficient != 1) + [symbols[name] for name in names])
                              for coefficient, names in terms)
        state = f"; a linear layer's state {written(self.state_terms)}, at any length" if self.state_terms else ""
        return written(self.terms) + state

    def describe(self, dims: dict) -> str:
        """text with the widths given ("-" for one not given, which the sizes do not need)."""
        return self.text.format(**{field.name: "-" if dims[field.name] is None else dims[field.name]
                                   for field in self.fields})


class FullCache(LayerCache):
    """Every position in its own slot, in order: keys [batch, heads, max_len, key_dim], values [..., value_dim]."""

    def __init__(self, batch: int, heads: int, max_len: int, key_dim: int, value_dim: int, slots: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__(max_len)
        self.keys = torch.zeros(batch, heads, slots or max_len, key_dim, dtype=dtype, device=device)
        self.values = torch.zeros(batch, heads, slots or max_len, value_dim, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:  # what is allocated, which tests hold to the attention's cache_bytes
        return sum(t.nelement() * t.element_size() for t in (self.keys, self.values))

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor):
        """Writes k: [batch, heads, T, key_dim] and v: [..., value_dim], positions [start, start + T); returns the
        keys and values the new queries attend over and their positions: a tensor of one per key, or None where the
        keys are the positions up to start + T - 1 in order (model.attention.visible_keys), or held in some order
        and all visible to the one new query (a rolling layer's decode step)."""
        T, end = k.shape[2], start + k.shape[2]
        if end > self.keys.shape[2]:
            return self.past_slots(start, k, v)
        self.keys.narrow(2, start, T).copy_(k)
        self.values.narrow(2, start, T).copy_(v)
        self.written(end)
        return self.keys.narrow(2, 0, end), self.values.narrow(2, 0, end), None

    def past_slots(self, start: int, k: torch.Tensor, v: torch.Tensor):
        raise ValueError(f"KV cache overflow: position {start + k.shape[2]} > max_len {self.max_len}")

    def written(self, end: int) -> None:
        """Positions [0, end) are written, in order."""

    def fill_from(self, source: "FullCache", repeats: int = 1, length: int | None = None) -> None:
        """Copies source's positions [0, length) (default: all it holds) here, each of its rows into `repeats` rows
        in a row (row b into rows b * repeats .. (b + 1) * repeats - 1): one prompt's prefill serves every sample.
        A rolling layer's slots are copied whole once the prompt has filled them."""
        slots = source.keys.shape[2]
        n = min(length or slots, slots)
        for mine, theirs in ((self.keys, source.keys), (self.values, source.values)):
            # [B * repeats, ...] seen as [B, repeats, ...]: a view, so the copy broadcasts in place
            mine.unflatten(0, (theirs.shape[0], repeats))[:, :, :, :n].copy_(theirs[:, :, :n].unsqueeze(1))
        self.written(n)


class RollingCache(FullCache):
    """A local layer's window of W < max_len positions: position p in slot p mod W."""

    def __init__(self, batch: int, heads: int, max_len: int, key_dim: int, value_dim: int, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        super().__init__(batch, heads, max_len, key_dim, value_dim, window, dtype, device)

    def past_slots(self, start: int, k: torch.Tensor, v: torch.Tensor):
        keys, values = self.keys, self.values
        length, T, end = keys.shape[2], k.shape[2], start + k.shape[2]
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


class StreamingCache(FullCache):
    """A full layer streaming past max_len (StreamingLLM): its first S positions kept, the last max_len - S rolling;
    rotary: the model's RoPE, which turns the sinks on (None without RoPE)."""

    def __init__(self, batch: int, heads: int, max_len: int, key_dim: int, value_dim: int, sink_tokens: int,
                 rotary: Rotary | None, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if not 0 <= sink_tokens < max_len:
            raise ValueError(f"sink_tokens={sink_tokens} must be in [0, the cache's {max_len} positions)")
        super().__init__(batch, heads, max_len, key_dim, value_dim, None, dtype, device)
        self.sink_tokens, self.rotary = sink_tokens, rotary
        self.sink_keys = None  # the sinks' keys as the prefill wrote them, which each step past max_len rotates on

    def written(self, end: int) -> None:
        if self.sink_tokens and self.sink_keys is None and end >= self.sink_tokens:
            self.sink_keys = self.keys[:, :, :self.sink_tokens].clone()

    def past_slots(self, start: int, k: torch.Tensor, v: torch.Tensor):
        """One token at a time: the new key replaces the oldest recent one, and the sinks move to positions
        offset .. offset + S - 1 (the module docstring)."""
        if k.shape[2] != 1:
            raise ValueError(f"a streaming cache takes one token at a time past its {self.max_len} positions, "
                             f"not {k.shape[2]}")
        S = self.sink_tokens
        slot = S + (start - S) % (self.max_len - S)
        self.keys[:, :, slot].copy_(k[:, :, 0])
        self.values[:, :, slot].copy_(v[:, :, 0])
        if S and self.rotary is not None:  # each sink rotated by the same offset: RoPE over a sequence of one
            offset = start + 1 - self.max_len
            self.keys[:, :, :S].copy_(self.rotary(self.sink_keys.unsqueeze(-2), offset).squeeze(-2))
        return self.keys, self.values, None


class StateCache(LayerCache):
    """A linear layer's cache: a fixed-size state that each forward reads and replaces, whatever the position
    (model/gated_deltanet.py). A forward at position 0 starts from zeros: a new sequence, or a slid window read
    again; any other start must be where the last forward ended. tensors: name -> (shape without the batch); the
    state S [H_v, d_k, d_v] and the conv's history [channels, K - 1]."""

    def __init__(self, batch: int, max_len: int, tensors: dict[str, tuple[int, ...]], dtype: torch.dtype,
                 device: torch.device | str):
        super().__init__(max_len)  # the generation's positions; the state does not depend on them
        self.tensors = {name: torch.zeros(batch, *shape, dtype=dtype, device=device) for name, shape in tensors.items()}
        self.position = 0  # where the next forward starts

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for t in self.tensors.values())

    def read(self, start: int, length: int) -> dict[str, torch.Tensor] | None:
        """The state before positions [start, start + length): None at start 0 (zeros, not read), else what the
        forward that ended at start left."""
        if start not in (0, self.position):
            raise ValueError(f"a state cache goes on from position {self.position}, not {start}")
        self.position = start + length
        return None if start == 0 else self.tensors

    def write(self, values: dict[str, torch.Tensor]) -> None:
        for name, value in values.items():
            self.tensors[name].copy_(value)

    def fill_from(self, source: "StateCache", repeats: int = 1, length: int | None = None) -> None:
        """source's state after its prompt, each row into `repeats` rows in a row (FullCache.fill_from): the state
        is the whole prompt's, so `length` changes nothing."""
        for name, mine in self.tensors.items():
            mine.copy_(source.tensors[name].repeat_interleave(repeats, dim=0))
        self.position = source.position


class KVCache:
    """A generation's cache: its layers' caches, in the blocks' order, and what they hold together."""

    def __init__(self, layers: list[LayerCache]):
        self.layers = layers

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    def fill_from(self, source: "KVCache", repeats: int = 1, length: int | None = None) -> None:
        for mine, theirs in zip(self.layers, source.layers):
            mine.fill_from(theirs, repeats, length)
