"""Memorization (MAD, Poli et al. 2024): one dictionary of facts, the same in every sequence, to be stored in the
weights; and how many bits the model holds, to read against Physics of Language Models Part 3.3's ~2 bits per
parameter (Allen-Zhu & Li 2024).

    k = v k = v k = v ...        each key once per sequence; v is the dictionary's value of k

The dictionary (from data.task_seed) maps the content's first half, the keys, one to one onto its second half, the
values. Scored: the value at each '=', which no context gives: only the weights can. The test set holds other
orderings of the same facts (the task is storage, not generalisation). Chance: 2/V.
Bits stored: F facts, each a choice among V/2 values, less what the model still does not know:
F x (log2(V/2) - H), H the test loss in bits per answer (a cross-entropy bounds the entropy left from above, so
this bounds the bits from below); over the model's parameters, bits per parameter.
"""
import math

import numpy as np

from tasks.base import IGNORE, Task, blank, distinct


class Memorization(Task):
    name = "memorization"
    paper = "Poli et al. 2024, MAD; Allen-Zhu & Li 2024, Physics of Language Models Part 3.3"
    vocab_size = 256
    settings = {}
    markers = {"is": "=", "pad": "_"}

    def __init__(self, values: dict, vocab_size: int, seq_len: int, seed: int):
        super().__init__(values, vocab_size, seq_len, seed)
        half = vocab_size // 2
        self.value_of = half + np.random.default_rng([seed, 1]).permutation(half)  # the dictionary

    def generate(self, n: int, level, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        facts = min(self.seq_len // 3, self.vocab_size // 2)
        keys = distinct(n, facts, self.vocab_size // 2, rng)
        inputs, targets = blank(n, self.seq_len)
        inputs[:] = self.marker("pad")
        inputs[:, 0:3 * facts:3], inputs[:, 1:3 * facts:3] = keys, self.marker("is")
        inputs[:, 2:3 * facts:3] = self.value_of[keys]
        targets[:, 1:3 * facts:3] = self.value_of[keys]
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        answers = np.full_like(inputs, IGNORE)
        at = inputs == self.marker("is")
        answers[at] = self.value_of[np.roll(inputs, 1, axis=1)[at]]
        return answers

    def chance(self, level) -> float:
        return 2 / self.vocab_size

    def metrics(self, val: dict, num_params: int) -> dict:
        """The bits the model holds of the dictionary, from its test loss per answer (the formula above), and per
        parameter."""
        facts = self.vocab_size // 2
        bits = facts * max(0.0, math.log2(facts) - val["val_loss"] / math.log(2))
        return {"bits_stored": bits, "bits_per_param": bits / num_params}

    def validate(self) -> None:
        super().validate()
        self.needs(self.vocab_size >= 4, f"data.vocab_size={self.vocab_size} must be at least 4: two facts")
        self.needs(self.seq_len >= 3, f"data.seq_len={self.seq_len} must hold one fact (3 positions)")
