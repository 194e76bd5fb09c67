"""compare.py on run dirs written here the way train.py writes them: the table's numbers against
means and stds computed independently, seeds grouped into variants, incomplete runs reported
without a crash, and the plot written; and on real tiny runs of train.py, the warnings that a comparison is not
fair."""
import json
import math
import shutil
import signal
import time

import numpy as np
import pytest
import yaml
from matplotlib.image import imread
from omegaconf import OmegaConf

import compare
from data_helpers import ROOT, run_script, run_train, start_script, summary
from settings import compose_config
from study.fairness import SPEED_SPREAD, measured_rate
from study.plots import measure_curve
from study.runs import find_run_dirs, load_run
from study.variants import group_runs

MAX_STEPS = 6
TOKENS_PER_STEP = 1000


def write_run(run_dir, variant, seed, final_bpb, steps=MAX_STEPS, norm="rmsnorm", tokens_per_s=5000.0,
              summary=True, stop_reason="completed"):
    """A run dir: config.yaml, summary.json and metrics.jsonl with an eval every 2 steps whose
    bpb falls linearly to final_bpb; val_loss = 2 * val_bpb (any constant ratio will do)."""
    run_dir.mkdir(parents=True)
    config = {"model": {"norm": norm, "d_model": 32}, "train": {"seed": seed, "max_steps": MAX_STEPS, "lr": 0.01},
              "wandb": {"group": "ablation", "name": f"ablation-{variant}-seed{seed}"}}
    if variant is not None:
        config["variant"] = variant
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if summary:
        (run_dir / "summary.json").write_text(json.dumps(
            {"num_params": 1234567, "kv_cache_bytes_per_token": 512, "vocab_size": 64, "stop_reason": stop_reason,
             "tokens_per_s": tokens_per_s}))
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step, "tokens": step * TOKENS_PER_STEP, "train_loss": 3.0, "lr": 0.01, "grad_norm": 1.0,
                  "tokens_per_s": tokens_per_s + step, "elapsed_s": step * 0.2}
        if step % 2 == 0:
            bpb = final_bpb + 0.1 * (MAX_STEPS - step)
            record |= {"val_loss": 2 * bpb, "val_bpb": bpb}
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def table_rows(output: str) -> dict[str, dict[str, str]]:
    """The markdown table's rows as variant name -> {column header: cell}."""
    lines = output.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def mean_pm_std(cell: str) -> tuple[float, float]:
    mean, std = cell.split(" ± ")
    return float(mean), float(std)


FINAL_BPB = {"baseline": [2.00, 2.02, 2.04], "layernorm": [2.10, 2.12, 2.11], "mha": [2.01, 2.04, 2.02]}


@pytest.fixture
def sweep(tmp_path):
    """Run dirs grouped by variant, <variant>/seed<N>/ (compare.py reads any layout)."""
    for variant, finals in FINAL_BPB.items():
        for seed, bpb in enumerate(finals):
            write_run(tmp_path / "multirun" / variant / f"seed{seed}", variant, seed, bpb, tokens_per_s=5000 + 100 * seed)
    write_run(tmp_path / "multirun" / "relu" / "seed0", "relu", 0, 2.5)  # one seed only
    return tmp_path / "multirun"


def test_table_means_stds_and_differences(sweep, tmp_path, capsys):
    png = tmp_path / "plots" / "ablation.png"
    compare.main([str(sweep), "--plot", str(png)])
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["baseline", "layernorm", "mha", "relu"]  # baseline first, then as found

    for variant, finals in FINAL_BPB.items():
        cells = rows[variant]
        assert cells["runs (n)"] == "3"
        assert cells["params"] == "1,234,567" and cells["KV cache bytes/token"] == "512"
        assert mean_pm_std(cells["val bpb"]) == pytest.approx((np.mean(finals), np.std(finals, ddof=1)), abs=1e-4)
        assert mean_pm_std(cells["val loss"]) == pytest.approx((2 * np.mean(finals), 2 * np.std(finals, ddof=1)), abs=1e-4)
        # the mean of the runs' own rates (summary.json: 5000, 5100, 5200), not of the logged window rates
        assert cells["tokens/s"] == "5,100"
        # what each run trained: 6 steps of 1,000 tokens, its last logged elapsed_s 6 x 0.2
        assert (cells["steps"], cells["tokens (M)"], cells["elapsed s"]) == ("6", "0.01", "1")

    base = np.array(FINAL_BPB["baseline"])
    for variant, beyond in (("layernorm", "yes"), ("mha", "no")):
        ours = np.array(FINAL_BPB[variant])
        noise = 2 * math.sqrt(ours.var(ddof=1) / 3 + base.var(ddof=1) / 3)
        assert float(rows[variant]["Δ bpb vs baseline"]) == pytest.approx(ours.mean() - base.mean(), abs=1e-4)
        assert rows[variant]["beyond seed noise?"] == f"{beyond} (2σ {noise:.4f})"
    # layernorm: +0.09 against 2σ = 0.025; mha: +0.0033 against 0.038
    assert rows["relu"]["val bpb"] == "2.5000" and rows["relu"]["Δ bpb vs baseline"] == "+0.4800" and rows["relu"]["beyond seed noise?"] == "n/a"
    assert rows["baseline"]["Δ bpb vs baseline"] == "(baseline)" and rows["baseline"]["beyond seed noise?"] == ""

    image = imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert not list(png.parent.glob("*tmp*"))  # the atomic write left no temporary file


