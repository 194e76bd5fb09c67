"""Selective copying (MAD, Poli et al. 2024; Gu & Dao 2023's Mamba): the content symbols scattered among blanks,
to be written out in order, without the blanks, after a copy marker.

    . c . . c c . . . c . :  c c c c        data.tokens content symbols in L - tokens positions, then ':' and
                             ^ scored        the first tokens - 1 of them again

Scored: at ':' the first content symbol, then at each copied one the next: data.tokens answers per sequence,
each a content symbol drawn with repeats. A model must find each symbol by its rank among the non-blanks, not by
a fixed offset (where plain copying would do). Chance: 1/V. Level: data.tokens.
"""
import numpy as np

from tasks.base import IGNORE, Task, blank


class SelectiveCopying(Task):
    name = "selective_copying"
    paper = "Poli et al. 2024, Mechanistic design and scaling of hybrid architectures (MAD)"
    vocab_size = 16
    settings = {"tokens": 16}
    level = "tokens"
    markers = {"blank": ".", "copy": ":"}

    def generate(self, n: int, tokens: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        body = self.seq_len - tokens
        content = rng.integers(0, self.vocab_size, (n, tokens))
        places = np.sort(rng.random((n, body)).argsort(axis=1)[:, :tokens], axis=1)
        inputs, targets = blank(n, self.seq_len)
        inputs[:, :body] = self.marker("blank")
        np.put_along_axis(inputs[:, :body], places, content, 1)
        inputs[:, body] = self.marker("copy")
        inputs[:, body + 1:] = content[:, :-1]
        targets[:, body:] = content
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        answers = np.full_like(inputs, IGNORE)
        for row, sequence in enumerate(inputs.tolist()):
            copy = sequence.index(self.marker("copy"))
            content = [symbol for symbol in sequence[:copy] if symbol != self.marker("blank")]
            answers[row, copy:copy + len(content)] = content
        return answers

    def chance(self, tokens: int) -> float:
        return 1 / self.vocab_size

    def validate(self) -> None:
        super().validate()
        for tokens in self.levels:
            self.needs(2 * tokens + 1 <= self.seq_len, f"data.tokens={tokens} needs a body of at least {tokens} "
                                                       f"positions, the marker and {tokens} copied: data.seq_len="
                                                       f"{self.seq_len} is too short")
