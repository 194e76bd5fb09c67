"""sweep.py end to end on a tiny model and corpus: 2 variants x 2 learning rates, seeds at each best,
then compare.py's learning-rate table, curve table, JSON and plot on the same dirs; a second call
keeps every finished run and one killed mid-way is run again."""
import json
import math
from pathlib import Path

import pytest
from matplotlib.image import imread

import compare
import sweep
from data_helpers import write_corpus

LRS = (3e-3, 3e-2)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    corpus = write_corpus(root / "corpus.txt")
    overrides = ["data=text", f"data.path={corpus}", "data.vocab_size=300", f"data.cache_dir={root / 'cache'}",
                 "data.num_proc=1", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
                 "model.context_length=32", "train.batch_size=8", "train.micro_batch_size=8", "train.max_steps=6", "train.time_budget=null",
                 "train.warmup_fraction=0.25", "train.eval_interval=3", "train.eval_tokens=512", "wandb.mode=disabled",
                 f"latest_link={root / 'latest'}"]
    out = root / "study"
    args = ["--out", str(out), "--variants", "baseline", "postnorm", "--probe", "postnorm", "--lrs", *map(str, LRS),
            "--seeds", "2", "--widen", "0", "--jobs", "2", *overrides]
    sweep.main(args)
    return out, args


def test_every_point_of_the_study_ran_in_its_own_dir(study):
    out, _ = study
    best = json.loads((out / "best_lr.json").read_text())
    assert set(best) == {"baseline", "postnorm", "postnorm-nowarmup"}
    for line, lr in best.items():
        assert lr in LRS
        for grid_lr in LRS:
            config = (out / line / f"lr{grid_lr:.4g}" / "seed0" / "config.yaml").read_text()
            assert f"lr: {grid_lr}" in config and f"min_lr: {grid_lr / 10:.6g}" in config
        seeds = sorted(d.name for d in (out / line / f"lr{lr:.4g}").iterdir())
        assert seeds == (["seed0"] if line.endswith("nowarmup") else ["seed0", "seed1"])
    assert "warmup_fraction: 0.0" in (out / "postnorm-nowarmup" / f"lr{LRS[0]:.4g}" / "seed0" / "config.yaml").read_text()


def test_a_second_call_keeps_finished_runs_and_reruns_a_killed_one(study, capsys):
    out, args = study
    killed = out / "baseline" / f"lr{LRS[0]:.4g}" / "seed0"
    (killed / "summary.json").unlink()
    sweep.main(args)
    printed = capsys.readouterr().out
    assert printed.count("kept from an earlier run") == 7  # 8 runs, one of them killed
    rerun = [line for line in printed.splitlines() if f"baseline lr {LRS[0]:g} seed 0: val bpb" in line]
    assert len(rerun) == 1 and "kept" not in rerun[0] and rerun[0].endswith(" s)")
    assert json.loads((killed / "summary.json").read_text())["stop_reason"] == "completed"


def test_compare_reads_the_study_as_a_learning_rate_sweep(study, tmp_path, capsys):
    out, _ = study
    compare.main([str(out), "--lr-plot", str(tmp_path / "lr.png"), "--plot", str(tmp_path / "curves.png"),
                  "--json", str(tmp_path / "numbers.json")])
    printed = capsys.readouterr().out
    header, _, *rows = printed.splitlines()[:5]
    assert header.startswith("| variant | best lr | LR sensitivity |")
    numbers = json.loads((tmp_path / "numbers.json").read_text())
    best = json.loads((out / "best_lr.json").read_text())
    for line, values in numbers["variants"].items():
        finals = values["final_bpb_seed0"]
        assert values["best_lr"] == best[line] and finals[f"{best[line]:g}"] == min(finals.values())
        hand = sum(min(f, numbers["init_bpb"]) for f in finals.values()) / len(finals) - min(finals.values())
        assert values["lr_sensitivity"] == pytest.approx(hand)
        assert len(values["best_lr_val_bpb"]) == (1 if line.endswith("nowarmup") else 2)
    assert numbers["init_bpb"] == pytest.approx(math.log(300) / math.log(2) /
                                                 _bytes_per_token(out / "baseline" / f"lr{LRS[0]:.4g}" / "seed0"))
    for name in ("lr.png", "curves.png"):
        assert imread(tmp_path / name).shape[1] > 600


def _bytes_per_token(run_dir: Path) -> float:
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    return last["val_loss"] / last["val_bpb"] / math.log(2)


@pytest.mark.parametrize("args, message", [(["--lrs", "1e-3"], "--lrs 0.001: at least two"),
                                           (["--seeds", "0"], "--seeds 0 and --jobs 2 must be >= 1")])
def test_bad_arguments_are_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_run_that_fails_to_start_stops_the_study_with_its_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--out", str(tmp_path), "--variants", "baseline", "--probe", "--lrs", "1e-3", "2e-3",
                    "--jobs", "1", "train.batch_size=abc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: baseline lr 0.001 seed 0 ended with exit code 2: error: ")
    assert "train.batch_size" in err[0] and "train.log" in err[0]
    assert not (tmp_path / "baseline" / "lr0.002").exists()  # the study stopped at its first failure
