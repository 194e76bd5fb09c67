"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"): N key-value pairs, then every key again.

    k_1 v_1 k_2 v_2 ... k_N v_N  q_1 a_1 q_2 a_2 ... q_N a_N  _ _ ...        length 4N, padded to L with _

The 2N keys and values are distinct symbols of one pool, the V content symbols, so each query has one answer (here
Zoology's layout, keys and values from disjoint halves of the vocabulary, trained slower: docs/capabilities.md).
The queries are the N keys in a random order; each is followed by its answer, the value that followed it among the
pairs. Scored: the answer at each query (N per sequence);
nothing else in the sequence can be predicted. Recalling N pairs needs N associations held at once, which attention
finds in its cache and a linear layer must keep in its d_k x d_v state (Jelassi et al. 2024). Chance: 1/V, a
symbol guessed with no use of the context. Level: data.pairs (N), each at most V/2 and 4N at most L.
"""
import numpy as np

from tasks.base import IGNORE, Task, blank, distinct


class MQAR(Task):
    name = "mqar"
    paper = "Arora et al. 2023, Zoology: measuring and improving recall in efficient language models"
    vocab_size = 128
    settings = {"pairs": [4, 8, 16]}
    level = "pairs"
    markers = {"pad": "_"}

    def generate(self, n: int, pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        drawn = distinct(n, 2 * pairs, self.vocab_size, rng)
        keys, values = drawn[:, :pairs], drawn[:, pairs:]
        order = rng.random((n, pairs)).argsort(axis=1)
        inputs, targets = blank(n, self.seq_len)
        inputs[:] = self.marker("pad")
        inputs[:, 0:2 * pairs:2], inputs[:, 1:2 * pairs:2] = keys, values
        queries, answers = np.take_along_axis(keys, order, 1), np.take_along_axis(values, order, 1)
        inputs[:, 2 * pairs:4 * pairs:2], inputs[:, 2 * pairs + 1:4 * pairs:2] = queries, answers
        targets[:, 2 * pairs:4 * pairs:2] = answers
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        answers = np.full_like(inputs, IGNORE)
        for row, sequence in enumerate(inputs):
            pairs = int((sequence != self.marker("pad")).sum()) // 4
            value_of = dict(zip(sequence[0:2 * pairs:2].tolist(), sequence[1:2 * pairs:2].tolist()))
            for t in range(2 * pairs, 4 * pairs, 2):
                answers[row, t] = value_of[int(sequence[t])]
        return answers

    def chance(self, pairs: int) -> float:
        return 1 / self.vocab_size

    def validate(self) -> None:
        super().validate()
        for pairs in self.levels:
            self.needs(2 * pairs <= self.vocab_size, f"data.pairs={pairs} needs {2 * pairs} distinct keys and "
                                                     f"values, but data.vocab_size={self.vocab_size} holds "
                                                     f"{self.vocab_size}")
            self.needs(4 * pairs <= self.seq_len, f"data.pairs={pairs} needs 4 x {pairs} positions, but a sequence "
                                                  f"has data.seq_len={self.seq_len}")
