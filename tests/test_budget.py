"""train.time_budget: the duration setting, the schedule as a function of elapsed time, and budgeted runs
of train.py end to end (one that ends by its budget, one resumed across the budget), plus the batch
sizes that just work (train.micro_batch_size=null) and the outputs/latest link."""
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data_helpers import metrics, run_train as train, summary
from model.config import ConfigError
from training.budget import TimeBudget, parse_duration
from training.optim import lr_at, lr_at_fraction
from training.settings import CONFIG_DIR

BUDGET_S = 3.0
# The margin a budgeted run may finish past its budget in these tests: the reserve for the end is the
# largest eval/sample/checkpoint time seen, so only a step or an end slower than any before it overshoots
# (docs/training.md reports the overshoot measured on real runs).
MARGIN_S = 1.0
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


@pytest.mark.parametrize("warmup, steps, decay", [(30, 300, 300), (0, 50, 50), (4, 14, 14), (7, 40, 25)])
def test_the_time_schedule_is_the_step_schedule_when_time_is_proportional_to_steps(warmup, steps, decay):
    """Steps of equal time, a budget that holds `decay` of them: the fraction before step k is k / decay,
    a step is 1 / decay of it, and the warm-up is warmup / decay."""
    train = OmegaConf.create({"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": warmup, "lr_decay_steps": decay})
    for step in range(steps):
        done, one_step = step / decay, 1 / decay
        assert lr_at_fraction(done, one_step, warmup / decay, train) == pytest.approx(lr_at(step, train), rel=1e-12)


def test_the_budget_reserves_the_end_and_names_the_last_step():
    budget = TimeBudget(100.0, sample_tokens=50, eval_per_step=2.0, num_params=10**7)
    budget.record("step", 1.0)  # nothing timed yet: an eval is taken to cost 2 steps, a checkpoint 120 MB's writing
    assert budget.reserve == pytest.approx(2.0 + 50 * 0.02 + 1.2)
    budget.record("eval", 3.0), budget.record("sample", 0.5), budget.record("ckpt", 0.25)
    budget.record("eval", 2.0)  # the largest eval seen is kept
    assert budget.reserve == pytest.approx(3.75) and budget.for_steps == pytest.approx(96.25)
    assert not budget.is_last_step(94.0) and budget.is_last_step(94.5) and not budget.spent(94.5)
    assert budget.spent(95.5)
    assert budget.fraction(48.125, 0.9625) == pytest.approx((0.5, 0.01))


@pytest.fixture(scope="module")
def budgeted(workdir, tiny) -> Path:
    """Ends by its budget; batch 6 with the micro-batch left to choose (6, one accumulation step)."""
    run_dir = workdir / "budgeted"
    done = train(run_dir, *tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}s", "train.max_steps=null",
                 "train.batch_size=6", "train.micro_batch_size=null")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "6 sequences x 32 tokens per step = 1 processes x 1 accumulation x 6" in done.stdout
    return run_dir


@pytest.fixture(scope="module")
def resumed(workdir, tiny, budgeted) -> Path:
    """40 steps of a budget (max_steps ends the first session), then resumed with no step cap."""
    run_dir = workdir / "resumed"
    first = train(run_dir, *tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}", "train.max_steps=40")
    assert first.returncode == 0, first.stderr[-3000:]
    assert summary(run_dir)["ended_by"] == "max_steps" and summary(run_dir)["elapsed_s"] < BUDGET_S / 2
    second = train(run_dir, *tiny, *FEW_LINES, f"train.time_budget={BUDGET_S}", "train.max_steps=null",
                   "train.resume=true")
    assert second.returncode == 0, second.stderr[-3000:]
    return run_dir


def test_a_budgeted_run_ends_inside_its_budget_at_the_floor(budgeted):
    result, lines = summary(budgeted), metrics(budgeted)
    assert result["stop_reason"] == "completed" and result["ended_by"] == "time_budget"
    assert BUDGET_S - MARGIN_S < result["elapsed_s"] <= BUDGET_S + MARGIN_S
    assert result["time_budget_s"] == BUDGET_S and result["budget_fraction"] == result["elapsed_s"] / BUDGET_S
    assert lines[-1]["lr"] == OmegaConf.load(CONFIG_DIR / "config.yaml").train.min_lr
    assert "val_bpb" in lines[-1] and lines[-1]["step"] == result["steps"] > 100
    assert all(0 < m["budget_fraction"] <= result["budget_fraction"] for m in lines)
    warm = [m["lr"] for m in lines if m["budget_fraction"] < 0.1]
    assert warm == sorted(warm) and max(m["lr"] for m in lines) <= 5e-3


def test_a_resumed_budgeted_run_ends_when_the_whole_budget_is_spent(resumed):
    result, lines = summary(resumed), metrics(resumed)
    assert result["ended_by"] == "time_budget" and result["steps"] > 40
    assert BUDGET_S - MARGIN_S < result["elapsed_s"] <= BUDGET_S + MARGIN_S
    assert [m["step"] for m in lines] == sorted({m["step"] for m in lines})  # one line per step, no gap in order
    assert lines[-1]["lr"] == OmegaConf.load(CONFIG_DIR / "config.yaml").train.min_lr


def test_the_latest_link_points_at_the_newest_run(workdir, budgeted, resumed):
    latest = workdir / "latest"
    assert latest.is_symlink() and not os.path.isabs(os.readlink(latest))
    assert latest.resolve() == resumed.resolve() != budgeted.resolve()