def test_incomplete_runs_are_reported_not_averaged(sweep, capsys):
    missing = sweep / "baseline" / "seed3"
    write_run(missing, "baseline", 3, 9.0)
    (missing / "metrics.jsonl").unlink()
    truncated = sweep / "baseline" / "seed4"
    write_run(truncated, "baseline", 4, 9.0)
    text = (truncated / "metrics.jsonl").read_text()
    (truncated / "metrics.jsonl").write_text(text[: text.rindex('"val_bpb"') + 5])  # killed mid-line
    write_run(sweep / "layernorm" / "seed3", "layernorm", 3, 9.0, steps=MAX_STEPS - 2)  # stopped early
    write_run(sweep / "layernorm" / "seed4", "layernorm", 4, 9.0, steps=1)  # before the first eval
    write_run(sweep / "mha" / "seed3", "mha", 3, 9.0, stop_reason="non-finite loss at step 6")
    write_run(sweep / "postnorm" / "seed0", "postnorm", 0, 9.0, steps=3)  # every run of a variant

    compare.main([str(sweep)])
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows["baseline"]["runs (n)"] == "3 + 2 incomplete"
    assert rows["layernorm"]["runs (n)"] == "3 + 2 incomplete"
    assert rows["mha"]["runs (n)"] == "3 + 1 incomplete"
    for variant, finals in FINAL_BPB.items():  # the 9.0s are not in the means
        assert mean_pm_std(rows[variant]["val bpb"]) == pytest.approx((np.mean(finals), np.std(finals, ddof=1)), abs=1e-4)
    assert rows["postnorm"]["runs (n)"] == "0 + 1 incomplete"
    assert rows["postnorm"]["val loss"] == rows["postnorm"]["val bpb"] == "incomplete"
    assert rows["postnorm"]["Δ bpb vs baseline"] == rows["postnorm"]["beyond seed noise?"] == "n/a"
    assert f"{missing}: no metrics.jsonl" in out
    assert f"{truncated}: metrics.jsonl line {MAX_STEPS} is not JSON" in out
    assert f"{sweep / 'layernorm' / 'seed3'}: stopped at step {MAX_STEPS - 2} of train.max_steps={MAX_STEPS}" in out
    assert f"{sweep / 'layernorm' / 'seed4'}: no val_bpb" in out
    assert f"{sweep / 'mha' / 'seed3'}: stopped: non-finite loss at step 6" in out


def test_runs_without_a_variant_key_are_grouped_by_config_and_named_by_their_difference(tmp_path, capsys):
    for seed, (rms, layer) in enumerate([(1.50, 1.60), (1.52, 1.64)]):
        write_run(tmp_path / f"rms{seed}", None, seed, rms)
        write_run(tmp_path / f"ln{seed}", None, seed, layer, norm="layernorm", summary=False)
    compare.main([str(tmp_path), "--baseline", "model.norm=rmsnorm"])
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == {"model.norm=rmsnorm", "model.norm=layernorm"}
    assert rows["model.norm=layernorm"]["runs (n)"] == "2"
    assert float(rows["model.norm=layernorm"]["Δ bpb vs baseline"]) == pytest.approx(1.62 - 1.51)
    assert rows["model.norm=layernorm"]["params"] == rows["model.norm=layernorm"]["KV cache bytes/token"] == "?"  # no summary.json


def test_unknown_baseline_prints_the_names_to_choose_from(sweep, capsys):
    compare.main([str(sweep), "--baseline", "llama"])
    out = capsys.readouterr().out
    assert table_rows(out)["layernorm"]["Δ bpb vs baseline"] == ""
    assert "no variant named 'llama'" in out and "'layernorm'" in out


@pytest.mark.parametrize("make_dir", [lambda p: p / "absent", lambda p: p])
def test_a_dir_without_runs_is_a_one_line_error(tmp_path, capsys, make_dir):
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(make_dir(tmp_path))])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: DIR ") and err.count("\n") == 1


