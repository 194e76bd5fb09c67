"""In-context recall (MAD, Poli et al. 2024): key-value pairs in which keys come back, each with its value.

    k v k v k v ...        L/2 pairs: keys from the content's first half, values from its second half

Each sequence draws its own map from the V/2 keys to values (a value may serve several keys); its pairs draw keys
at random, with repeats, and write each key's value after it. Scored: the value after every key seen before in the
sequence (the first time a key comes, its value cannot be known). Chance: 2/V. With data.noise = p > 0 it is MAD's
noisy in-context recall (tasks/noisy_in_context_recall.py): a pair's slot holds two noise symbols instead, with
probability p, never scored.
"""
import numpy as np

from tasks.base import IGNORE, Task, blank


class InContextRecall(Task):
    name = "in_context_recall"
    paper = "Poli et al. 2024, Mechanistic design and scaling of hybrid architectures (MAD)"
    vocab_size = 16
    settings = {}

    def noise_share(self) -> float:
        return 0.0

    def generate(self, n: int, level, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        half, slots = self.vocab_size // 2, self.seq_len // 2
        value_of = half + rng.integers(0, half, (n, half))  # each sequence's map
        keys = rng.integers(0, half, (n, slots))
        values = np.take_along_axis(value_of, keys, 1)
        noisy = rng.random((n, slots)) < self.noise_share()
        noise = self.vocab_size + rng.integers(0, max(self.extra_symbols, 1), (n, slots, 2))
        inputs, targets = blank(n, self.seq_len)
        inputs[:, 0:2 * slots:2] = np.where(noisy, noise[..., 0], keys)
        inputs[:, 1:2 * slots:2] = np.where(noisy, noise[..., 1], values)
        seen = np.zeros((n, half), dtype=bool)
        for slot in range(slots):  # a key scores once it has been seen in a pair that is not noise
            rows = np.arange(n)
            scored = seen[rows, keys[:, slot]] & ~noisy[:, slot]
            targets[scored, 2 * slot] = values[scored, slot]
            seen[rows[~noisy[:, slot]], keys[~noisy[:, slot], slot]] = True
        if self.seq_len % 2:  # an odd length ends in one noise-free key, unscored
            inputs[:, -1] = rng.integers(0, half, n)
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        answers = np.full_like(inputs, IGNORE)
        for row, sequence in enumerate(inputs.tolist()):
            value_of = {}
            for t in range(0, len(sequence) - 1, 2):
                key, value = sequence[t], sequence[t + 1]
                if key >= self.vocab_size:  # noise
                    continue
                if key in value_of:
                    answers[row, t] = value_of[key]
                value_of[key] = value
        return answers

    def chance(self, level) -> float:
        return 2 / self.vocab_size

    def validate(self) -> None:
        super().validate()
        self.needs(self.vocab_size >= 2, f"data.vocab_size={self.vocab_size} must be at least 2: a key and a value")
        self.needs(self.seq_len >= 4, f"data.seq_len={self.seq_len} must hold two pairs (4 positions)")
