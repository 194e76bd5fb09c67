"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology") in a language model's own vocabulary: the
probe of in-context recall, where a fixed-size state and a cache that keeps every position part ways.

A sequence of 4N tokens holds N key-value pairs, then each key again, in a random order, followed by its value:

    k_1 v_1 k_2 v_2 ... k_N v_N  q_1 a_1 q_2 a_2 ... q_N a_N

The 2N keys and values are distinct tokens drawn from `tokens` (the vocabulary's ordinary pieces), so each query
has one answer: the token that followed it among the pairs. At q_i the model must predict a_i; nothing else in the
sequence is predictable. A model that learnt to copy from its context (an induction head: Olsson et al. 2022)
answers from the pairs; recalling N of them needs N associations held at once, which attention finds in its cache
and a linear layer must keep in its d_k x d_v state (Jelassi et al. 2024, "Repeat After Me").
"""
import torch

IGNORE = -100  # cross_entropy's ignore_index: no target at this position


def recall_batch(batch: int, pairs: int, tokens: torch.Tensor, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences, targets), each [batch, 4 * pairs]: the targets are the answers at the queries, IGNORE elsewhere."""
    if not 0 < 2 * pairs <= len(tokens):
        raise ValueError(f"{pairs} pairs: 2 x {pairs} distinct tokens from {len(tokens)}")
    drawn = tokens[torch.rand(batch, len(tokens), generator=generator).argsort(dim=1)[:, :2 * pairs]]
    keys, values = drawn[:, :pairs], drawn[:, pairs:]
    order = torch.rand(batch, pairs, generator=generator).argsort(dim=1)
    sequences = torch.empty(batch, 4 * pairs, dtype=torch.long)
    sequences[:, 0:2 * pairs:2], sequences[:, 1:2 * pairs:2] = keys, values
    sequences[:, 2 * pairs::2], sequences[:, 2 * pairs + 1::2] = keys.gather(1, order), values.gather(1, order)
    targets = torch.full_like(sequences, IGNORE)
    targets[:, 2 * pairs::2] = sequences[:, 2 * pairs + 1::2]
    return sequences, targets
