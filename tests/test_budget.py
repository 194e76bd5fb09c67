"""train.time_budget: the duration setting, the schedule as a function of elapsed time, and budgeted runs
of train.py end to end (one that ends by its budget, one resumed across the budget, one whose first step is a
compile's), plus the batch sizes that just work (train.micro_batch_size=null) and the
outputs/latest link. The end-to-end runs read a fake clock (FakeClock): what they assert holds on any machine,
however fast or busy."""
import contextlib
import io
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data_helpers import metrics, summary, train_in_process
from errors import ConfigError
from generation.engine import Engine
from training import evaluate as evaluation, horizon
from training.budget import SAMPLE_S_PER_TOKEN, TimeBudget, overrun_reason, parse_duration
from training.horizon import Horizon
from training.optim import lr_at
from settings import CONFIG_DIR

BUDGET_S = 3.0
FEW_LINES = ["train.log_interval=50", "train.eval_interval=200", "train.ckpt_interval=200", "train.sample_interval=200"]


@pytest.mark.parametrize("setting, seconds", [
    ("600", 600.0), (600, 600.0), ("90.5", 90.5), ("10m", 600.0), ("1h30m", 5400.0), ("2m30s", 150.0),
    ("45s", 45.0), ("1h", 3600.0), (" 5M ", 300.0), (None, None)])
def test_a_budget_is_seconds_or_hours_minutes_seconds(setting, seconds):
    assert parse_duration(setting) == seconds


@pytest.mark.parametrize("setting", ["", "10 minutes", "m", "30s10m", "-5", "0", "0s", "inf", "1d"])
def test_a_budget_that_is_not_a_duration_is_refused_with_its_value(setting):
    with pytest.raises(ConfigError, match=r"train\.time_budget="):
        parse_duration(setting)


