"""The matrix: every command README lists, run on every preset of configs/model/ and on every attention and FFN kind
(configs/attention/, configs/ffn/) that no preset chooses, each on llama_tiny, on the all-linear model, and on the
synthetic tasks (tasks/: the first runs every command, each other trains through train.py). A new preset, a new
kind's config file or a new task's registry line joins it by itself.
Each model trains once (2 steps), and every command then reads that run: resume (to step 3), generate (greedy,
cached against recomputed in float64), evaluate, report (its page, on a short prompt), export to transformers (a
model that loads with its logits) and to GGUF (a file that loads), or one `error:` line and exit 2 for each, and
bench's decode loop. Any traceback fails."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM

import evaluate
import export
import generate
import report
from benchmarks.decode import our_generation
from benchmarks.timing import Device
from generation.engine import Engine
from interop.load import load_model
from settings import compose_config
from storage.checkpoint import resolve_ckpt_dir
from tasks import TASKS
from tests.data_helpers import ROOT, run_script, summary, write_corpus

PRESETS = sorted(path.stem for path in (ROOT / "configs/model").glob("*.yaml"))


def matrix() -> dict[str, list[str]]:
    """Each case's overrides, by its name: the presets, then each attention and FFN option no preset picks, each
    shrunk to heads of 16 dims (the smallest every preset's sizes allow: deepseek_tiny's RoPE part is 16 dims)."""
    cases = {preset: [f"model={preset}"] for preset in PRESETS}
    models = {preset: compose_config(overrides).model for preset, overrides in cases.items()}
    chosen = {(group, model[group]) for model in models.values() for group in ("attention", "ffn")}
    for group in ("attention", "ffn"):
        for option in sorted(path.stem for path in (ROOT / "configs" / group).glob("*.yaml")):
            if (group, option) not in chosen:
                cases[f"llama_tiny_{option}"] = ["model=llama_tiny", f"{group}={option}"]
    cases["gdn_all"] = ["+ablation=gdn_all"]  # the linear kind with no attention layer at all
    heads = {name: (models.get(name) or compose_config(overrides).model).n_heads for name, overrides in cases.items()}
    cases = {name: [*overrides, f"model.d_model={16 * heads[name]}", *TEXT] for name, overrides in cases.items()}
    return cases | {task: ["model=llama_tiny", "model.d_model=64", "model.context_length=128", "data=task",
                           f"data.task={task}", "data.train_examples=64"] for task in TASKS}


# Past training, every command reads the model and a tokenizer of one kind, the same for every task (evaluate's one
# line comes from the task data's class, not the task): the first task runs them all, each other task trains only.
TRAINS_ONLY = set(list(TASKS)[1:])


TEXT = ["data=text", "data.vocab_size=300"]  # the corpus fixture's text; a task's case trains on its task instead
CASES = matrix()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("matrix") / "corpus.txt")


def train(run_dir: Path, corpus: Path, overrides: list[str], steps: int, *extra: str):
    text = [f"data.path={corpus}"] if "data=text" in overrides else []
    done = run_script(ROOT / "train.py", f"data.cache_dir={corpus.parent / 'cache'}", "data.num_proc=1",
                      "model.context_length=64", "train.batch_size=4", "train.micro_batch_size=4",
                      "train.time_budget=null", f"train.max_steps={steps}", "train.eval_tokens=256",
                      "train.eval_interval=2", "train.ckpt_interval=2", "train.sample_interval=2",
                      "train.sample_tokens=4", "wandb.mode=disabled", *overrides, *text,
                      f"hydra.run.dir={run_dir}", f"latest_link={run_dir.parent / 'latest'}", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def greedy(engine: Engine, prompt: list[int], use_cache: bool) -> list[int]:
    return [step.item() for step in engine.generate([prompt], 40, temperature=0, use_cache=use_cache)]


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("case", CASES)
def test_every_command_works_for(case, corpus, tmp_path, capsys):
    run_dir = tmp_path / "run"
    train(run_dir, corpus, CASES[case], 2)
    if case in TRAINS_ONLY:
        return
    resumed = train(run_dir, corpus, CASES[case], 3, "train.resume=true")
    assert "resuming" in resumed.stdout + resumed.stderr and summary(run_dir)["steps"] == 3

    assert generate.main(["--ckpt", str(run_dir), "--prompt", "ANNA", "--max-new-tokens", "20"]) == 0
    model, _ = load_model(run_dir)
    model = model.double()  # float64: the two paths' argmax cannot part on a rounding tie
    engine = Engine(model)
    prompt = [1, 5, 9, 13]
    assert greedy(engine, prompt, use_cache=True) == greedy(engine, prompt, use_cache=False)

    capsys.readouterr()
    if evaluate.main(["--ckpt", str(run_dir), "--lengths", "64"]) != 0:  # a task: no val text, one line says so
        assert "data=task" in CASES[case] and "synthetic task" in one_error_line(capsys.readouterr().err)
    # the checkpoint alone, outside its run: the page's val-split sections read the prompt instead, which
    # tests/test_report.py's runs cover; and a short prompt, as the maps' figures grow with its tokens
    shutil.copytree(resolve_ckpt_dir(run_dir), tmp_path / "alone")
    assert report.main(["--ckpt", str(tmp_path / "alone"), "--prompt", "ANNA\nGood", "--out",
                        str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    shown = json.loads((tmp_path / "report" / "report.json").read_text())["checkpoints"][0]
    assert len(shown["attention_maps"]["weights"]) == model.cfg.n_layers and "<img" in page
    capsys.readouterr()

    if export.main(["--ckpt", str(run_dir), "--out", str(tmp_path / "hf")]) == 0:
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", experts_implementation="eager").eval()
        tokens = torch.tensor([prompt * 8])
        with torch.no_grad():
            ours, _ = load_model(run_dir)
            expected, got = ours(tokens), theirs(tokens).logits
        # float32 on both sides: each logit a sum of d products of values near 1, so 1e-4 of the largest logit
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    else:
        one_error_line(capsys.readouterr().err)
    capsys.readouterr()  # transformers' loading bars
    if export.main(["--ckpt", str(run_dir), "--format", "gguf", "--out", str(tmp_path / "model.gguf")]) == 0:
        read = GGUFReader(tmp_path / "model.gguf")
        assert len(read.tensors) > 0
    else:
        one_error_line(capsys.readouterr().err)

    bench_model, _ = load_model(run_dir)
    times, ids = our_generation(bench_model, torch.tensor([prompt]), 8, use_cache=True, device=Device("cpu"))()
    assert len(times) == 8 and ids.shape == (1, 8)
