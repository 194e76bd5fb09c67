"""train.py end to end, through the real Hydra entry point, on a tiny model and a tiny corpus:
outputs, exact resume, SIGTERM, the NaN guard, one-line errors, and DDP over 2 CPU processes.

Each run is train.py as __main__ in a fork of this process (data_helpers.run_script), its own process with
its own signals and exit; runs still take seconds, so the module shares them through fixtures."""
import json
import math
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from data_helpers import ROOT, metrics, run_script, run_train as train, start_script, summary as run_summary
from storage.checkpoint import load_checkpoint
from storage.files import atomic_symlink

MAX_STEPS = 8
BATCH, CONTEXT = 8, 32


def train_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "ckpt" / "train_state.pt", weights_only=True)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# the tests that read the full run share one process under pytest -n (--dist loadgroup), which trains it once
FULL_RUN = pytest.mark.xdist_group("full_run")


@pytest.fixture(scope="module")
def full_training(workdir, tiny) -> subprocess.CompletedProcess:
    """MAX_STEPS in one go, tracked by W&B offline (it must write locally and never ask for a login)."""
    done = train(workdir / "full", *tiny, f"train.max_steps={MAX_STEPS}", "wandb.mode=offline")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def full_run(full_training, workdir) -> Path:
    return workdir / "full"


@FULL_RUN
def test_run_writes_checkpoint_metrics_config_and_summary(full_run):
    lines = metrics(full_run)
    assert [m["step"] for m in lines] == list(range(1, MAX_STEPS + 1))
    for m in lines:
        assert m["tokens"] == m["step"] * BATCH * CONTEXT
        assert {"train_loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"} <= m.keys()
    evals = [m for m in lines if "val_loss" in m]
    assert [m["step"] for m in evals] == [4, 8]
    for m in evals:
        assert m["val_ppl"] == pytest.approx(math.exp(m["val_loss"]))
        # bytes per token is about 1 for a 300-piece vocab on this corpus, so bpb ~ val_loss / ln 2
        assert 0.5 < m["val_bpb"] * math.log(2) / m["val_loss"] < 1.5
    assert lines[-1]["train_loss"] < lines[0]["train_loss"] - 0.3
    assert lines[-1]["val_loss"] < evals[0]["val_loss"]

    model, ckpt_dir = load_checkpoint(full_run)  # self-contained: config, weights, tokenizer
    assert {"config.json", "model.safetensors", "tokenizer.model", "train_state.pt"} <= {
        p.name for p in ckpt_dir.iterdir()}
    state = train_state(full_run)
    assert state["progress"]["step"] == MAX_STEPS and state["optimizer"]["state"]
    assert model.cfg.norm == "layernorm" and model.cfg.d_model == 32

    summary = run_summary(full_run)
    assert summary["name"] == "llama_tiny-norm=layernorm"
    assert summary["num_params"] == model.num_params()
    assert summary["kv_cache_bytes_per_token"] == 2 * 1 * 1 * 16 * 4  # K and V, 1 layer, 1 K/V head of 16, fp32
    assert summary["stop_reason"] == "completed" and summary["val_loss"] == lines[-1]["val_loss"]
    config = (full_run / "config.yaml").read_text()
    assert "${" not in config and f"lr_decay_steps: {MAX_STEPS}" in config

    offline = list((full_run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
    # W&B's summary, as its own reader gives it, says what summary.json says for every key both have
    read = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--summary", "--json",
                           str(offline[0])], capture_output=True, text=True, timeout=120)
    theirs = json.loads(read.stdout)["summary"]
    shared = summary.keys() & theirs.keys()
    assert {"elapsed_s", "tokens_per_s", "val_bpb", "steps"} <= shared
    assert {key: theirs[key] for key in shared} == {key: summary[key] for key in shared}


@FULL_RUN
def test_the_last_line_gives_the_final_val_bpb_beside_the_steps_and_tokens(full_training, full_run):
    last = full_training.stderr.rstrip().splitlines()[-1]
    bpb = run_summary(full_run)["val_bpb"]
    assert bpb == metrics(full_run)[-1]["val_bpb"]  # the last step's eval
    assert last.startswith(f"llama_tiny-norm=layernorm: done: val bpb {bpb:.4f} after {MAX_STEPS} steps, "
                           f"{MAX_STEPS * BATCH * CONTEXT / 1e6:.2f} M tokens in ")