def schedule(**settings):
    return OmegaConf.create({"lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.1, "decay_fraction": None} | settings)


def lrs_of(horizon: Horizon, train, step_times: list[float]) -> list[float]:
    """The lr of each step of a run whose steps take these seconds, as train.py sets it (its end left out)."""
    lrs, elapsed = [], 0.0
    for step, seconds in enumerate(step_times):
        if horizon.spent(step, elapsed):
            break
        last = horizon.is_last(step, elapsed)
        lrs.append(lr_at(*horizon.position(step, elapsed, seconds), train))
        horizon.budget and horizon.budget.record("step", seconds)
        elapsed += seconds
        if last:
            break
    return lrs


@pytest.mark.parametrize("warmup, decay", [(0.1, 300), (0.0, 50), (4 / 14, 14), (7 / 25, 25)])
def test_the_time_schedule_is_the_step_schedule_when_time_is_proportional_to_steps(warmup, decay):
    """Steps of 0.5 s and a budget with nothing reserved that holds `decay` of them: by time, the schedule is
    the `decay`-step schedule, step for step (the last, at the floor, is the step schedule's min_lr too)."""
    train = schedule(warmup_fraction=warmup)
    by_time = lrs_of(Horizon(None, None, TimeBudget(0.5 * decay, 0, 0.0, 0)), train, [0.5] * (2 * decay))
    by_steps = lrs_of(Horizon(decay, decay, None), train, [0.5] * (2 * decay))
    assert len(by_time) == len(by_steps) == decay
    # the first step's time is not recorded, so the time schedule only knows a step's share from the second on
    assert by_time[1:-1] == pytest.approx(by_steps[1:-1], rel=1e-9) and by_time[-1] == train.min_lr


def test_max_steps_under_a_budget_that_lasts_gets_the_step_schedule():
    """train.max_steps=200 with the default 5-minute budget: 200 steps of 0.1 s end long before the budget, so the
    warm-up and the cosine follow the steps, down to min_lr at step 200, exactly as with no budget."""
    train = schedule()
    by_steps = lrs_of(Horizon(200, 200, TimeBudget(300.0, 200, 10.0, 10**6)), train, [0.1] * 300)
    assert by_steps == lrs_of(Horizon(200, 200, None), train, [0.1] * 300)
    assert len(by_steps) == 200 and by_steps[:20] == sorted(by_steps[:20]) and max(by_steps) == train.lr
    assert by_steps[19] == train.lr and by_steps[20:] == sorted(by_steps[20:], reverse=True)
    assert by_steps[-1] == pytest.approx(train.min_lr, rel=1e-3)


def test_a_budget_that_ends_before_max_steps_takes_the_schedule_to_min_lr():
    """The same 200 steps, at 1 s a step under a 60 s budget: the budget ends the run first, and its
    schedule with it: the warm-up over its first 10%, min_lr at its last step."""
    train = schedule()
    budget = TimeBudget(60.0, sample_tokens=0, eval_per_step=0.0, num_params=0)
    lrs = lrs_of(Horizon(200, 200, budget), train, [1.0] * 300)
    assert len(lrs) == 60 and lrs[-1] == train.min_lr  # 60 steps of 1 s fill the 60 s exactly (nothing reserved)
    assert lrs[:6] == sorted(lrs[:6]) and max(lrs) == pytest.approx(train.lr, rel=0.05)


def test_the_first_step_of_a_session_is_not_a_step_time():
    """With train.compile=true the first step is the compilation, seconds where a later step takes milliseconds:
    taken as the step time, an 11 s first step would reserve 10 x 11 s for the eval and end a 60 s run after 2
    steps. Left out, the run goes on."""
    budget = TimeBudget(60.0, sample_tokens=8, eval_per_step=10.0, num_params=10**6)
    budget.record("step", 11.0)
    assert budget.step_s == 0.0 and not budget.spent(11.0) and not budget.is_last_step(11.0)
    budget.record("step", 0.05)
    assert budget.step_s == 0.05 and budget.reserve == pytest.approx(10 * 0.05 + 8 * 0.02 + 12e6 / 100e6)
    assert not budget.is_last_step(40.0)


def test_the_budget_reserves_the_end_and_names_the_last_step():
    budget = TimeBudget(100.0, sample_tokens=50, eval_per_step=2.0, num_params=10**7)
    budget.record("step", 9.0)  # the session's first step (a compile, a warm-up) is not taken as a step's time
    budget.record("step", 1.0)  # nothing timed yet: an eval is taken to cost 2 steps, a checkpoint 120 MB's writing
    assert budget.reserve == pytest.approx(2.0 + 50 * 0.02 + 1.2)
    budget.record("eval", 3.0), budget.record("sample", 0.5), budget.record("ckpt", 0.25)
    budget.record("eval", 2.0)  # the largest eval seen is kept
    assert budget.reserve == pytest.approx(3.75) and budget.for_steps == pytest.approx(96.25)
    assert not budget.is_last_step(94.0) and budget.is_last_step(94.5) and not budget.spent(94.5)
    assert budget.spent(95.5)
    budget.record("eval", 30.0)  # a slow eval (a busy machine): the reserve stops at a quarter of the budget
    assert budget.reserve == 25.0 and budget.for_steps == 75.0
    horizon = Horizon(None, None, budget)
    # the schedule's fraction is of the whole budget, not of for_steps, whose estimate moves as costs are measured
    assert horizon.position(50, 50.0, 1.0) == pytest.approx((0.5, 0.01))
    assert horizon.position(94, 94.5, 0.5) == (1.0, 0.0)  # the last step runs at the floor


def test_the_bar_shows_what_is_left_by_the_limit_nearer_its_end():
    """Horizon.standing, the progress bar's share and text: the budget's time left, or the steps done of max_steps
    and their time left at the pace so far; with both limits, whichever is nearer its end."""
    assert Horizon(None, None, TimeBudget(10.0, 0, 0.0, 0)).standing(176, 4.0) == (
        0.4, "176 steps, 00:06 left of 00:10")
    assert Horizon(300, 300, None).standing(100, 20.0) == (pytest.approx(1 / 3), "100/300 steps, 00:40 left")
    both = Horizon(300, 300, TimeBudget(3600.0, 0, 0.0, 0))
    assert both.standing(100, 1800.0) == (0.5, "100 steps, 30:00 left of 1:00:00")
    assert both.standing(200, 1800.0) == (pytest.approx(2 / 3), "200/300 steps, 15:00 left")


def test_a_budgeted_run_evaluates_each_fifth_of_its_steps_time_since_its_last_eval():
    """1 s steps in a 100 s budget, nothing reserved yet: an eval is due once 20 s have gone to steps since the
    last. The first eval's 30 s does not count as steps' time, so it does not make the next eval due at once; it goes
    into the reserve (capped at 25 s), and the fifth is then of the 75 s left for steps: 15 s."""
    budget = TimeBudget(100.0, sample_tokens=0, eval_per_step=0.0, num_params=0)
    runs = Horizon(None, None, budget)
    due = []
    for step in range(1, 60):
        budget.record("step", 1.0)  # the first is the session's warm-up: not a step's time
        if runs.evaluates(step, interval=1000):
            due.append(step)
            budget.record("eval", 30.0 if step == 21 else 0.0)
    assert due == [21, 36, 51]
    assert not Horizon(None, None, None).evaluates(21, 1000) and Horizon(None, None, None).evaluates(2000, 1000)


class FakeClock:
    """The training time as the test decides it: it moves only when a training forward (a micro-batch), an eval or
    a sample runs, by what each is set to cost, so a budgeted run ends at the same step on any machine, idle or busy.
    `first_forward_s`: the first forward of a session, the step that carries a compile."""

    def __init__(self, forward_s: float, first_forward_s: float | None = None, eval_s: float = 0.0,
                 sample_s: float = 0.0):
        self.now, self.forward_s, self.eval_s, self.sample_s = 0.0, forward_s, eval_s, sample_s
        self.first_forward_s = first_forward_s

    def __call__(self) -> float:
        return self.now

    def forward(self) -> None:
        self.now += self.first_forward_s if self.first_forward_s is not None else self.forward_s
        self.first_forward_s = None


def train_on_clock(run_dir: Path, overrides: list[str], clock: FakeClock, monkeypatch) -> None:
    """`python train.py <overrides> hydra.run.dir=<run_dir>` in this process, its training time read from `clock`
    (training.horizon.read_time), which the loss, the eval and the sample train.py imports advance."""
    real_loss, real_evaluate, real_complete = evaluation.next_token_loss, evaluation.evaluate, Engine.complete

    def loss(model, *args):
        if model.training:  # the loop's forward; the eval calls it too, and costs eval_s in all
            clock.forward()
        return real_loss(model, *args)

    def evaluate(*args):
        clock.now += clock.eval_s
        return real_evaluate(*args)

    def complete(*args, **kwargs):
        clock.now += clock.sample_s
        return real_complete(*args, **kwargs)

    monkeypatch.setattr(horizon, "read_time", clock)
    monkeypatch.setattr(evaluation, "next_token_loss", loss)
    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    monkeypatch.setattr(Engine, "complete", complete)
    assert train_in_process(run_dir, overrides, monkeypatch) == 0
    monkeypatch.undo()  # the next session reads a clock of its own


@pytest.fixture(scope="module")
def budgeted(workdir, tiny) -> Path:
    """Ends by its 3 s budget, at 0.01 s a forward and 0.01 s an eval (8 windows: about a step's forward); batch 6
    with the micro-batch left to choose (6, one accumulation step: 0.01 s a step)."""
    run_dir = workdir / "budgeted"
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(io.StringIO()) as printed:
        train_on_clock(run_dir, [*tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}s", "train.max_steps=null",
                                 "train.batch_size=6", "train.micro_batch_size=null"], FakeClock(0.01, eval_s=0.01),
                       monkeypatch)
    assert "6 sequences x 32 tokens per step = 1 processes x 1 accumulation x 6" in printed.getvalue()
    return run_dir


@pytest.fixture(scope="module")
def resumed(workdir, tiny, budgeted) -> Path:
    """40 steps of a budget (max_steps ends the first session), then resumed with no step cap."""
    run_dir = workdir / "resumed"
    # train.lr_decay_steps=null: the schedule follows the time alone, so the pieces make one schedule
    with pytest.MonkeyPatch.context() as monkeypatch:
        train_on_clock(run_dir, [*tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}", "train.max_steps=40",
                                 "train.lr_decay_steps=null"], FakeClock(0.01, eval_s=0.01), monkeypatch)
    assert summary(run_dir)["ended_by"] == "max_steps" and summary(run_dir)["elapsed_s"] < BUDGET_S / 2
    with pytest.MonkeyPatch.context() as monkeypatch:
        train_on_clock(run_dir, [*tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}", "train.max_steps=null",
                                 "train.resume=true"], FakeClock(0.01, eval_s=0.01), monkeypatch)
    return run_dir


