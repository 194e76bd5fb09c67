"""Fuzzy in-context recall (MAD, Poli et al. 2024): in-context recall whose keys and values are motifs, runs of
1 to data.key_motif (data.value_motif) symbols, so a key is known only once its last symbol has come.

    k k v v v k v k k v v v ...        key motifs from the content's first half, value motifs from its second

Each sequence draws data.keys distinct key motifs, none the start of another (so a key's end is known when it
is read), and a value motif for each; its pairs draw keys at random, with repeats, until the sequence is full, and
pad the rest. Scored: every symbol of the value after a key seen before (its first from the key's last symbol),
so a model must hold motifs, not symbols. Chance: 2/V.
"""
import numpy as np

from model.checks import is_whole
from tasks.base import IGNORE, Task, blank


class FuzzyInContextRecall(Task):
    name = "fuzzy_in_context_recall"
    paper = "Poli et al. 2024, Mechanistic design and scaling of hybrid architectures (MAD)"
    vocab_size = 16
    settings = {"keys": 8, "key_motif": 3, "value_motif": 3}
    markers = {"pad": "_"}

    def motifs(self, count: int, longest: int, symbols: np.ndarray, rng: np.random.Generator,
               prefix_free: bool) -> list[tuple]:
        chosen = []
        while len(chosen) < count:
            motif = tuple(rng.choice(symbols, rng.integers(1, longest + 1)).tolist())
            clash = any(a[:len(b)] == b or b[:len(a)] == a for a in (motif,) for b in chosen) if prefix_free else False
            if motif not in chosen and not clash:
                chosen.append(motif)
        return chosen

    def generate(self, n: int, level, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        half = self.vocab_size // 2
        inputs, targets = blank(n, self.seq_len)
        inputs[:] = self.marker("pad")
        for row in range(n):
            keys = self.motifs(self.values["keys"], self.values["key_motif"], np.arange(half), rng, prefix_free=True)
            values = self.motifs(len(keys), self.values["value_motif"], np.arange(half, 2 * half), rng,
                                 prefix_free=False)
            t, seen = 0, set()
            while True:
                pick = int(rng.integers(len(keys)))
                key, value = keys[pick], values[pick]
                if t + len(key) + len(value) > self.seq_len:
                    break
                inputs[row, t:t + len(key)] = key
                inputs[row, t + len(key):t + len(key) + len(value)] = value
                if pick in seen:  # each symbol of the value, from the position before it
                    targets[row, t + len(key) - 1:t + len(key) + len(value) - 1] = value
                seen.add(pick)
                t += len(key) + len(value)
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        half, pad = self.vocab_size // 2, self.marker("pad")
        answers = np.full_like(inputs, IGNORE)
        for row, sequence in enumerate(inputs.tolist()):
            value_of, t = {}, 0
            while t < len(sequence) and sequence[t] != pad:
                key_end = t
                while key_end < len(sequence) and sequence[key_end] < half:  # a key: up to its first value symbol
                    key_end += 1
                value_end = key_end
                while value_end < len(sequence) and half <= sequence[value_end] < 2 * half:
                    value_end += 1
                key, value = tuple(sequence[t:key_end]), sequence[key_end:value_end]
                if key in value_of:
                    answers[row, key_end - 1:value_end - 1] = value_of[key]
                value_of[key] = value
                t = value_end
        return answers

    def chance(self, level) -> float:
        return 2 / self.vocab_size

    def validate(self) -> None:
        super().validate()
        for setting in ("keys", "key_motif", "value_motif"):
            value = self.values[setting]
            self.needs(is_whole(value), f"data.{setting}={value!r} must be a positive integer")
        half, longest = self.vocab_size // 2, self.values["key_motif"]
        # prefix-free motifs of at most `longest` symbols: at most half ** longest of them
        self.needs(self.values["keys"] <= half ** longest, f"data.keys={self.values['keys']} prefix-free motifs of "
                   f"at most data.key_motif={longest} symbols from {half} need a larger data.vocab_size")
        self.needs(self.seq_len >= 2 * (longest + self.values["value_motif"]),
                   f"data.seq_len={self.seq_len} must hold two pairs of the longest motifs")
