"""A task run's data: its training and test sets, drawn once from data.task_seed, and a tokenizer of its symbols.

Each symbol is written as one character (content: 0-9, a-z, A-Z, then Latin letters from U+0100; markers: the
task's own, such as '_' for the pad), and the tokenizer is SentencePiece's character model over exactly those
characters, so a checkpoint generates, reports and exports as a text run does:

    python generate.py --ckpt <run> --prompt "a1b2c3a"        # the model's answer to the query a

The training set is data.train_examples sequences, mixed equally over the levels, seen for as many epochs as the
steps take (MAD's protocol: a finite set); the test set is train.eval_tokens / L sequences per level, drawn from a
stream of the seed's own, less any that is a training sequence. A step's batch is drawn from the training set by
the step's own generator, so a resumed run draws the same batches.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

from data.sources import DataError
from data.tokenizer import BOS_ID, EOS_ID, UNK_ID, Tokenizer
from model.checks import is_whole
from storage.files import atomic_write
from tasks import TASKS, task_setting_names
from tasks.base import IGNORE, Task

# Every content and noise symbol's character: readable ones first, then Latin letters that render anywhere.
ALPHABET = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
            + "".join(chr(c) for c in range(0x100, 0x250)))


@dataclass
class TaskData:
    task: Task
    tokenizer: Tokenizer
    ids: torch.Tensor  # [symbols]: each symbol's token id
    train: tuple[torch.Tensor, torch.Tensor]  # (inputs, targets) as token ids, each [train_examples, seq_len]
    seed: int  # data.task_seed
    bytes_per_token: dict = field(default_factory=dict)  # a task has no text: no bits per byte
    unigram_val_bpb: float | None = None

    def train_batch(self, batch_size: int, generator: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.randint(len(self.train[0]), (batch_size,), generator=generator)
        return self.train[0][rows].to(device), self.train[1][rows].to(device)

    def eval_batches(self, batch_size: int, count: int, device) -> list[tuple[torch.Tensor, torch.Tensor, str]]:
        """The test set: `count` sequences per level in batches of batch_size, each with its level's name ('' where
        the task has one level), none a training sequence."""
        seen = {row.tobytes() for row in self.train[0].numpy()}
        batches = []
        for index, level in enumerate(self.task.levels):
            inputs, targets = (as_tokens(symbols, self.ids) for symbols in
                               self.task.generate(count, level, np.random.default_rng([self.seed, 1, index])))
            unseen = torch.tensor([row.tobytes() not in seen for row in inputs.numpy()])
            if not unseen.any():
                name = self.task.level_name(level)
                raise DataError(f"data.task={self.task.name}: every test sequence{f' at {name}' if name else ''} is a "
                                f"training sequence too; use a larger data.vocab_size or data.seq_len")
            inputs, targets = inputs[unseen], targets[unseen]
            batches += [(inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device),
                         self.task.level_name(level) or "") for i in range(0, len(inputs), batch_size)]
        return batches

    def sample_prompt(self, configured: str) -> str:
        """A test sequence up to its first scored position, in place of train.sample_prompt's text."""
        inputs, targets = self.task.generate(1, self.task.levels[0], np.random.default_rng([self.seed, 2]))
        first = int((targets[0] != IGNORE).nonzero()[0][0])
        return self.tokenizer.decode(as_tokens(inputs[0, :first + 1], self.ids))

    def task_metrics(self, val: dict, num_params: int) -> dict:
        return self.task.metrics(val, num_params)

    def val_split(self):
        """A task has no val text: evaluate.py and the report's bits per byte have nothing to score."""
        raise DataError(f"data.task={self.task.name} is a synthetic task, with no val text to score in bits per byte; "
                        f"its accuracy per level is the run's val_acc (metrics.jsonl, summary.json)")



def make_task(cfg: dict, context_length: int) -> Task:
    """data.task's class with its settings: the task's defaults where a setting is null, and a DataError for a
    setting of another task."""
    name = cfg.get("task")
    if name not in TASKS:
        raise DataError(f"data.task={name!r} must be one of {', '.join(TASKS)}")
    task = TASKS[name]
    for setting in task_setting_names():
        if setting not in task.settings and cfg.get(setting) is not None:
            owners = [other for other, kind in TASKS.items() if setting in kind.settings]
            raise DataError(f"data.{setting}={cfg[setting]} is a setting of data.task={' or '.join(owners)}, not of "
                            f"data.task={name}")
    values = {setting: default if cfg.get(setting) is None else cfg[setting]
              for setting, default in task.settings.items()}
    seq_len = cfg.get("seq_len") or context_length
    vocab_size = cfg.get("vocab_size") or task.vocab_size
    for setting, value in (("seq_len", seq_len), ("vocab_size", vocab_size), ("train_examples", cfg["train_examples"])):
        if not is_whole(value):
            raise DataError(f"data.{setting}={value!r} must be a positive integer")
    if seq_len > context_length:
        raise DataError(f"data.seq_len={seq_len} is longer than the model's window, model.context_length="
                        f"{context_length}")
    if not is_whole(cfg["task_seed"], 0):
        raise DataError(f"data.task_seed={cfg['task_seed']!r} must be a non-negative integer")
    made = task(values, vocab_size, seq_len, cfg["task_seed"])
    if made.vocab_size + made.extra_symbols > len(ALPHABET):
        raise DataError(f"data.vocab_size={vocab_size}: a task writes at most {len(ALPHABET)} symbols")
    return made


def prepare_task(cfg: dict, context_length: int) -> TaskData:
    task = make_task(cfg, context_length)
    characters = ALPHABET[:task.vocab_size + task.extra_symbols] + "".join(task.markers.values())
    tokenizer = symbol_tokenizer(characters, Path(cfg["cache_dir"]).expanduser())
    ids = torch.tensor([tokenizer.sp.piece_to_id(c) for c in characters])
    rng, count = np.random.default_rng([cfg["task_seed"], 0]), cfg["train_examples"]
    train = [task.generate(-(-count // len(task.levels)), level, rng) for level in task.levels]  # equal shares
    inputs, targets = (np.concatenate([pair[i] for pair in train])[:count] for i in (0, 1))
    return TaskData(task, tokenizer, ids, (as_tokens(inputs, ids), as_tokens(targets, ids)), cfg["task_seed"])


def as_tokens(symbols: np.ndarray, ids: torch.Tensor) -> torch.Tensor:
    """Symbol indices as token ids (ids: each symbol's), IGNORE kept."""
    symbols = torch.from_numpy(symbols)
    return torch.where(symbols == IGNORE, IGNORE, ids[symbols.clamp(min=0)])


def symbol_tokenizer(characters: str, cache_dir: Path) -> Tokenizer:
    """SentencePiece's character model of exactly these characters (and <unk>, <s>, </s>), cached by them."""
    path = cache_dir / f"task-{hashlib.sha256(characters.encode()).hexdigest()[:16]}" / "tokenizer.model"
    try:
        tokenizer = Tokenizer(path)
        if all(tokenizer.sp.piece_to_id(c) != UNK_ID for c in characters):
            return tokenizer
    except (OSError, RuntimeError):  # none yet, or a damaged one: made again
        pass
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([characters]), model_writer=model, vocab_size=len(characters) + 3, model_type="char",
        character_coverage=1.0, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1, minloglevel=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(model.getvalue()))
    return Tokenizer(path)