def write_lr_run(run_dir, variant, lr, final_bpb, diverged=False):
    """A run of a learning-rate sweep: write_run's layout at train.lr=lr; a diverged one stops at step 3
    with no eval after its first (as train.py leaves it) and summary.json saying so."""
    write_run(run_dir, variant, 0, final_bpb, steps=3 if diverged else MAX_STEPS,
              stop_reason="diverged at step 3" if diverged else "completed")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["train"] |= {"lr": lr, "min_lr": lr / 10}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    summary = json.loads((run_dir / "summary.json").read_text()) | {"unigram_val_bpb": 2.6}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_lr_sensitivity_best_lr_and_largest_trained_lr_against_a_hand_computation(tmp_path, capsys):
    # write_run: vocab 64 and val_loss = 2 * val_bpb, so the loss at initialisation is ln(64) / 2 = 2.0794 bpb
    finals = {"baseline": {1e-3: 2.00, 2e-3: 1.80, 4e-3: None},  # None: diverged, counts at 2.0794
              "postnorm": {1e-3: 2.50, 2e-3: 1.90, 4e-3: 1.95}}   # 2.50 is worse than init: capped at 2.0794
    for variant, curve in finals.items():
        for lr, bpb in curve.items():
            write_lr_run(tmp_path / variant / f"lr{lr}", variant, lr, bpb or 9.0, diverged=bpb is None)
    for seed, bpb in ((1, 1.84), (2, 1.82)):  # two more seeds at the baseline's best lr
        write_lr_run(tmp_path / "baseline" / "lr0.002" / f"seed{seed}", "baseline", 2e-3, bpb)
        config = yaml.safe_load((tmp_path / "baseline" / "lr0.002" / f"seed{seed}" / "config.yaml").read_text())
        config["train"]["seed"] = seed
        (tmp_path / "baseline" / "lr0.002" / f"seed{seed}" / "config.yaml").write_text(yaml.safe_dump(config))

    compare.main([str(tmp_path), "--lr-plot", str(tmp_path / "lr.png"), "--json", str(tmp_path / "lr.json")])
    out = capsys.readouterr().out
    rows = table_rows(out)
    init = math.log(64) / 2
    assert rows["baseline"]["best lr"] == "0.002" and rows["postnorm"]["best lr"] == "0.002"
    assert float(rows["baseline"]["LR sensitivity"]) == pytest.approx((2.00 + 1.80 + init) / 3 - 1.80, abs=1e-4)  # 0.1598
    assert float(rows["postnorm"]["LR sensitivity"]) == pytest.approx((init + 1.90 + 1.95) / 3 - 1.90, abs=1e-4)  # 0.0431
    assert rows["baseline"]["runs at best lr (n)"] == "3" and mean_pm_std(rows["baseline"]["val bpb at best lr"]) == pytest.approx(
        (np.mean([1.80, 1.84, 1.82]), np.std([1.80, 1.84, 1.82], ddof=1)), abs=1e-4)
    assert float(rows["postnorm"]["Δ bpb vs baseline"]) == pytest.approx(1.90 - 1.82, abs=1e-4) and rows["postnorm"]["beyond seed noise?"] == "n/a"
    # trains: below the unigram level 2.6 - 0.1 = 2.5; baseline's 4e-3 diverged, postnorm's 4e-3 is 1.95
    assert rows["baseline"]["largest lr that trains"] == "0.002" and rows["postnorm"]["largest lr that trains"] == "0.004"
    # of the grid's 3: postnorm's 2.50 is below init (capped there) but not below 2.5, so it does not train
    assert (rows["baseline"]["grid that trains"], rows["postnorm"]["grid that trains"]) == ("2/3", "2/3")
    assert "| baseline | 2.0000 | 1.8000 | diverged |" in out
    numbers = json.loads((tmp_path / "lr.json").read_text())
    assert numbers["init_bpb"] == pytest.approx(init) and numbers["variants"]["baseline"]["diverged"] == [4e-3]
    assert imread(tmp_path / "lr.png").shape[1] > 600


def test_a_muon_lr_that_follows_train_lr_keeps_the_sweep_one_line(tmp_path, capsys):
    """optim=muon's train.muon_lr is train.lr unless set, so a sweep of train.lr moves both: those runs are one
    variant's line, not one variant per learning rate."""
    for lr, bpb in {1e-3: 2.0, 2e-3: 1.7, 4e-3: 1.8}.items():
        run_dir = tmp_path / f"lr{lr}"
        write_lr_run(run_dir, "muon", lr, bpb)
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        config["train"] |= {"optimizer": "muon", "muon_lr": lr}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    compare.main([str(tmp_path), "--json", str(tmp_path / "lr.json")])
    lines = json.loads((tmp_path / "lr.json").read_text())["variants"]
    assert {name: line["final_bpb_seed0"] for name, line in lines.items()} == {
        "muon": {"0.001": 2.0, "0.002": 1.7, "0.004": 1.8}}
    assert lines["muon"]["best_lr"] == 2e-3
    capsys.readouterr()