def test_a_budgeted_run_ends_inside_its_budget_at_the_floor(budgeted):
    result, lines = summary(budgeted), metrics(budgeted)
    assert result["stop_reason"] == "completed" and result["ended_by"] == "time_budget"
    # 0.01 s a step; the end reserves its eval (0.2 s, once timed) and, until timed, a sample of 8 tokens
    # (0.16 s) and a checkpoint: the last step leaves room for the end, which then fills the budget but a step
    assert BUDGET_S - 0.02 < result["elapsed_s"] <= BUDGET_S
    assert result["time_budget_s"] == BUDGET_S and result["budget_fraction"] == result["elapsed_s"] / BUDGET_S
    # what the end's reserve used, as timed: an eval costs its 0.01 s on this clock, a sample and a checkpoint nothing
    assert result["end_costs_s"] == {"eval": pytest.approx(0.01, abs=1e-12), "sample": 0.0, "ckpt": 0.0}
    assert lines[-1]["lr"] == OmegaConf.load(CONFIG_DIR / "config.yaml").train.min_lr
    assert "val_bpb" in lines[-1] and lines[-1]["step"] == result["steps"] > 250
    assert all(0 < m["budget_fraction"] <= result["budget_fraction"] for m in lines)
    warm = [m["lr"] for m in lines if m["budget_fraction"] < 0.1]
    assert warm == sorted(warm) and max(m["lr"] for m in lines) <= 5e-3