@FULL_RUN
def test_a_run_from_the_latest_runs_weights_names_them_and_records_their_resolved_path(full_run, workdir, tiny):
    """train.init_from=<the latest link>: the first line names the run dir the link resolved to, and so does
    config.yaml, though the link then moves to this very run."""
    latest = workdir / "latest"
    atomic_symlink(latest, full_run)
    run_dir = workdir / "from-latest"
    done = train(run_dir, *tiny, f"train.init_from={latest}", "train.max_steps=2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{run_dir} | from the weights of {full_run.resolve()}\n" in done.stdout
    assert latest.resolve() == run_dir.resolve()
    assert OmegaConf.load(run_dir / "config.yaml").train.init_from == str(full_run.resolve())
    # the same command resumed, though the link now names this run: a resume reads its checkpoint, not init_from
    again = train(run_dir, *tiny, f"train.init_from={latest}", "train.max_steps=3", "train.resume=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed at step 2" in again.stdout
    assert OmegaConf.load(run_dir / "config.yaml").train.init_from == str(full_run.resolve())


@FULL_RUN
def test_a_multirun_leaves_the_latest_link_where_it_was(full_run, workdir, tiny):
    """A multirun of one job (-m makes it one): the job trains, and the link still names the last single run."""
    latest = workdir / "latest"
    atomic_symlink(latest, full_run)
    sweep_dir = workdir / "sweep-latest"
    done = run_script(ROOT / "train.py", "-m", *tiny, "train.max_steps=2", f"hydra.sweep.dir={sweep_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [run_summary(job.parent)["steps"] for job in sweep_dir.glob("*/summary.json")] == [2]
    assert latest.resolve() == full_run.resolve()


@FULL_RUN
def test_half_then_resume_matches_one_go(full_run, workdir, tiny):
    run_dir = workdir / "halves"
    first = train(run_dir, *tiny, f"train.max_steps={MAX_STEPS // 2}", f"train.lr_decay_steps={MAX_STEPS}")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(run_dir, *tiny, "train.resume=true", f"train.max_steps={MAX_STEPS}")
    assert second.returncode == 0, second.stderr[-3000:]

    halves, whole = metrics(run_dir), metrics(full_run)
    assert [m["step"] for m in halves] == list(range(1, MAX_STEPS + 1))
    for a, b in zip(halves, whole):
        assert abs(a["train_loss"] - b["train_loss"]) <= 1e-5 and a["lr"] == pytest.approx(b["lr"])
    assert abs(halves[-1]["val_loss"] - whole[-1]["val_loss"]) <= 1e-5
    resumed = load_file(run_dir / "ckpt" / "model.safetensors")
    one_go = load_file(full_run / "ckpt" / "model.safetensors")
    assert all(torch.allclose(resumed[k], one_go[k], atol=1e-6) for k in one_go)


def test_sigterm_saves_a_checkpoint_that_resumes(workdir, tiny):
    run_dir = workdir / "sigterm"
    never = "100000"  # no eval, sample or checkpoint on its own before the signal
    proc = start_script(ROOT / "train.py", *tiny, f"train.max_steps={never}", f"train.eval_interval={never}",
                        f"train.ckpt_interval={never}", f"train.sample_interval={never}", f"hydra.run.dir={run_dir}")
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:  # wait until training is under way
        if (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "SIGTERM: stopped after step" in stderr

    stopped_at = metrics(run_dir)[-1]["step"]
    assert train_state(run_dir)["progress"]["step"] == stopped_at
    model, _ = load_checkpoint(run_dir)
    assert all(p.isfinite().all() for p in model.parameters())
    assert run_summary(run_dir)["stop_reason"] == "SIGTERM"

    resumed = train(run_dir, *tiny, "train.resume=true", f"train.max_steps={stopped_at + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, stopped_at + 3))
    assert train_state(run_dir)["progress"]["step"] == stopped_at + 2


def test_a_signal_during_an_eval_stops_after_it_without_another_step(workdir, tiny, tmp_path):
    """SIGINT in the middle of step 4's eval (a wrapper sends it from inside the first eval): the run stops at
    step 4 once the eval is done, saves it, and its stop line is the last line of the output, after the bar."""
    wrapper = tmp_path / "signal_in_eval.py"
    wrapper.write_text(f'''
import os, runpy, signal, sys
import training.evaluate

evaluate = training.evaluate.evaluate
def interrupted(*args, **kwargs):  # train.py imports this one
    os.kill(os.getpid(), signal.SIGINT)
    return evaluate(*args, **kwargs)

training.evaluate.evaluate = interrupted
sys.argv[0] = {str(ROOT / "train.py")!r}
runpy.run_path(sys.argv[0], run_name="__main__")
''')
    run_dir = workdir / "sigint-eval"
    proc = run_script(wrapper, *tiny, "train.max_steps=1000", "train.ckpt_interval=1000",
                      "train.sample_interval=1000", f"hydra.run.dir={run_dir}")
    stderr = proc.stderr
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert [m["step"] for m in metrics(run_dir)][-1] == 4 == train_state(run_dir)["progress"]["step"]
    assert "val_loss" in metrics(run_dir)[-1]
    last = stderr.rstrip().splitlines()[-1]
    assert last == (f"SIGINT: stopped after step 4 and saved {run_dir / 'ckpt'}; continue with "
                    f"python train.py hydra.run.dir={run_dir} train.resume=true")

    resumed = train(run_dir, *tiny, "train.resume=true", "train.max_steps=5", "train.batch_size=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    notices = [line for line in resumed.stdout.splitlines() if line.startswith("notice:")]
    assert notices == [f"notice: resuming {run_dir} with its own settings, and train.max_steps=5 (was 1000), "
                       f"train.batch_size=4 (was 8), train.lr_decay_steps=5 (was 1000), train.ckpt_interval=4 "
                       f"(was 1000), train.sample_interval=4 (was 1000)"]


def test_the_val_set_is_the_same_whatever_the_batch_size(workdir, tiny):
    """Batches of 8 and 16 sequences with the micro-batch left to choose (8 and 16: a val set counted in
    batches would hold 512 or 1,024 tokens) and an lr of 1e-12, so that one step leaves the initial weights as
    they were: the same val tokens give the same val loss."""
    losses = {}
    for batch in (8, 16):
        run_dir = workdir / f"batch{batch}"
        done = train(run_dir, *tiny, "train.max_steps=1", f"train.batch_size={batch}", "train.micro_batch_size=null",
                     "train.lr=1e-12", "train.min_lr=0", "latest_link=null")
        assert done.returncode == 0, done.stderr[-3000:]
        assert run_summary(run_dir)["eval_tokens"] == 256
        losses[batch] = run_summary(run_dir)["val_loss"]
    assert losses[8] == pytest.approx(losses[16], rel=1e-6)


def test_a_lost_process_saves_its_last_step_and_exits_2_with_one_line(workdir, tiny):
    """Two processes (gloo) started as torchrun starts them; rank 1 is killed with SIGKILL mid-run. Rank 0
    saves the last step it completed, says which rank it lost in one `error:` line, exits 2, and the
    checkpoint resumes."""
    run_dir = workdir / "lost-rank"
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    never = "100000"
    procs = [start_script(ROOT / "train.py", *tiny, f"train.max_steps={never}", "train.micro_batch_size=2",
                          f"train.eval_interval={never}", f"train.ckpt_interval={never}",
                          f"train.sample_interval={never}", f"hydra.run.dir={run_dir}",
                          env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
                               "RANK": str(rank), "LOCAL_RANK": str(rank)})
             for rank in (0, 1)]
    deadline = time.time() + 120
    while procs[0].poll() is None and time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 3:
            break
        time.sleep(0.1)
    procs[1].kill()
    procs[1].communicate(timeout=60)
    _, stderr = procs[0].communicate(timeout=120)
    assert procs[0].returncode == 2, stderr[-3000:]
    [line] = error_lines(stderr)
    assert stderr.rstrip().splitlines()[-1] == line and "Traceback" not in stderr
    step = train_state(run_dir)["progress"]["step"]
    assert line.startswith(f"error: lost process rank 1 of 2 after step {step} (")
    assert f"saved {run_dir / 'ckpt'} at step {step}" in line and "train.resume=true" in line
    assert step >= 3 and run_summary(run_dir)["stop_reason"] == f"lost a process after step {step}"

    resumed = train(run_dir, *tiny, "train.resume=true", f"train.max_steps={step + 1}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert train_state(run_dir)["progress"]["step"] == step + 1


def test_divergence_stops_and_keeps_the_last_good_checkpoint(workdir, tiny):
    """lr=1e6 really diverges: AdamW's steps of ~lr overflow the weights within a few steps."""
    run_dir = workdir / "diverged"
    done = train(run_dir, *tiny, "train.lr=1e6", "train.warmup_fraction=0", "train.max_steps=50",
                 "train.ckpt_interval=1")
    assert done.returncode == 1, done.stderr[-3000:]
    [message] = error_lines(done.stderr)
    failed_step = int(re.search(r"diverged at step (\d+)", message).group(1))
    assert failed_step >= 2 and f"the last good checkpoint is {run_dir / 'ckpt'} (step {failed_step - 1})" in message
    assert train_state(run_dir)["progress"]["step"] == failed_step - 1
    model, _ = load_checkpoint(run_dir)
    assert all(p.isfinite().all() for p in model.parameters())
    assert metrics(run_dir)[-1]["step"] == failed_step - 1
    assert run_summary(run_dir)["stop_reason"] == f"diverged at step {failed_step}"


@pytest.mark.parametrize("case", ["bad_model", "resume_without_checkpoint", "missing_data"])
def test_bad_settings_fail_with_one_line(case, workdir, tiny):
    """One case per error class train.py turns into `error: ...` and exit 2."""
    run_dir = workdir / f"error-{case}"
    fresh_cache = workdir / f"cache-{case}"
    overrides, expected = {
        "bad_model": (["model.n_heads=3", f"data.cache_dir={fresh_cache}"],
                      "error: model.n_heads=3 must divide model.d_model=32"),
        "resume_without_checkpoint": (["train.resume=true"],
                                      f"error: train.resume=true but there is no checkpoint in {run_dir}"),
        "missing_data": ([f"data.path={workdir / 'missing.txt'}"], f"error: data.path='{workdir / 'missing.txt'}'"),
    }[case]
    done = train(run_dir, *tiny, *overrides)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = error_lines(done.stderr)
    assert line.startswith(expected)
    if case == "bad_model":  # the model config is checked before any data is read or tokenized
        assert not fresh_cache.exists()
    if case == "missing_data":  # refused after taking the run dir's lock: neither it nor the dir is left
        assert not run_dir.exists()


# An MoE with the loss-free bias: each rank counts its own batches' choices, so the ranks' biases stay equal only if
# the counts are summed over the processes before each update (train.py, Transformer.after_optimizer_step). Its
# blocks hold every kind of weight a dense model's do (embeddings, norms, attention, SwiGLU experts), under the same
# DistributedDataParallel, so one run checks both.
MOE_WITH_BIAS = ["ffn=moe", "model.n_experts=8", "model.router=sigmoid", "model.router_bias_rate=0.01"]


def test_ddp_two_cpu_processes_end_with_identical_weights(workdir, tiny, tmp_path):
    """torchrun, gloo. A wrapper records each rank's DDP model (monkeypatched at torch's boundary)
    and saves its final weights and buffers: DDP must keep the ranks in step though each draws its own batches."""
    wrapper = tmp_path / "record_ddp.py"
    wrapper.write_text(f'''
import os, runpy, sys
import torch, torch.nn.parallel

wrapped = []
class RecordingDDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        wrapped.append(self)

torch.nn.parallel.DistributedDataParallel = RecordingDDP
sys.argv[0] = {str(ROOT / "train.py")!r}
runpy.run_path(sys.argv[0], run_name="__main__")
torch.save(wrapped[0].module.state_dict(), {str(tmp_path)!r} + f"/rank{{os.environ['RANK']}}.pt")
''')
    run_dir = workdir / "ddp"
    done = train(run_dir, *tiny, *MOE_WITH_BIAS, "train.max_steps=4", "train.micro_batch_size=2",
                 command=(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(wrapper)))
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0)
    assert all(rank0[k].abs().sum() > 0 for k in rank0 if k.endswith("ffn.bias"))  # the biases moved, alike
    saved = load_file(run_dir / "ckpt" / "model.safetensors")  # only rank 0 writes it
    assert all(torch.equal(saved[k], rank0[k]) for k in saved)
    lines = metrics(run_dir)
    # the global batch is the config's: 2 processes x 2 accumulation steps x 2 sequences = BATCH
    assert [m["tokens"] for m in lines] == [s * BATCH * CONTEXT for s in range(1, 5)]
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]
    # the val set is train.eval_tokens, whatever the processes: the 8 windows of 32 tokens of one process
    assert run_summary(run_dir)["eval_tokens"] == 256


def test_a_resume_is_the_run_it_continues(workdir, tiny):
    """Resumed as its stop line says, nothing repeated: the run's own settings (a preset, a group, sizes, an lr),
    the safe changes named on one notice line, and an override that would change the checkpoint refused before
    anything is written (the other refusals: tests/test_train_parts.py)."""
    run_dir = workdir / "resume-own"
    first = train(run_dir, *tiny, "model=llama_quick", "+experiment=quick", "train.max_steps=4", "train.lr=0.004")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = train(run_dir, "train.resume=true", "train.max_steps=6", "train.eval_interval=3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [line for line in resumed.stdout.splitlines() if line.startswith("notice:")] == [
        f"notice: resuming {run_dir} with its own settings, and train.max_steps=6 (was 4), train.lr_decay_steps=6 "
        f"(was 4), train.eval_interval=3 (was 4)"]
    config = OmegaConf.load(run_dir / "config.yaml")
    assert (config.model.name, config.model.n_layers, config.model.norm) == ("llama_quick", 1, "layernorm")
    assert (config.train.lr, config.data.name, config.wandb.name) == (0.004, "text", "llama_quick-norm=layernorm")
    assert run_summary(run_dir)["steps"] == 6 and [m["step"] for m in metrics(run_dir)][-1] == 6
    refused = train(run_dir, "train.resume=true", "train.max_steps=8", "model.n_layers=4")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: model.n_layers=4: the run being resumed has model.n_layers=1, and a resumed run keeps what its "
        "checkpoint was trained with; leave it out to resume the run, or start a new one in another hydra.run.dir"]
    assert run_summary(run_dir)["steps"] == 6  # nothing trained, nothing written
