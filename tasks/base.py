"""What a synthetic task is (the interface each file in tasks/ answers), and the pieces they share.

A task makes sequences of symbols and says where they are scored:

    inputs:  [n, L] symbol indices: content 0..V-1 (data.vocab_size), then the task's own symbols (noise, markers)
    targets: [n, L] the symbol the model must give at each scored position (the next one), IGNORE elsewhere

so a task trains as next-token prediction with the loss at the scored positions only, and a checkpoint generates
its answers from a prompt. Each task draws its sets from its own seed (data.task_seed), the same for every
training seed: a finite training set seen for several epochs and a test set of unseen sequences, per difficulty
level (MAD's protocol, Poli et al. 2024).
"""
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from errors import ConfigError
from model.checks import is_whole

IGNORE = -100  # cross_entropy's ignore_index: no target here


class Task(ABC):
    name: ClassVar[str]  # data.task
    paper: ClassVar[str]  # where it comes from
    vocab_size: ClassVar[int]  # its content symbols by default (data.vocab_size=null)
    # its own settings and their defaults (data.<setting>; null on the command line keeps the default); the level
    # setting takes one value or a list, each a difficulty level the test set is scored at
    settings: ClassVar[dict]
    level: ClassVar[str | None] = None
    markers: ClassVar[dict[str, str]] = {}  # its special symbols by name, each with the character it is written as

    def __init__(self, values: dict, vocab_size: int, seq_len: int, seed: int):
        """values: its settings; seed: data.task_seed, which the sets and anything fixed across them are drawn from."""
        self.values, self.vocab_size, self.seq_len, self.seed = values, vocab_size, seq_len, seed
        self.validate()

    @property
    def levels(self) -> list:
        """The difficulty levels: the level setting's values (one level where the task has none)."""
        if self.level is None:
            return [None]
        value = self.values[self.level]
        return list(value) if isinstance(value, (list, tuple)) else [value]

    def level_name(self, level) -> str | None:
        """How metrics name a level: `pairs=8` (None: the task has one)."""
        return None if level is None else f"{self.level}={level}"

    @property
    def extra_symbols(self) -> int:
        """Symbols past the content and the markers (noise)."""
        return 0

    @property
    def symbols(self) -> int:
        return self.vocab_size + self.extra_symbols + len(self.markers)

    def marker(self, name: str) -> int:
        return self.vocab_size + self.extra_symbols + list(self.markers).index(name)

    # -------- what each task answers
    @abstractmethod
    def generate(self, n: int, level, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n sequences at this level: (inputs, targets), each [n, seq_len] int64."""

    @abstractmethod
    def solve(self, inputs: np.ndarray) -> np.ndarray:
        """The answers a hand-written solver reads from the inputs alone, [n, seq_len], IGNORE where it scores none:
        the test that every scored answer is recoverable."""

    @abstractmethod
    def chance(self, level) -> float:
        """The accuracy of guessing: what a model that learnt nothing of the context scores."""

    def metrics(self, val: dict, num_params: int) -> dict:
        """What the task reads off an eval's metrics beside the accuracy (memorization: the bits stored); none here."""
        return {}

    def validate(self) -> None:
        """Its settings' rules, a ConfigError naming the first one broken; the default checks each level is a
        positive integer."""
        for level in self.levels:
            if level is not None and not is_whole(level):
                raise ConfigError(f"data.{self.level}={self.values[self.level]!r} must be a positive integer or a "
                                f"list of them")

    def needs(self, condition: bool, message: str) -> None:
        if not condition:
            raise ConfigError(f"data.task={self.name}: {message}")


def distinct(n: int, count: int, pool: int, rng: np.random.Generator) -> np.ndarray:
    """n rows of `count` distinct symbols from range(pool), in random order, [n, count]."""
    return rng.random((n, pool)).argsort(axis=1)[:, :count]


def blank(n: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) to fill: inputs of zeros, targets all IGNORE, each [n, seq_len]."""
    return np.zeros((n, seq_len), dtype=np.int64), np.full((n, seq_len), IGNORE, dtype=np.int64)