def test_an_end_dearer_than_a_quarter_of_the_budget_runs_past_it_and_says_so(workdir, tiny, monkeypatch, capsys):
    """An eval of 1 s in a 3 s budget (a busy machine's): the steps keep three quarters of the budget (2.25 s, less
    the evals that come every 10 steps) and the end's eval runs past it, in summary.json and on a notice line."""
    run_dir = workdir / "over"
    capsys.readouterr()
    train_on_clock(run_dir, [*tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}", "train.max_steps=null",
                             "train.eval_interval=10"], FakeClock(0.01, eval_s=1.0), monkeypatch)
    result = summary(run_dir)
    assert result["ended_by"] == "time_budget" and result["end_costs_s"]["eval"] == pytest.approx(1.0)
    # 0.02 s a step (two micro-batches of 0.01 s): step 10 ends at 0.2 s and its eval at 1.2 s, step 20 at 1.4 s and
    # its eval at 2.4 s, past the 2.25 s the steps may take, so step 21 is the last; its eval ends at 3.42 s
    assert [(m["step"], m["elapsed_s"]) for m in metrics(run_dir)] == [
        (10, pytest.approx(0.2)), (20, pytest.approx(1.4)), (21, pytest.approx(2.42))]
    assert result["steps"] == 21 and result["elapsed_s"] == pytest.approx(3.42)
    assert result["over_budget_s"] == pytest.approx(0.42) and result["budget_fraction"] == pytest.approx(3.42 / 3)
    assert capsys.readouterr().err.splitlines()[-1] == (
        "notice: the run's end (eval 1.0 s, sample 0.0 s, ckpt 0.0 s) went 0.4 s past train.time_budget=3 s: the "
        "end's reserve is at most 25% of the budget (training/budget.py); to fit it, lower train.eval_tokens=256 "
        "(eval 1.0 s) or train.sample_tokens=8 (sample 0.0 s), or raise train.time_budget")


@pytest.fixture(scope="module")
def short(workdir, tiny) -> tuple[Path, str, str]:
    """A 10 s budget at 0.5 s a step (two forwards of 0.25 s), its evals free and its sample 1 s (estimated at 8 x
    0.02 s until timed), with FEW_LINES' intervals (200 steps) past its end: the run dir, stdout and stderr."""
    run_dir = workdir / "short"
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(io.StringIO()) as out, \
            contextlib.redirect_stderr(io.StringIO()) as err:
        train_on_clock(run_dir, [*tiny, *FEW_LINES, "train.time_budget=10", "train.max_steps=null", "latest_link=null"],
                       FakeClock(0.25, sample_s=1.0), monkeypatch)
    return run_dir, out.getvalue(), err.getvalue()


def test_a_budgeted_run_bar_shows_the_time_left(short):
    """After step 6 the clock reads 4 s: five steps of 0.5 s and the 1 s sample of step 5's eval."""
    _, _, bar = short
    assert " 40%|" in bar and "| 6 steps, 00:06 left of 00:10, loss=" in bar


def test_a_short_run_evaluates_a_few_times_and_its_end_fits_its_measured_sample(short):
    """eval_interval=200 is past the run's 15 steps, yet it evaluates four times: at step 5, once 2 s of steps (a
    fifth of the budget less the reserve) follow the warm-up step, then each 2 s of steps, and at its end. Its first
    eval samples too, so the reserve holds the sample's 1 s, not its 0.16 s estimate, and the end fits the budget."""
    run_dir, printed, _ = short
    result = summary(run_dir)
    assert [m["step"] for m in metrics(run_dir) if "val_bpb" in m] == [5, 9, 13, 15]
    assert "---- sample at step 5 ----" in printed and "---- sample at step 15 ----" in printed
    # steps 1-15 take 7.5 s and the two samples 2 s: step 15 was the last, since another would have left no room for
    # the 1 s sample (the reserve, with the checkpoint's estimate of 12 x 22,080 bytes at 100 MB/s)
    assert result["end_costs_s"]["sample"] == 1.0 and result["elapsed_s"] == 9.5 and "over_budget_s" not in result


