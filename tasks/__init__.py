"""The synthetic tasks (the capability map's): one file each, registered here by its name (data.task).

    python train.py data=task data.task=mqar data.pairs=8 position=none

Each task's class (tasks/base.py's Task) answers for itself: its sequences, where they are scored, its chance
level, its settings and their rules. data/task_sets.py makes a run's training and test sets and its tokenizer.
"""
from tasks.fuzzy_in_context_recall import FuzzyInContextRecall
from tasks.in_context_recall import InContextRecall
from tasks.k_hop import KHop
from tasks.memorization import Memorization
from tasks.mqar import MQAR
from tasks.noisy_in_context_recall import NoisyInContextRecall
from tasks.selective_copying import SelectiveCopying

# a task run's settings beside each task's own (data/task_sets.py): its sequences' length, its training set's size,
# the sets' seed
SET_SETTINGS = ("seq_len", "train_examples", "task_seed")
TASKS = {task.name: task for task in (MQAR, InContextRecall, NoisyInContextRecall, FuzzyInContextRecall,
                                      SelectiveCopying, Memorization, KHop)}


def task_setting_names() -> list[str]:
    """Every task's own settings (data.<name>), each once, in the registry's order: the schema's data keys."""
    return list(dict.fromkeys(name for task in TASKS.values() for name in task.settings))
