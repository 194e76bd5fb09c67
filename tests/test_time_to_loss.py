"""scripts/time_to_loss.py, the speedrun's benchmark: the crossing read from budgets, the runs kept, a failed run
named, and nanoGPT's log read (a stand-in clone: nanoGPT is not installed here, so its two scripts print its lines)."""
import json
import math

import pytest

from data_helpers import ROOT, run_script, stages_in_forks, summary, write_corpus
from errors import UsageError
from scripts import time_to_loss

SCRIPT = ROOT / "scripts" / "time_to_loss.py"


@pytest.mark.parametrize("finals,expected", [
    ({10: 3.0, 20: 2.5, 40: 2.0}, (10 * 2 ** 0.6, "")),  # 2.7 is 0.6 of the way from 10 s to 20 s, on log seconds
    ({10: 3.0, 20: 2.8, 40: 2.6}, (math.exp(math.log(20) + 0.5 * math.log(2)), "")),
    ({10: 2.5, 20: 2.0}, (None, "<= 10.0")), ({10: 3.5, 20: 3.0}, (None, "> 20.0"))])
def test_the_seconds_to_the_target_lie_between_the_budgets_that_straddle_it(finals, expected):
    seconds, why = time_to_loss.seconds_to(2.7, finals)
    assert why == expected[1] and (seconds == expected[0] is None or seconds == pytest.approx(expected[0], rel=1e-12))


def test_each_budget_trains_once_a_rerun_keeps_it_and_a_failed_preset_is_named(workdir):
    corpus = write_corpus(workdir / "corpus.txt")
    # a 1-layer d 32 model that ends by steps (3), its budgets too long to end it: the same run at each budget
    tiny = [f"data.cache_dir={workdir / 'cache'}", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
            "model.n_kv_heads=1", "model.context_length=32", "train.batch_size=8", "train.max_steps=3",
            "train.eval_tokens=256", "train.sample_tokens=4"]
    args = ["--text", str(corpus), "--out", str(workdir / "ttl"), "--presets", "llama_tiny", "no_such_preset",
            "--budgets", "500", "--equal-time", "900", "--seeds", "1", "--vocab-size", "300", "--target", "20", "--",
            *tiny]
    with stages_in_forks():  # each run a fork of this process, not a new interpreter
        first = run_script(SCRIPT, *args)
        assert first.returncode == 1
        bad = [workdir / "ttl" / "no_such_preset" / budget / "seed0" for budget in ("b500", "b900")]
        assert first.stderr.splitlines()[-1] == f"error: 2 runs ended without a result: {bad[0]}, {bad[1]}"
        results = json.loads((workdir / "ttl" / "time_to_loss.json").read_text())
        ours = results["presets"]["llama_tiny"]
        runs = {b: summary(workdir / "ttl" / "llama_tiny" / f"b{b}" / "seed0") for b in (500, 900)}
        assert ours["runs_by_budget"] == {f"{b}": {"0": {key: runs[b][key] for key in (
            "elapsed_s", "val_bpb", "steps", "tokens_per_s")}} for b in (500, 900)}
        assert ours["equal_time_bits"] == [runs[900]["val_bpb"]] and runs[500]["steps"] == 3
        # 20 bits: above the first run's end already, which trained for its elapsed_s
        assert ours["not_straddled"] == [f"<= {runs[500]['elapsed_s']:.1f}"]
        assert f"| llama_tiny | <= {runs[500]['elapsed_s']:.1f} | - | " in first.stdout
        again = run_script(SCRIPT, *args)
        assert again.returncode == 1
        assert "llama_tiny, 500 s" not in again.stdout and "no_such_preset, 500 s, seed 0" in again.stdout


def test_nanogpts_time_is_its_loop_and_its_loss_in_bits(tmp_path):
    clone = tmp_path / "nanoGPT"
    (clone / "data" / "shakespeare_char").mkdir(parents=True)
    (clone / "data" / "shakespeare_char" / "prepare.py").write_text("open('val.bin', 'w').write('')\n")
    (clone / "train.py").write_text(  # nanoGPT's own output lines, as its train.py prints them
        "print('step 0: train loss 4.1676, val loss 4.1649')\n"
        "for i in range(3): print(f'iter {i}: loss 2.0, time {100 + i}.50ms, mfu 0.03%')\n"
        "print('step 2000: train loss 1.7648, val loss 1.8857')\n")
    text = tmp_path / "input.txt"
    text.write_text("First Citizen:\n")
    time_to_loss.prepare_nanogpt(clone, text)
    assert (clone / "data" / "shakespeare_char" / "input.txt").read_text() == "First Citizen:\n"
    failed = []
    result = time_to_loss.nanogpt_run(clone, tmp_path / "runs" / "run0", failed)
    assert failed == [] and result["iters"] == 3 and result["train_s"] == pytest.approx(0.3045, abs=1e-12)
    assert result["val_bits"] == pytest.approx(1.8857 / math.log(2), rel=1e-12) == time_to_loss.NANOGPT_TARGET
    text.write_text("Second Citizen:\n")
    with pytest.raises(UsageError, match="is another text than --text"):
        time_to_loss.prepare_nanogpt(clone, text)
