"""Where a run stands between its start and its end: one horizon over whichever limits are set.

A run ends at train.max_steps, when train.time_budget is spent, or at whichever comes first when both
are set. Its schedule (training/optim.py) follows the same limits, so the limit that ends the run also
ends its warm-up and its cosine:

    f = max(step / S, elapsed / B)          the fraction of the run done before a step
    s = 1 / S  or  step_s / B               the fraction the step takes, by the limit that gives f

S is the schedule's length in steps (train.lr_decay_steps, which is train.max_steps unless set, to train
in pieces), B the budget's time for steps (the budget less the reserve for the end, training/budget.py).
The step after which the budget has no room for another is the last, and runs at the floor (f = 1).
Counted in steps alone, f is a function of the step, so such a run is bit-exact and resumes bit for bit.
"""
import math
import time
from contextlib import contextmanager

from omegaconf import DictConfig
from tqdm import tqdm

from training.budget import TimeBudget, parse_duration
from training.optim import lr_at

# The source of the training time that Clock and timed() read. The budget's tests replace it with a fake clock,
# so that none of them races the machine's own: on a busy machine a step is slower, not the budget longer.
read_time = time.perf_counter


class Horizon:
    def __init__(self, max_steps: int | None, schedule_steps: int | None, budget: TimeBudget | None):
        self.max_steps = max_steps or math.inf
        self.schedule_steps = schedule_steps
        self.budget = budget

    @classmethod
    def of(cls, train: DictConfig, eval_sequences: int, num_params: int) -> "Horizon":
        """The run's horizon by train.max_steps, train.lr_decay_steps and train.time_budget. eval_sequences: the
        sequences an eval scores over all processes, which cost about half a training step per batch_size of them."""
        seconds = parse_duration(train.time_budget)
        eval_per_step = eval_sequences / train.batch_size / 2
        budget = TimeBudget(seconds, train.sample_tokens, eval_per_step, num_params) if seconds else None
        return cls(train.max_steps, train.lr_decay_steps, budget)

    def describe(self) -> str:
        """Which limits end the run and drive its schedule, for its first lines."""
        steps = f"train.max_steps={self.max_steps}" if self.max_steps < math.inf else None
        budget = f"when train.time_budget={self.budget.seconds:g} s is spent" if self.budget else None
        ends = f"ends at {steps} or {budget}, whichever comes first" if steps and budget else f"ends {'at ' + steps if steps else budget}"
        if self.schedule_steps is None:
            return f"{ends}; the schedule follows the time"
        if self.schedule_steps != self.max_steps:
            return f"{ends}; the schedule spans train.lr_decay_steps={self.schedule_steps} steps" + (
                " or the time, whichever is nearer its end" if budget else "")
        return f"{ends}; the schedule follows " + ("that one" if budget else "the steps")

    def spent(self, step: int, elapsed: float) -> bool:
        """No room for another step: a resumed run whose limit was already reached."""
        return step >= self.max_steps or (self.budget is not None and self.budget.spent(elapsed))

    def is_last(self, step: int, elapsed: float) -> bool:
        """The step that starts after `step` steps and `elapsed` seconds is the run's last."""
        return step + 1 >= self.max_steps or self.budget_ends_after(elapsed)

    def budget_ends_after(self, elapsed: float) -> bool:
        return self.budget is not None and self.budget.is_last_step(elapsed)

    def plan(self, step: int, elapsed: float, step_s: float, train: DictConfig) -> tuple[float, bool]:
        """The lr of the step in progress and whether it is the run's last, from one reading of its time."""
        return lr_at(*self.position(step, elapsed, step_s), train), self.is_last(step, elapsed)

    def position(self, step: int, elapsed: float, step_s: float) -> tuple[float, float]:
        """(f, s) of the step in progress, step_s its time so far (the lr is needed only by the update)."""
        if self.budget_ends_after(elapsed):
            return 1.0, 0.0
        candidates = []
        if self.schedule_steps is not None:
            candidates.append((step / self.schedule_steps, 1 / self.schedule_steps))
        if self.budget is not None:
            candidates.append((elapsed / self.budget.seconds, step_s / self.budget.seconds))
        # the limit nearer its end once this step is done: at a run's start both fractions are ~0, and the
        # first step's f + s is what tells 1 / max_steps apart from a few milliseconds of a 5-minute budget
        return max(candidates, key=sum)

    def summary(self, step: int, elapsed: float, completed: bool) -> dict:
        """For summary.json: the steps, the budget's share spent and, for a run that completed, which limit ended it."""
        record = {"steps": step}
        if self.budget is not None:
            record |= {"time_budget_s": self.budget.seconds, **self.budget_fraction(elapsed),
                       "end_costs_s": dict(self.budget.costs)}
            if elapsed > self.budget.seconds:  # the end cost more than its reserve (capped: training/budget.py)
                record["over_budget_s"] = elapsed - self.budget.seconds
        if completed:
            record["ended_by"] = "max_steps" if step >= self.max_steps else "time_budget"
        return record

    def standing(self, step: int, elapsed: float) -> tuple[float, str]:
        """For the progress bar, after `step` steps and `elapsed` seconds: the share of the run done and what is left,
        by the limit nearer its end: the budget's time, or train.max_steps with their time at the pace so far."""
        by_steps = step / self.max_steps
        if self.budget is not None and elapsed / self.budget.seconds >= by_steps:
            left = max(self.budget.seconds - elapsed, 0.0)
            return elapsed / self.budget.seconds, (f"{step} steps, {clock_time(left)} left of "
                                                   f"{clock_time(self.budget.seconds)}")
        return by_steps, f"{step}/{self.max_steps} steps, {clock_time(elapsed / step * (self.max_steps - step))} left"

    def evaluates(self, step: int, interval: int) -> bool:
        """The step just done evaluates: every `interval` steps. A budgeted run, whose step count is not known in
        advance, also does when a fifth of its time for steps has gone to steps since its last eval
        (training/budget.py), so that a short or slow run's curve has points; a run counted in steps evaluates as
        before, bit-exact."""
        return step % interval == 0 or (self.budget is not None and self.budget.eval_due)

    def samples(self, step: int, interval: int, evaluated: bool) -> bool:
        """The step just done samples: every `interval` steps, and in a budgeted run with its session's first eval too,
        so that the end's reserve holds a sample's measured time, not its estimate."""
        return step % interval == 0 or (evaluated and self.budget is not None and "sample" not in self.budget.measured)

    def budget_fraction(self, elapsed: float) -> dict:
        """The budget's share spent, for a metrics line: nothing for a run without a budget."""
        return {} if self.budget is None else {"budget_fraction": elapsed / self.budget.seconds}

    def record(self, what: str, seconds: float) -> None:
        """The time a step, an eval, a sample or a checkpoint took, for the budget's reserve."""
        if self.budget is not None:
            self.budget.record(what, seconds)

    @contextmanager
    def timed(self, what: str):
        """Times an eval, a sample or a checkpoint, for the budget's reserve."""
        started = read_time()
        yield
        self.record(what, read_time() - started)


def clock_time(seconds: float) -> str:
    """mm:ss (h:mm:ss past an hour), to the nearest second."""
    return tqdm.format_interval(round(seconds))


class Clock:
    """The training time over every session: what the checkpoint resumed from had counted, plus this
    session's time since the clock started. Calling it reads it."""

    def __init__(self, elapsed_before: float):
        self.elapsed_before, self.started = elapsed_before, read_time()

    def __call__(self) -> float:
        return self.elapsed_before + read_time() - self.started
