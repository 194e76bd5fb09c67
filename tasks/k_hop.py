"""k-hop pointer chasing, in the spirit of Physics of Language Models Part 4.1's depth task (Allen-Zhu 2025): a
list of assignments in context, then queries that follow them k times.

    a b  c a  b c ...  ② a c  ① b c  ④ c ...        n assignments u f(u) in a random order, then queries

Each sequence draws f, a random cycle through all V content symbols, so every chain goes on and no symbol comes
back to itself in fewer than V hops (a permutation with short cycles let "the answer is u" score 1/V for each cycle
length dividing k, which the baseline learnt in place of recall: docs/capabilities.md). It writes the V
assignments, each as the two symbols u f(u). A query is a marker naming k (one per level, the circled numeral: ②),
a symbol u, and its answer f^k(u), the symbol reached by k hops. Scored: each answer; queries fill the rest of the
sequence. One hop is recall; k hops chain k recalls, which a model of fewer layers than hops must do within a
layer. Chance: 1/V. Level: data.hops (k), each less than V.
"""
import numpy as np

from tasks.base import IGNORE, Task, blank


class KHop(Task):
    name = "k_hop"
    paper = "Allen-Zhu 2025, Physics of Language Models Part 4.1 (reasoning depth)"
    vocab_size = 16
    settings = {"hops": [1, 2, 4]}
    level = "hops"

    @property
    def markers(self) -> dict[str, str]:
        """'>k' written as one symbol: the circled numeral k (1 to 20), then the pad."""
        return {f"hops={k}": chr(0x245F + k) for k in self.levels} | {"pad": "_"}

    def generate(self, n: int, hops: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        V = self.vocab_size
        cycle = rng.random((n, V)).argsort(axis=1)  # f: each symbol to the next one of the cycle
        f = np.empty_like(cycle)
        np.put_along_axis(f, cycle, np.roll(cycle, -1, axis=1), 1)
        order = rng.random((n, V)).argsort(axis=1)
        inputs, targets = blank(n, self.seq_len)
        inputs[:] = self.marker("pad")
        inputs[:, 0:2 * V:2], inputs[:, 1:2 * V:2] = order, np.take_along_axis(f, order, 1)
        queries = (self.seq_len - 2 * V) // 3
        starts = rng.integers(0, V, (n, queries))
        answers = starts
        for _ in range(hops):
            answers = np.take_along_axis(f, answers, 1)
        first = 2 * V
        inputs[:, first:first + 3 * queries:3] = self.marker(f"hops={hops}")
        inputs[:, first + 1:first + 3 * queries:3] = starts
        inputs[:, first + 2:first + 3 * queries:3] = answers
        targets[:, first + 1:first + 3 * queries:3] = answers
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        V = self.vocab_size
        hops_of = {self.marker(f"hops={k}"): k for k in self.levels}
        answers = np.full_like(inputs, IGNORE)
        for row, sequence in enumerate(inputs.tolist()):
            f = dict(zip(sequence[0:2 * V:2], sequence[1:2 * V:2]))
            for t in range(2 * V, len(sequence) - 2, 3):
                if sequence[t] in hops_of:
                    u = sequence[t + 1]
                    for _ in range(hops_of[sequence[t]]):
                        u = f[u]
                    answers[row, t + 1] = u
        return answers

    def chance(self, hops: int) -> float:
        return 1 / self.vocab_size

    def validate(self) -> None:
        super().validate()
        self.needs(max(self.levels) <= 20, f"data.hops={self.values['hops']} must be at most 20 (its marker's "
                                           f"numeral)")
        self.needs(max(self.levels) < self.vocab_size, f"data.hops={self.values['hops']}: the cycle of "
                                                       f"data.vocab_size={self.vocab_size} symbols comes back to its "
                                                       f"start in {self.vocab_size} hops")
        self.needs(self.vocab_size >= 2, f"data.vocab_size={self.vocab_size} must be at least 2")
        self.needs(self.seq_len >= 2 * self.vocab_size + 3, f"data.seq_len={self.seq_len} must hold the "
                   f"{self.vocab_size} assignments (2 x data.vocab_size positions) and a query (3)")
