"""train.time_budget: a run that ends when its wall-clock budget is spent.

The clock is the run's training time, `elapsed_s` in metrics.jsonl: everything inside the training loop
(steps, with torch.compile's compilation in the first ones; evals, samples, checkpoints), summed over every
resume. Data preparation and model set-up come before it and do not count; summary.json reports them as
`setup_s`, and the first step's time (the compile, with train.compile=true) as `first_step_s`.

The end has to fit inside the budget: the last step is followed by an eval, a sample and a checkpoint.
Their cost is reserved: measured each time one happens (the largest seen); before that, an eval is
taken to cost `eval_per_step` training steps, a sample `SAMPLE_S_PER_TOKEN` per token, and a checkpoint
its bytes (weights and AdamW's two moments, 12 bytes a parameter) at `CKPT_BYTES_PER_S`, all on the
generous side. An estimate is no measure of a busy machine (a 200-token sample took 32 s under load, eight
times its estimate), so train.py samples with a budgeted run's first eval, which comes within a fifth of
its time for steps (`eval_due`): the reserve holds both measured costs long before the end. A step's time is the
latest step's, except the first of each session: that one carries the warm-up (torch.compile's
compilation, the allocator's first requests) and would reserve ten times too much.
Steps go on while one more step and the reserve still fit; the step after which another would not fit
is the last. training/horizon.py turns the time into the schedule's fraction.

The reserve never takes more than MAX_RESERVE_SHARE of the budget from the steps. On a machine slow or busy
enough that the end costs more (a 60 s budget beside eight busy loops: an eval of 38.1 s, a sample of 79.8 s,
docs/training.md), the steps still get three quarters of the budget and the end runs past it by the
difference: summary.json then has `over_budget_s`, and the run's last lines say so. Shrinking the end instead
would change what it measures (a smaller val set is another number).

A budgeted run's step count depends on the machine's speed, so it is not bit-exact across machines or
even across runs; a run counted in steps (train.time_budget=null) stays bit-exact.
"""
import re

from errors import ConfigError

SAMPLE_S_PER_TOKEN = 0.02  # a decode step, on the slow side, until a sample has been timed
CKPT_BYTES_PER_S = 100e6  # written and hashed, on the slow side, until a checkpoint has been timed
MAX_RESERVE_SHARE = 0.25  # the most of the budget the end's reserve may take from the steps
EVALS_PER_RUN = 5  # a budgeted run evaluates each fifth of its time for steps at least: about 5 evals with its end's
# [0-9], not \d: re's \d and float() read any script's digits (parsing.py)
NUMBER = r"[0-9]+(?:\.[0-9]+)?"
DURATION = re.compile(rf"(?:({NUMBER})h)?(?:({NUMBER})m)?(?:({NUMBER})s)?")


def parse_duration(setting: str | None) -> float | None:
    """train.time_budget in seconds: a number of seconds (600, 90.5) or hours, minutes and seconds in
    that order (10m, 1h30m, 2m30s, 45s). None: no budget."""
    if setting is None:
        return None
    text = str(setting).strip().lower()
    if re.fullmatch(NUMBER, text):
        seconds = float(text)
    else:
        match = DURATION.fullmatch(text)
        if not text or match is None:
            raise ConfigError(f"train.time_budget={setting!r} must be seconds (600) or a duration like "
                              f"10m, 1h30m, 2m30s")
        hours, minutes, secs = (float(part or 0) for part in match.groups())
        seconds = 3600 * hours + 60 * minutes + secs
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"train.time_budget={setting!r} must be a positive duration")
    return seconds


def reserve_cap(seconds: float) -> float:
    """The most of a budget of `seconds` the end's reserve may take from the steps."""
    return MAX_RESERVE_SHARE * seconds


def overrun_reason(end_costs: dict[str, float], seconds: float) -> str:
    """Why a budgeted run whose end cost end_costs went past its budget of `seconds`."""
    if sum(end_costs.values()) > reserve_cap(seconds):
        return f"the end's reserve is at most {MAX_RESERVE_SHARE:.0%} of the budget"
    return "the end took longer than its reserve"


def overrun_notice(summary: dict, eval_tokens: int, sample_tokens: int) -> str:
    """The line for a run whose end went past its budget (summary: Horizon.summary's): what the end took, why it did
    not fit, and the settings that size its eval and its sample, the dearer first."""
    costs, seconds = summary["end_costs_s"], summary["time_budget_s"]
    settings = {"eval": f"train.eval_tokens={eval_tokens}", "sample": f"train.sample_tokens={sample_tokens}"}
    dearer_first = sorted(settings, key=costs.get, reverse=True)
    return (f"notice: the run's end ({', '.join(f'{what} {s:.1f} s' for what, s in costs.items())}) went "
            f"{summary['over_budget_s']:.1f} s past train.time_budget={seconds:g} s: {overrun_reason(costs, seconds)} "
            f"(training/budget.py); to fit it, lower "
            + " or ".join(f"{settings[what]} ({what} {costs[what]:.1f} s)" for what in dearer_first)
            + ", or raise train.time_budget")


class TimeBudget:
    def __init__(self, seconds: float, sample_tokens: int, eval_per_step: float, num_params: int):
        self.seconds = seconds
        self.eval_per_step = eval_per_step  # an eval's cost in training steps, until one has been timed
        self.costs = {"eval": 0.0, "sample": sample_tokens * SAMPLE_S_PER_TOKEN,
                      "ckpt": 12 * num_params / CKPT_BYTES_PER_S}
        self.measured: set[str] = set()
        self.step_s = 0.0  # the latest step's time, 0 until a session's second step
        self.session_steps = 0
        self.steps_since_eval_s = 0.0  # the steps' own time since the last eval (or the session's start)

    def record(self, what: str, seconds: float) -> None:
        """The time one step, eval, sample or checkpoint took."""
        if what == "step":
            self.session_steps += 1
            if self.session_steps == 1:  # the warm-up step: see the module docstring
                return
            self.step_s = seconds
            self.steps_since_eval_s += seconds
            if "eval" not in self.measured:
                self.costs["eval"] = self.eval_per_step * seconds
            return
        if what == "eval":
            self.steps_since_eval_s = 0.0
        self.costs[what] = max(seconds, self.costs[what]) if what in self.measured else seconds
        self.measured.add(what)

    @property
    def eval_due(self) -> bool:
        """A fifth of the time for steps has gone to steps since the last eval. Counted in the steps' own time, so
        that an eval dearer than a fifth does not make the next one due at once."""
        return self.steps_since_eval_s >= self.for_steps / EVALS_PER_RUN

    @property
    def reserve(self) -> float:
        """What the end costs after the last step (an eval, a sample and a checkpoint), at most a quarter of the
        budget."""
        return min(sum(self.costs.values()), reserve_cap(self.seconds))

    @property
    def for_steps(self) -> float:
        """The time the steps may take: the budget less the reserve for the end."""
        return max(self.seconds - self.reserve, 1e-9)

    def spent(self, elapsed: float) -> bool:
        """No room for one more step before the end."""
        return elapsed + self.step_s > self.for_steps

    def is_last_step(self, elapsed: float) -> bool:
        """This step fits, but a step after it would not."""
        return elapsed + 2 * self.step_s > self.for_steps