def test_lr_outputs_without_a_learning_rate_sweep_are_a_one_line_error(sweep, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(sweep), "--lr-plot", str(tmp_path / "lr.png")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --lr-plot/--json need a learning-rate sweep") and err.count("\n") == 1


def test_runs_that_trained_unequal_tokens_show_it(tmp_path, capsys):
    """Two 5-minute runs of one config on a machine busy for one of them: 93 and 340 steps. The table shows
    the range, and a note says the rows are not like with like."""
    for seed, steps in ((0, 93), (1, 340)):
        write_run(tmp_path / "runs" / f"seed{seed}", None, seed, 2.0, steps=steps)
        config = yaml.safe_load((tmp_path / "runs" / f"seed{seed}" / "config.yaml").read_text())
        config["train"] |= {"max_steps": None, "time_budget": "5m"}
        (tmp_path / "runs" / f"seed{seed}" / "config.yaml").write_text(yaml.safe_dump(config))
    compare.main([str(tmp_path / "runs")])
    out = capsys.readouterr().out
    (row,) = table_rows(out).values()
    assert (row["runs (n)"], row["steps"], row["tokens (M)"], row["elapsed s"]) == ("2", "93-340", "0.09-0.34", "19-68")
    assert "warning: the runs trained unequal numbers of tokens (93,000-340,000): runs of other lengths" in out


def write_budgeted_run(run_dir, variant, seed, final_bpb, steps, seconds=60):
    """A run that train.time_budget ended after `steps` steps, with its last eval at that step."""
    write_run(run_dir, variant, seed, final_bpb, steps=steps)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["train"] |= {"max_steps": None, "time_budget": seconds}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    summary = json.loads((run_dir / "summary.json").read_text())
    summary |= {"ended_by": "time_budget", "time_budget_s": float(seconds), "elapsed_s": seconds - 0.5}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics[-1] |= {"val_loss": 2 * final_bpb, "val_bpb": final_bpb}  # train.py evaluates the last step
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


def test_an_equal_time_comparison_against_a_hand_computation(tmp_path, capsys):
    """Three seeds a side trained for one 60 s budget; relu is faster, so it reaches more steps (8, 8, 5)."""
    for seed, bpb in enumerate([2.40, 2.42, 2.44]):
        write_budgeted_run(tmp_path / "baseline" / f"seed{seed}", "baseline", seed, bpb, steps=6)
    for seed, (bpb, steps) in enumerate([(2.30, 8), (2.33, 8), (2.36, 5)]):
        write_budgeted_run(tmp_path / "relu" / f"seed{seed}", "relu", seed, bpb, steps=steps)
    compare.main([str(tmp_path), "--plot", str(tmp_path / "time.png")])
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert (rows["baseline"]["steps"], rows["relu"]["steps"], rows["relu"]["elapsed s"]) == ("6", "5-8", "60")
    assert mean_pm_std(rows["relu"]["val bpb"]) == pytest.approx((2.33, 0.03), abs=1e-4)
    # Δ = 2.33 - 2.42 = -0.09; two standard errors: 2 sqrt(0.02^2 / 3 + 0.03^2 / 3) = 0.0416
    assert rows["relu"]["Δ bpb vs baseline"] == "-0.0900" and rows["relu"]["beyond seed noise?"] == "yes (2σ 0.0416)"
    assert "equal wall-clock: every run trained for train.time_budget=60 s" in out and "note:" not in out
    # the plot's x is seconds: relu's evals at steps 2 and 4 and the three last evals (steps 8, 8, 5) are 3 points;
    # step 6, which seed 2 never reached, would average two runs of three
    relu = next(v for v in group_runs([load_run(d) for d in find_run_dirs(tmp_path)])
                if v.name == "relu")
    xs, mean, low, high = measure_curve(relu, "elapsed_s", "val_bpb")
    assert xs == pytest.approx([0.4, 0.8, (1.6 + 1.6 + 1.0) / 3])
    assert (mean[-1], low[-1], high[-1]) == pytest.approx((2.33, 2.30, 2.36))
    assert imread(tmp_path / "time.png").shape[1] > 600


def test_a_recorded_sweep_comes_back_beside_new_lines(tmp_path, capsys):
    """compare.py --json, the run dirs deleted, then a new line in a new dir with --recorded: the recorded
    lines keep their best lr, seeds and LR sensitivity; a new line of a recorded name replaces it."""
    old, new = tmp_path / "old", tmp_path / "new"
    for variant, curve in {"baseline": {1e-3: 2.00, 2e-3: 1.80}, "postnorm": {1e-3: 2.50, 2e-3: 2.60}}.items():
        for lr, bpb in curve.items():
            write_lr_run(old / variant / f"lr{lr}", variant, lr, bpb)
    for seed, bpb in ((1, 1.84), (2, 1.82)):
        write_lr_run(old / "baseline" / "lr0.002" / f"seed{seed}", "baseline", 2e-3, bpb)
        config = yaml.safe_load((old / "baseline" / "lr0.002" / f"seed{seed}" / "config.yaml").read_text())
        config["train"]["seed"] = seed
        (old / "baseline" / "lr0.002" / f"seed{seed}" / "config.yaml").write_text(yaml.safe_dump(config))
    compare.main([str(old), "--json", str(tmp_path / "record.json")])
    before = table_rows(capsys.readouterr().out)
    shutil.rmtree(old)
    for lr, bpb in {1e-3: 2.10, 2e-3: 1.70}.items():  # the new line, and postnorm measured again
        write_lr_run(new / "learned" / f"lr{lr}", "learned", lr, bpb)
        write_lr_run(new / "postnorm" / f"lr{lr}", "postnorm", lr, bpb + 0.5)
    compare.main([str(new), "--recorded", str(tmp_path / "record.json"), "--lr-plot", str(tmp_path / "lr.png")])
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["baseline", "learned", "postnorm"]
    for column in ("best lr", "LR sensitivity", "runs at best lr (n)", "val bpb at best lr"):
        assert rows["baseline"][column] == before["baseline"][column]
    assert rows["baseline"]["runs at best lr (n)"] == "3" and rows["baseline"]["steps"] == "?"  # bpb only
    assert rows["postnorm"]["val bpb at best lr"] == "2.2000" and rows["learned"]["best lr"] == "0.002"
    assert float(rows["learned"]["Δ bpb vs baseline"]) == pytest.approx(1.70 - 1.82, abs=1e-4)


def change_config(run_dir, section, **values):
    """Sets config.yaml's <section>.<key> to each value, as an override on train.py's command line would."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config[section] |= values
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))


def test_a_variant_is_named_by_its_own_differences_not_by_every_setting_that_differs(tmp_path, capsys):
    """Four runs as README's commands leave them in outputs/: each changes one setting of the default. Named by
    every setting that differs, each would be `model.d_model=..., model.norm=..., train.batch_size=...`."""
    runs = tmp_path / "outputs"
    write_run(runs / "12-00-00", None, 0, 2.00)
    write_run(runs / "12-10-00", None, 0, 2.10, norm="layernorm")
    write_run(runs / "12-20-00", None, 0, 1.95)
    change_config(runs / "12-20-00", "train", batch_size=32)
    write_run(runs / "12-30-00", None, 0, 1.90)
    change_config(runs / "12-30-00", "model", d_model=64)
    compare.main([str(runs), "--baseline", "12-00-00"])  # the run with the settings the others share: by its dir
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["12-00-00", "model.norm=layernorm", "train.batch_size=32", "model.d_model=64"]
    assert float(rows["train.batch_size=32"]["Δ bpb vs baseline"]) == pytest.approx(-0.05)


def test_two_sweeps_of_one_config_stay_apart_and_are_named_by_where_they_are(tmp_path, capsys):
    """README's two multiruns, train.lr=1e-3,3e-3 and the same under joblib with train.threads=1: each a seed-0
    sweep of one config. Merged, each lr would be `n=2` of two seed-0 runs, under the name `train.lr=0.001`."""
    day = tmp_path / "multirun" / "2025-01-01"
    finals = {"12-00-00": {1e-3: 2.00, 3e-3: 1.90}, "12-05-00": {1e-3: 2.04, 3e-3: 1.96}}
    for sweep_dir, curve in finals.items():
        (day / sweep_dir / ".multirun").mkdir(parents=True)  # training/multirun.py's records: a multirun's dir
        for lr, bpb in curve.items():
            write_lr_run(day / sweep_dir / f"train.lr={lr}", None, lr, bpb)
            change_config(day / sweep_dir / f"train.lr={lr}", "train", threads=1 if sweep_dir == "12-05-00" else None)
    compare.main([str(tmp_path / "multirun"), "--json", str(tmp_path / "lr.json")])
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == {"12-00-00", "12-05-00"}  # where each is, below the dir they share
    for sweep_dir, curve in finals.items():
        row = rows[sweep_dir]
        assert (row["best lr"], row["runs at best lr (n)"]) == ("0.003", "1")
        assert float(row["val bpb at best lr"]) == pytest.approx(curve[3e-3])
    numbers = json.loads((tmp_path / "lr.json").read_text())["variants"]
    assert numbers["12-05-00"]["final_bpb_seed0"] == {"0.001": 2.04, "0.003": 1.96}

    compare.main([str(day / "12-00-00")])  # one sweep alone: its dir's name, not its first run's (train.lr=0.001)
    assert list(table_rows(capsys.readouterr().out)) == ["12-00-00"]


def test_a_variant_whose_runs_evaluated_once_is_a_point_on_the_curves(tmp_path, capsys):
    write_run(tmp_path / "once" / "seed0", "once", 0, 2.3, steps=MAX_STEPS)
    metrics = [json.loads(line) for line in (tmp_path / "once" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    for record in metrics[:-1]:  # one eval only, at the end (train.eval_interval past train.max_steps)
        record.pop("val_loss", None), record.pop("val_bpb", None)
    (tmp_path / "once" / "seed0" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    write_run(tmp_path / "every2" / "seed0", "every2", 0, 2.0)
    compare.main([str(tmp_path), "--plot", str(tmp_path / "curves.png")])
    assert table_rows(capsys.readouterr().out)["once"]["val bpb"] == "2.3000"
    once = next(v for v in group_runs([load_run(d) for d in find_run_dirs(tmp_path)])
                if v.name == "once")
    assert measure_curve(once, "tokens", "val_bpb") == ([MAX_STEPS * TOKENS_PER_STEP], [2.3], [2.3], [2.3])
    assert imread(tmp_path / "curves.png").shape[1] > 600


@pytest.mark.parametrize("flag", ["--plot", "--json"])
def test_an_output_that_cannot_be_written_is_one_line_after_the_table(tmp_path, capsys, flag):
    """--plot into a folder that is a file, --json onto a directory: the table is printed whole, then one
    error line naming the file; nothing is left beside it."""
    for lr, bpb in {1e-3: 2.0, 2e-3: 1.9}.items():
        write_lr_run(tmp_path / "lrs" / f"lr{lr}", "baseline", lr, bpb)
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    out = tmp_path / "file" / "x.png" if flag == "--plot" else tmp_path / "folder"
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(tmp_path / "lrs"), flag, str(out)])
    assert exit_info.value.code == 2
    printed = capsys.readouterr()
    assert table_rows(printed.out)["baseline"]["best lr"] == "0.002"
    reason = "File exists" if flag == "--plot" else "Is a directory"  # the OS's: mkdir finds the file there
    assert printed.err == f"error: cannot write {out}: {reason}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder", "lrs"]
    assert not any((tmp_path / "folder").iterdir())


def test_the_routing_of_mixture_of_experts_variants_against_a_hand_computation(tmp_path, capsys):
    """A variant whose evals log each MoE block's MaxVio and entropy (training/evaluate.py) gets a routing row:
    MaxVio and the blocks' mean entropy, mean ± std over its seeds; a dense variant gets none."""
    for seed, (vios, entropies) in enumerate([((0.2, 0.4), (0.9, 0.7)), ((0.1, 0.3), (0.8, 0.6))]):
        run_dir = tmp_path / "runs" / "moe" / f"seed{seed}"
        write_run(run_dir, "moe", seed, 2.0)
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        lines[-1] |= {"moe/max_vio/1": vios[0], "moe/max_vio/2": vios[1], "moe/max_vio": sum(vios) / 2,
                      "moe/entropy/1": entropies[0], "moe/entropy/2": entropies[1]}
        (run_dir / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    write_run(tmp_path / "runs" / "baseline" / "seed0", "baseline", 0, 2.1)
    compare.main([str(tmp_path / "runs")])
    out = capsys.readouterr().out
    routing = table_rows(out[out.index("| variant | MaxVio"):])
    assert list(routing) == ["moe"]  # the dense baseline routes nothing
    max_vio, entropy = mean_pm_std(routing["moe"]["MaxVio"]), mean_pm_std(routing["moe"]["router entropy / ln E"])
    assert max_vio == pytest.approx((np.mean([0.3, 0.2]), np.std([0.3, 0.2], ddof=1)), abs=1e-4)
    assert entropy == pytest.approx((np.mean([0.8, 0.7]), np.std([0.8, 0.7], ddof=1)), abs=1e-4)


def preset_run(run_dir, overrides, seed, final_bpb):
    """A run dir whose config.yaml holds every setting `python train.py <overrides>` composes, as train.py's does."""
    write_run(run_dir, None, seed, final_bpb)
    config = OmegaConf.to_container(compose_config([*overrides, f"train.seed={seed}", f"train.max_steps={MAX_STEPS}"]),
                                    resolve=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))


def test_variants_are_named_by_their_own_overrides_and_the_preset_alone_is_the_baseline(tmp_path, capsys):
    """Runs of `python train.py`, `... ffn=moe`, `... model.d_model=64` (two seeds each) and `... model=moe_tiny
    train.lr=0.01`: each named by the overrides that give its own settings, not by the dozen settings a MoE changes
    (nor by train.muon_lr, which follows train.lr); the preset run with no override is the baseline without
    --baseline, which still takes any short name."""
    runs = tmp_path / "outputs"
    for seed in range(2):
        preset_run(runs / f"default{seed}", [], seed, 2.00 + 0.02 * seed)
        preset_run(runs / f"moe{seed}", ["ffn=moe"], seed, 1.90 + 0.02 * seed)
        preset_run(runs / f"small{seed}", ["model.d_model=64"], seed, 2.20 + 0.02 * seed)
    preset_run(runs / "moe_tiny", ["model=moe_tiny", "train.lr=0.01"], 0, 1.80)
    compare.main([str(runs)])
    rows = table_rows(capsys.readouterr().out)
    # the baseline first, then as found
    assert list(rows) == ["llama_tiny", "ffn=moe", "model=moe_tiny, train.lr=0.01", "model.d_model=64"]
    assert rows["llama_tiny"]["Δ bpb vs baseline"] == "(baseline)"
    assert float(rows["ffn=moe"]["Δ bpb vs baseline"]) == pytest.approx(-0.10)
    assert float(rows["model.d_model=64"]["Δ bpb vs baseline"]) == pytest.approx(0.20)

    compare.main([str(runs), "--baseline", "ffn=moe"])
    rows = table_rows(capsys.readouterr().out)
    assert list(rows)[0] == "ffn=moe" and float(rows["llama_tiny"]["Δ bpb vs baseline"]) == pytest.approx(0.10)


def test_two_presets_alone_are_named_by_their_presets_and_the_default_one_is_the_baseline(tmp_path, capsys):
    preset_run(tmp_path / "moe", ["model=moe_tiny"], 0, 1.90)
    preset_run(tmp_path / "llama", [], 0, 2.00)
    compare.main([str(tmp_path)])
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["llama_tiny", "moe_tiny"]
    assert float(rows["moe_tiny"]["Δ bpb vs baseline"]) == pytest.approx(-0.1)


def test_the_plot_shows_each_variant_s_delta_with_the_table_s_seed_noise(sweep, tmp_path, capsys, monkeypatch):
    """Below the curves, --plot draws a bar per variant: its Δ bpb against the baseline, and an error bar of the
    table's 2σ (none for relu's one run); without a baseline, the curves alone."""
    drawn = []
    monkeypatch.setattr("study.plots.save_png", lambda fig, path: drawn.append(fig))
    compare.main([str(sweep), "--plot", str(tmp_path / "ablation.png")])
    compare.main([str(sweep), "--plot", str(tmp_path / "ablation.png"), "--baseline", "none"])
    assert "and each variant's Δ bpb with its seed noise" in capsys.readouterr().out
    with_deltas, curves_only = drawn
    assert len(with_deltas.axes) == 3 and len(curves_only.axes) == 2
    panel = with_deltas.axes[2]
    rows = {label.get_text(): y for label, y in zip(panel.get_yticklabels(), panel.get_yticks())}
    assert rows == {"layernorm": 2, "mha": 1, "relu": 0}  # the table's order, top down
    base = np.array(FINAL_BPB["baseline"])
    deltas = {name: np.mean(finals) - base.mean() for name, finals in FINAL_BPB.items() if name != "baseline"}
    noise = {name: 2 * math.sqrt(np.var(finals, ddof=1) / 3 + base.var(ddof=1) / 3)
             for name, finals in FINAL_BPB.items() if name != "baseline"}
    widths = [bar.get_width() for bar in panel.patches]
    assert widths == pytest.approx([deltas["layernorm"], deltas["mha"], 2.5 - base.mean()])  # +0.09, +0.0033, +0.48
    # the error bars: from Δ - 2σ to Δ + 2σ, layernorm's 0.025 and mha's 0.038; relu has one run, so none
    bars = [segment for collection in panel.collections for segment in collection.get_segments()]
    assert [(low[0], high[0]) for low, high in bars] == pytest.approx(
        [(deltas[v] - noise[v], deltas[v] + noise[v]) for v in ("layernorm", "mha")])


def test_the_baseline_is_the_preset_the_other_lines_switch_from(tmp_path, capsys):
    """A date folder of outputs/: `python train.py` (llama_tiny, 5 minutes, 4 layers), and 2-minute runs of
    modern_tiny, alone and with a switch each. Both presets alone are lines with no switch from their preset; the
    baseline is the one the other lines are switches of, modern_tiny, not configs/config.yaml's llama_tiny."""
    day = tmp_path / "outputs" / "2025-01-01"
    two_minutes = ["model=modern_tiny", "train.time_budget=2m"]
    preset_run(day / "19-40-00", two_minutes, 0, 2.10)
    preset_run(day / "19-44-00", [*two_minutes, "norm=layernorm"], 0, 2.15)
    preset_run(day / "19-48-00", [*two_minutes, "position=learned"], 0, 2.20)
    preset_run(day / "19-52-57", [], 0, 2.00)
    compare.main([str(day)])
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["modern_tiny", "norm=layernorm", "position=learned", "llama_tiny"]
    assert rows["modern_tiny"]["Δ bpb vs baseline"] == "(baseline)"
    assert float(rows["llama_tiny"]["Δ bpb vs baseline"]) == pytest.approx(-0.10)


# One round of trained_slowed's slices: long beside a busy machine's scheduling delays (at 0.02 s, with eight busy
# loops beside it, the delays stretched the run's share from 0.15 to about 0.6, and its slowdown to 1.7x)
SLICE_S = 0.25


def trained_slowed(run_dir, *overrides, share: float = 0.2) -> None:
    """train.py on run_dir given `share` of the wall clock, as a machine busy with other work gives a run its time
    slices: stopped and continued in turn (SIGSTOP, SIGCONT). Its steps take about 1 / share as long, 5x at 0.2,
    while no core is kept busy, so the tests beside it keep their own speed."""
    started = start_script(ROOT / "train.py", *overrides, f"hydra.run.dir={run_dir}")
    try:
        while started.poll() is None:
            time.sleep(SLICE_S * share)
            started.send_signal(signal.SIGSTOP)
            time.sleep(SLICE_S * (1 - share))
            started.send_signal(signal.SIGCONT)
    finally:
        started.send_signal(signal.SIGCONT)
    out, err = started.communicate()
    assert started.returncode == 0, err


def trained(run_dir, *overrides):
    done = run_train(run_dir, *overrides)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def llama_parts(tiny) -> list[str]:
    """data_helpers' tiny run with llama_tiny's own components (tiny_run switches its norm)."""
    return [override for override in tiny if override != "norm=layernorm"]


def test_lines_at_one_shared_lr_are_warned_of_and_the_preset_s_own_line_is_the_baseline(llama_parts, tmp_path,
                                                                                         capsys):
    """The student's multirun, `train.py -m ... ffn=swiglu,relu train.seed=0,1`: both lines at llama_tiny's one lr.
    SwiGLU is the preset's own FFN, so its line is the baseline without --baseline, named by the preset; and a
    warning says that the Δ holds each line's distance from its own best lr."""
    done = run_script(ROOT / "train.py", "-m", *llama_parts, "ffn=swiglu,relu", "train.seed=0,1",
                      f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    compare.main([str(tmp_path)])
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert list(rows) == ["llama_tiny", "ffn=relu"] and rows["llama_tiny"]["Δ bpb vs baseline"] == "(baseline)"
    assert rows["ffn=relu"]["runs (n)"] == "2"
    assert ("\nwarning: at a shared lr (0.0025): the differences include each line's distance from its best lr; "
            "compare at each line's own rate (python train.py -m +experiment=ablation ablation=..., or a train.lr "
            "sweep of each line, which compare.py compares at each line's best)\n") in out


def test_seeds_of_one_line_at_different_speeds_are_warned_of(llama_parts, tmp_path, capsys):
    """Two seeds of one line, 80 steps each (0.3 s at 65,000 tokens/s), the second given a fifth of the machine
    (trained_slowed): one model, so the tokens/s column's mean of the two measures the load."""
    steps = [*llama_parts, "train.max_steps=80", "train.eval_interval=80", "train.ckpt_interval=80",
             "train.sample_interval=80"]
    trained(tmp_path / "seed0", *steps, "train.seed=0")
    trained_slowed(tmp_path / "seed1", *steps, "train.seed=1")
    idle, busy = (summary(tmp_path / f"seed{seed}")["tokens_per_s"] for seed in (0, 1))
    assert idle / busy > SPEED_SPREAD
    compare.main([str(tmp_path)])
    assert (f"\nwarning: the machine's speed changed during these runs (llama_tiny's seeds at {busy:,.0f}-{idle:,.0f} "
            f"tokens/s): the tokens/s column measures the load, not the lines (python bench.py measures them on an "
            f"idle one)\n") in capsys.readouterr().out


def test_presets_at_different_shares_of_their_reference_speed_are_warned_of(tiny, tmp_path, capsys):
    """llama_quick, then llama_tiny given a fifth of the machine (trained_slowed), one 1-second budget each: each
    trains its preset's own model, so its tokens/s over its preset's train.reference_tokens_per_s is the share of
    the machine it had, and the budget bought the slowed run fewer steps."""
    presets = [override for override in tiny if not override.startswith(("norm=", "model."))]
    budget = ["train.time_budget=1", "train.max_steps=null", "train.eval_interval=1000", "train.ckpt_interval=1000",
              "train.sample_interval=1000"]
    trained(tmp_path / "llama_quick", *presets, *budget, "model=llama_quick")
    trained_slowed(tmp_path / "llama_tiny", *presets, *budget, "model=llama_tiny")
    shares = sorted(summary(tmp_path / preset)["tokens_per_s"]
                    / OmegaConf.load(tmp_path / preset / "config.yaml").train.reference_tokens_per_s
                    for preset in ("llama_quick", "llama_tiny"))
    assert shares[1] / shares[0] > SPEED_SPREAD
    compare.main([str(tmp_path)])
    assert (f"\nwarning: the machine's speed changed during these runs (the presets' runs at {shares[0]:.0%}-"
            f"{shares[1]:.0%} of their train.reference_tokens_per_s): a time budget bought each run the steps its "
            f"share of the machine allowed; compare at equal tokens (train.max_steps, +experiment=ablation)\n"
            ) in capsys.readouterr().out


def test_lines_that_trained_unequal_tokens_are_warned_of(llama_parts, tmp_path, capsys):
    """llama_tiny for 8 steps and ffn=relu for 12 (8 x 32 tokens a step)."""
    trained(tmp_path / "swiglu", *llama_parts, "train.max_steps=8")
    trained(tmp_path / "relu", *llama_parts, "ffn=relu", "train.max_steps=12")
    compare.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert table_rows(out)["ffn=relu, train.max_steps=12"]["tokens (M)"] == "0.00"  # too few for the table to tell
    assert ("\nwarning: the runs trained unequal numbers of tokens (2,048-3,072): runs of other lengths, or budgeted "
            "runs on a slower or busier machine (a budget is wall-clock), so each line's bpb is partly its length; "
            "compare at equal tokens (train.max_steps, +experiment=ablation)\n") in out


def test_a_fair_comparison_prints_no_warning(llama_parts, tmp_path, capsys):
    """`train.py -m +experiment=ablation ablation=baseline,relu train.seed=0,1`: equal tokens, each line at the rate
    configs/ablation/ records for it (both 0.004), and the seeds of a line run back to back on a steady machine, for
    long enough (0.3 s) that their tokens/s count."""
    done = run_script(ROOT / "train.py", "-m", "+experiment=ablation", "ablation=baseline,relu", "train.seed=0,1",
                      *llama_parts, "model.n_heads=2", "train.max_steps=80", "train.eval_interval=40",
                      "train.diagnostics=false", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert all(measured_rate(load_run(run_dir)) for run_dir in find_run_dirs(tmp_path))  # each seed's speed counts
    compare.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert list(table_rows(out)) == ["baseline", "relu"] and "warning" not in out
