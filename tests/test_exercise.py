"""README's exercise, as README writes it, at a tiny size: the multirun trains every line at its own recorded
learning rate for the same steps, and compare.py reads it as a fair comparison, with no warning."""
import re
import shlex

from omegaconf import OmegaConf

import compare
from tests.data_helpers import ROOT, run_script, write_corpus

TINY = ["model.d_model=32", "model.context_length=32", "data=text", "data.vocab_size=300", "data.num_proc=1",
        "train.max_steps=2", "train.batch_size=4", "train.micro_batch_size=4", "train.eval_tokens=64",
        "train.sample_tokens=4", "train.log_interval=1", "train.diagnostics=false", "wandb.mode=disabled"]


def exercise() -> tuple[list[str], list[str]]:
    """The train.py and compare.py arguments of README's exercise block."""
    text = (ROOT / "README.md").read_text().split("## The exercise")[1]
    block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    train, compare_line = block.strip().splitlines()
    return shlex.split(train)[2:], shlex.split(compare_line)[2:]


def test_readmes_exercise_trains_each_line_at_its_own_rate_and_compares_without_a_warning(tmp_path, capsys):
    train_args, compare_args = exercise()
    corpus = write_corpus(tmp_path / "corpus.txt")
    sweep = tmp_path / "exercise"
    done = run_script(ROOT / "train.py", *train_args, *TINY, f"data.path={corpus}",
                      f"data.cache_dir={tmp_path / 'cache'}", f"hydra.sweep.dir={sweep}", "latest_link=null")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = re.search(r"ablation=(\S+)", " ".join(train_args)).group(1).split(",")
    runs = sorted(path.parent for path in sweep.rglob("summary.json"))
    assert len(runs) == 2 * len(lines)  # two seeds a line
    rates = {}
    for run in runs:
        cfg = OmegaConf.load(run / "config.yaml")
        rates[cfg.variant] = cfg.train.lr
        assert cfg.train.lr == OmegaConf.load(ROOT / "configs/ablation" / f"{cfg.variant}.yaml").train.lr
    assert sorted(rates) == sorted(lines) and len(set(rates.values())) > 1  # each at its own, not one shared

    plot = tmp_path / compare_args[compare_args.index("--plot") + 1]
    compare.main([str(sweep), "--plot", str(plot)])
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| ")][1:]  # below the header
    names = [row.split("|")[1].strip() for row in rows]
    assert names[0] == "baseline" and sorted(names) == sorted(lines)  # the baseline first
    assert "(baseline)" in rows[0] and "warning" not in printed.lower() and plot.exists()