def test_an_overrun_is_put_down_to_the_cap_only_when_the_end_costs_more_than_it():
    # a 60 s budget caps the reserve at 15 s: an end of 15.5 s could not have fitted; one of 14.5 s had its reserve
    assert overrun_reason({"eval": 10.0, "sample": 5.0, "ckpt": 0.5}, 60) == (
        "the end's reserve is at most 25% of the budget")
    assert overrun_reason({"eval": 10.0, "sample": 4.0, "ckpt": 0.5}, 60) == "the end took longer than its reserve"


def test_a_resumed_budgeted_run_ends_when_the_whole_budget_is_spent(resumed):
    result, lines = summary(resumed), metrics(resumed)
    assert result["ended_by"] == "time_budget" and result["steps"] > 40
    # the resumed session samples with its first eval, so its reserve holds the sample as timed (0 s on this clock),
    # not its estimate (8 tokens x SAMPLE_S_PER_TOKEN): the budget leaves a step of 0.02 s at most unused, and the
    # estimate of the checkpoint (12 x 22,080 bytes at 100 MB/s), which no checkpoint before the end measured
    assert BUDGET_S - 0.02 - 0.003 <= result["elapsed_s"] <= BUDGET_S
    assert [m["step"] for m in lines] == sorted({m["step"] for m in lines})  # one line per step, no gap in order
    assert lines[-1]["lr"] == OmegaConf.load(CONFIG_DIR / "config.yaml").train.min_lr
    lrs = [m["lr"] for m in lines]
    decaying = lrs[lrs.index(max(lrs)):]  # from the peak on, across the resume: one cosine, never rising again
    assert len(decaying) > 3 and all(later <= earlier * (1 + 1e-9) for earlier, later in zip(decaying, decaying[1:]))


def test_max_steps_under_the_default_budget_logs_the_step_schedule(workdir, tiny, monkeypatch, capsys):
    """tiny_run's 8 steps with the default 5-minute budget left on: the same lrs, step for step, as with no budget
    (a warm-up over 2 steps, then the cosine down to min_lr at step 8), and the start line says which limit ends it."""
    run_dir = workdir / "steps-under-budget"
    train_on_clock(run_dir, [*tiny, "train.time_budget=5m", "latest_link=null"], FakeClock(1.0), monkeypatch)
    printed = capsys.readouterr()
    assert "ends at train.max_steps=8 or when train.time_budget=300 s is spent, whichever comes first" in printed.out
    # 2 s a step (two forwards of 1 s): the steps are nearer their end than the 300 s, so the bar counts them
    assert " 50%|" in printed.err and "| 4/8 steps, 00:08 left, loss=" in printed.err
    train_on_clock(workdir / "steps-only", [*tiny, "latest_link=null"], FakeClock(1.0), monkeypatch)
    lrs = [m["lr"] for m in metrics(run_dir)]
    assert lrs == [m["lr"] for m in metrics(workdir / "steps-only")]
    peak = OmegaConf.load(CONFIG_DIR / "config.yaml").train.lr
    assert lrs[:2] == pytest.approx([peak / 2, peak], rel=1e-12)
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(lrs[1:], lrs[2:]))  # the cosine, down
    assert lrs[-1] < peak / 5
    assert summary(run_dir)["ended_by"] == "max_steps"


def test_a_first_step_that_compiles_does_not_shorten_the_run(workdir, tiny, monkeypatch):
    """train.compile=true makes the first step the compilation: seconds, where a later step takes milliseconds.
    Here the first forward costs 3 s of a 6 s budget. Taken as the step time, it would reserve 10 x 3 s for the
    eval and end the run after its first step; left out, the run trains to its budget."""
    run_dir = workdir / "compile-like"
    train_on_clock(run_dir, [*tiny, *FEW_LINES, "train.time_budget=6", "train.max_steps=null", "latest_link=null",
                             "train.micro_batch_size=null"], FakeClock(0.01, first_forward_s=3.0), monkeypatch)
    result = summary(run_dir)
    assert result["first_step_s"] == pytest.approx(3.0) and result["ended_by"] == "time_budget"
    assert result["elapsed_s"] > 6 - 0.02 and result["steps"] > 250


def test_the_latest_link_points_at_the_newest_run(workdir, budgeted, resumed):
    latest = workdir / "latest"
    assert latest.is_symlink() and not os.path.isabs(os.readlink(latest))
    assert latest.resolve() == resumed.resolve() != budgeted.resolve()
