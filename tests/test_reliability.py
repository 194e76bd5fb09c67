"""What a user sees when things go wrong, through the real entry points (train.py in a process of its own,
generate.py and export.py through the main() their scripts run): one run per run dir, checkpoints that prove their
integrity, parts of a checkpoint that disagree, a write that fails, mistyped settings, a prompt that
is not UTF-8. Each case checks the exit code, that the last stderr line is one `error:` line naming
the setting or file, and that the files that were there before are unchanged (sha256 before and after)."""
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import sys
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load, save

import export
import generate
from data.tokenizer import train_tokenizer
from data_helpers import ROOT, hashes, metrics, run_train as train, start_script, summary, train_in_process
from interop.load import load_model
from storage.checkpoint import CheckpointError, check_vocab, load_checkpoint, read_checkpoint, save_checkpoint
from storage.files import atomic_write, write_bytes, write_json
from training.state import limits_reached



def last_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert lines and "Traceback" not in stderr, stderr[-2000:]
    assert lines[-1].startswith("error: "), lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def trained(workdir, tiny) -> Path:
    run_dir = workdir / "trained"
    done = train(run_dir, *tiny, "train.max_steps=4")
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    """A private copy of the trained run dir, to damage."""
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def rewrite(ckpt: Path, name: str, content: bytes) -> None:
    """Replaces a checkpoint file and records its new sha256 in config.json: a checkpoint whose parts are
    each intact but disagree (or hold NaNs), as a buggy writer could leave it."""
    (ckpt / name).write_bytes(content)
    meta = json.loads((ckpt / "config.json").read_text())
    meta["sha256"][name] = hashlib.sha256(content).hexdigest()
    (ckpt / "config.json").write_text(json.dumps(meta))


def entry_points(run_dir: Path, tiny: list[str], tmp_path: Path, capsys):
    """(name, exit code, stderr) of generate and export (their main(), as the scripts call it) and of a
    resumed training (a subprocess) on run_dir."""
    results = []
    for name, main, argv in (("generate", generate.main, ["--ckpt", str(run_dir), "--max-new-tokens", "4"]),
                             ("export", export.main, ["--ckpt", str(run_dir), "--out", str(tmp_path / "exported")])):
        code = main(argv)
        results.append((name, code, capsys.readouterr().err))
    assert not (tmp_path / "exported").exists()
    resumed = train(run_dir, *tiny, "train.max_steps=8", "train.resume=true")
    results.append(("resume", resumed.returncode, resumed.stderr))
    return results


def damage_cases():
    def flip_tensor_bytes(ckpt: Path):
        data = bytearray((ckpt / "model.safetensors").read_bytes())
        header = 8 + int.from_bytes(data[:8], "little")
        for i in range(header + 100, header + 300):
            data[i] ^= 0xFF
        (ckpt / "model.safetensors").write_bytes(bytes(data))

    def nan_weights(ckpt: Path):
        state = load((ckpt / "model.safetensors").read_bytes())
        state["tok_emb.weight"][3, 5] = float("nan")
        rewrite(ckpt, "model.safetensors", save(state))

    def other_size_config(ckpt: Path):
        meta = json.loads((ckpt / "config.json").read_text())
        meta["model"]["d_model"] = 64
        (ckpt / "config.json").write_text(json.dumps(meta))

    def other_vocab_tokenizer(ckpt: Path):
        lines = [f"line {i} of other words entirely, {i * 7}" for i in range(300)]
        other = train_tokenizer(lines, 320, ckpt.parent / "other.model")
        rewrite(ckpt, "tokenizer.model", Path(other.model_file).read_bytes())

    return [(flip_tensor_bytes, "model.safetensors does not match the sha256 in its config.json"),
            (nan_weights, "non-finite weights in tok_emb.weight"),
            (other_size_config, "tok_emb.weight is [300, 32] in model.safetensors but [300, 64]"),
            (other_vocab_tokenizer, "vocab_size=300 but its tokenizer")]


@pytest.mark.parametrize("damage, message", damage_cases(), ids=lambda c: getattr(c, "__name__", ""))
def test_a_damaged_checkpoint_is_refused_by_every_load_and_left_as_it_is(copy, tiny, tmp_path, capsys, damage,
                                                                        message):
    ckpt = copy / "ckpt"
    damage(ckpt)
    before = hashes(ckpt)
    for name, code, stderr in entry_points(copy, tiny, tmp_path, capsys):
        assert code == 2, (name, stderr[-2000:])
        line = last_error(stderr)
        assert message in line and str(ckpt) in line, (name, line)
    assert hashes(ckpt) == before  # resume did not save over it


def test_saving_non_finite_weights_is_refused(trained, tmp_path):
    model, ckpt = load_checkpoint(trained)
    with torch.no_grad():
        model.blocks[0].ffn.w_out.weight[0, 0] = float("inf")
    with pytest.raises(CheckpointError, match="non-finite weights in blocks.0.ffn.w_out.weight"):
        save_checkpoint(tmp_path / "ckpt", model, ckpt / "tokenizer.model")
    assert not any(tmp_path.iterdir())


def test_a_refused_run_leaves_the_latest_link_where_it_was(trained, copy, workdir, tiny):
    """`latest` moves once a run has started writing: a run refused for a run dir that already holds a checkpoint
    (a copy of `trained`), or for an empty corpus, leaves it at the newest run that started."""
    latest = workdir / "latest"
    assert latest.resolve() == trained.resolve()
    again = train(copy, *tiny, "train.max_steps=4")
    assert again.returncode == 2 and "already holds a checkpoint" in last_error(again.stderr)
    (workdir / "empty.txt").write_text("")
    empty = train(workdir / "empty-corpus", *tiny, f"data.path={workdir / 'empty.txt'}")
    assert empty.returncode == 2 and "the train split has no text" in last_error(empty.stderr)
    assert latest.resolve() == trained.resolve()


def test_two_runs_on_one_run_dir(workdir, tiny):
    run_dir = workdir / "shared"
    first = start_script(ROOT / "train.py", *tiny, "train.max_steps=100000", f"hydra.run.dir={run_dir}")
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists():  # the first run holds the dir and has started writing
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.2)
    second = train(run_dir, *tiny, "train.max_steps=40", "train.seed=1")
    first.send_signal(signal.SIGTERM)
    _, first_err = first.communicate(timeout=120)
    assert second.returncode == 2
    assert last_error(second.stderr) == (f"error: hydra.run.dir={run_dir} is in use by another training run "
                                         f"(pid {first.pid}); wait for it to end or choose another hydra.run.dir")
    assert first.returncode == 128 + signal.SIGTERM, first_err[-2000:]
    steps = [m["step"] for m in metrics(run_dir)]
    assert steps == list(range(1, len(steps) + 1))  # one run's lines, none of the second's
    assert "seed: 0" in (run_dir / "config.yaml").read_text()


def files_of_at_most(limit: int):
    """A subprocess's preexec_fn: files may not grow past `limit` bytes, as on a disk that is full."""
    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return small_files


def test_a_write_that_fails_is_one_line_and_keeps_the_previous_checkpoint(copy, tiny, monkeypatch):
    """The checkpoint cannot be written (config.yaml, smaller, can): the previous checkpoint is kept, and the
    config.yaml the failed resume wrote agrees with it, so the plain `train.resume=true` then continues."""
    ckpt = copy / "ckpt"
    before = hashes(ckpt)
    limit = (ckpt / "model.safetensors").stat().st_size // 2
    done = train(copy, *tiny, "train.max_steps=8", "train.resume=true", preexec_fn=files_of_at_most(limit))
    assert done.returncode == 2, done.stderr[-2000:]
    assert last_error(done.stderr) == f"error: cannot write {copy / 'ckpt.tmp' / 'model.safetensors'}: File too large"
    assert hashes(ckpt) == before
    assert not (copy / "ckpt.tmp").exists() and not list(copy.glob("*.tmp-*"))

    assert train_in_process(copy, ["train.resume=true"], monkeypatch) == 0
    assert [m["step"] for m in metrics(copy)] == list(range(1, 9))
    assert torch.load(ckpt / "train_state.pt", weights_only=True)["progress"]["step"] == 8


def test_a_config_yaml_that_cannot_be_written_is_kept_whole_and_the_resume_works_after(copy, tiny, monkeypatch):
    """A full disk as a resume rewrites config.yaml (it is larger than the limit, which its previous bytes are not):
    one line naming the file, config.yaml and the checkpoint as they were (not a 4 KB fragment), and the same
    resume works once the disk has room."""
    config = copy / "config.yaml"
    kept = lambda: {name: digest for name, digest in hashes(copy).items() if name != ".lock"}  # the lock: a pid
    before = kept()
    done = train(copy, *tiny, "train.max_steps=8", "train.resume=true",
                 preexec_fn=files_of_at_most(config.stat().st_size // 2))
    assert done.returncode == 2, done.stderr[-2000:]
    assert last_error(done.stderr) == f"error: cannot write {config}: File too large"
    assert kept() == before and not list(copy.glob("*.tmp-*"))

    assert train_in_process(copy, [*tiny, "train.max_steps=8", "train.resume=true"], monkeypatch) == 0
    assert [m["step"] for m in metrics(copy)] == list(range(1, 9))
    assert "max_steps: 8" in config.read_text()


LOADS = 100  # where reading each file by its name failed 1 load in 12, 100 loads passed by chance 1 run in 4,000


def test_a_checkpoint_read_while_a_run_saves_is_one_save_whole(trained, tmp_path):
    """A writer thread saves a checkpoint again and again (each save's weights and an extra file marked with its
    number), as a run with train.ckpt_interval=1 does, while this thread loads it in a loop: every load succeeds
    and is one save whole. (Reading each file by its name, as loads did, failed about 1 load in 12 here: false
    sha256 mismatches, `missing ...`, a file of the next save.)"""
    model, source = load_checkpoint(trained)
    run_dir, stop, saves = tmp_path / "run", threading.Event(), []

    def save(number: int):
        with torch.no_grad():
            model.tok_emb.weight[0, 0] = number
        save_checkpoint(run_dir / "ckpt", model, source / "tokenizer.model",
                        write_extra=lambda tmp: write_bytes(tmp / "save.txt", str(number).encode()))
        saves.append(number)

    def save_until_stopped():
        while not stop.is_set():
            save(len(saves))

    save(0)
    writer = threading.Thread(target=save_until_stopped)
    writer.start()
    loaded = []
    try:
        while len(loaded) < LOADS:
            checkpoint = read_checkpoint(run_dir)
            number = int(checkpoint.files["save.txt"])
            assert checkpoint.model.tok_emb.weight[0, 0].item() == number  # the weights and the file of one save
            loaded.append(number)
            # and as generate.py, evaluate.py and report.py read it: the model, then its tokenizer by name
            reloaded, ckpt_dir = load_model(run_dir)
            assert check_vocab(reloaded.cfg, ckpt_dir / "tokenizer.model").vocab_size == reloaded.cfg.vocab_size
    finally:
        stop.set()
        writer.join()
    assert len(set(loaded)) > 10  # of many saves
    assert loaded == sorted(loaded) and set(loaded) <= set(saves)  # never an older save than the one before


def test_a_checkpoint_missing_a_file_while_no_save_runs_is_still_named_missing(copy):
    (copy / "ckpt" / "train_state.pt").unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint {copy / 'ckpt'} is missing train_state.pt, which its "
                                              f"config.json lists"):
        load_checkpoint(copy)


def test_a_save_killed_between_its_renames_leaves_the_previous_checkpoint_loadable(copy):
    (copy / "ckpt").rename(copy / "ckpt.old")
    model, ckpt_dir = load_checkpoint(copy)
    assert ckpt_dir == copy / "ckpt.old" and model.cfg.d_model == 32


class CodeOnLoad:
    """Pickled, it would call print at load time: what weights_only refuses."""

    def __reduce__(self):
        return print, ("code ran at load",)


def test_a_train_state_with_a_pickled_payload_is_refused_in_one_line(copy, tiny):
    ckpt = copy / "ckpt"
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    state["payload"] = CodeOnLoad()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    rewrite(ckpt, "train_state.pt", buffer.getvalue())
    before = hashes(ckpt)
    done = train(copy, *tiny, "train.max_steps=8", "train.resume=true")
    assert done.returncode == 2 and "code ran at load" not in done.stdout + done.stderr
    assert last_error(done.stderr) == (
        f"error: cannot resume {ckpt}: unreadable train_state.pt: it holds more than tensors and plain values: "
        f"Unsupported global: GLOBAL print was not an allowed global by default")
    assert hashes(ckpt) == before


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc")
def test_a_corpus_that_cannot_be_read_is_a_read_error_naming_data_path(tiny, workdir, monkeypatch, capsys):
    """/proc/self/mem is a file that open() gives even to root and whose read at offset 0 fails (EIO): a corpus
    that cannot be read, whoever runs the test (root reads files whatever their permissions)."""
    run_dir = workdir / "unreadable"
    assert train_in_process(run_dir, [*tiny, "data.path=/proc/self/mem"], monkeypatch) == 2
    assert last_error(capsys.readouterr().err) == "error: cannot read data.path=/proc/self/mem: Input/output error"
    assert not run_dir.exists()


@pytest.mark.parametrize("override, message", [  # a type: the schema at composition; a range: the code
    ("train.lr=abc", "Error merging override train.lr=abc: Value 'abc' of type 'str' could not be converted to Float"),
    ("train.min_lr=abc", "Error merging override train.min_lr=abc: Value 'abc' of type 'str' could not be converted"),
    ("train.grad_clip=abc", "Error merging override train.grad_clip=abc: Value 'abc'"),
    ("train.sample_temperature=abc", "Error merging override train.sample_temperature=abc: Value 'abc'"),
    ("model.dropout=abc", "Error merging override model.dropout=abc: Value 'abc'"),
    ("model.rope_base=abc", "Error merging override model.rope_base=abc: Value 'abc'"),
    ("train.seed=abc", "Error merging override train.seed=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    ("model.context_length=1.5", "Error merging override model.context_length=1.5: Value '1.5' of type 'float' could not"),
    ("train.betas=[0.9,b]", "Error merging override train.betas=[0.9,b]: Value 'b' of type 'str' could not be converted"),
    ("train.lr_typo=1", "Could not override 'train.lr_typo'."),
    ("train.seed=-1", "train.seed=-1 must be an integer >= 0"),
    ("train.betas=[2,3]", "train.betas=[2.0, 3.0] must be two numbers in [0, 1)"),
    ("model.context_length=1", "model.context_length=1 must be >= 2"),
    ("model.d_ff=0", "model.d_ff=0 must be a positive integer, or null for the FFN's rule"),
    ("train.micro_batch_size=3", "train.batch_size=8 must be a multiple of 1 processes x train.micro_batch_size=3; "
                                 "set train.micro_batch_size to one of 1, 2, 4, 8, or null to choose"),
    ("attention=foo", "In 'config': Could not find 'attention/foo' Available options in 'attention': gated_deltanet gqa mha mla mqa"),
    ("train.max_steps=null", "train.max_steps=null needs a train.time_budget: a run must end by steps or by time"),
    ("model.window_pattern='²:1'", "model.window_pattern='²:1' must be all, alternate or N:1"),  # isdigit, not int()
    ("train.time_budget='٣m'", "train.time_budget='٣m' must be seconds (600) or a duration like 10m"),
])
def test_a_mistyped_setting_is_one_line_before_anything_is_written(tiny, workdir, override, message, monkeypatch,
                                                                   capsys):
    run_dir = workdir / "mistyped"
    fresh_cache = workdir / "cache-mistyped"
    assert train_in_process(run_dir, [*tiny, f"data.cache_dir={fresh_cache}", override], monkeypatch) == 2
    assert last_error(capsys.readouterr().err).startswith(f"error: {message}")
    assert not fresh_cache.exists()  # no data was read or tokenized
    assert not run_dir.exists()  # nor the run dir left: Hydra makes it, the refused run removes it


def test_a_prompt_that_is_not_utf8_is_one_line(trained, capsys):
    code = generate.main(["--ckpt", str(trained), "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == "error: --prompt is not UTF-8 text: byte 0xe9 at character 3\n"


def test_a_progress_field_of_the_wrong_type_is_refused(copy, tiny):
    ckpt = copy / "ckpt"
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    state["progress"]["step"] = "4"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    rewrite(ckpt, "train_state.pt", buffer.getvalue())
    before = hashes(ckpt)
    done = train(copy, *tiny, "train.max_steps=8", "train.resume=true")
    assert done.returncode == 2
    assert "train_state.pt has step='4' (str), which must be an integer" in last_error(done.stderr)
    assert hashes(ckpt) == before


def test_a_finished_run_run_again_says_so_and_writes_nothing(copy, tiny):
    """A complete record is final: the same run again (train.resume=true) exits 0 with one line naming it, and every
    file of its dir stays as it was (summary.json kept its step, losses and throughput)."""
    before = hashes(copy)
    done = train(copy, *tiny, "train.max_steps=4", "train.resume=true")  # the command that trained it, resuming
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"{copy} is complete: 4 steps, ended by train.max_steps; nothing to do (to train it further, raise "
        f"train.max_steps or train.time_budget)")
    assert hashes(copy) == before


def test_a_run_resumed_to_a_larger_target_keeps_a_summary_of_every_field(copy, tiny):
    fresh = summary(copy)
    done = train(copy, *tiny, "train.resume=true", "train.max_steps=6")
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = summary(copy)
    assert {k: type(v) for k, v in resumed.items()} == {k: type(v) for k, v in fresh.items()}
    assert (fresh["session_start_step"], resumed["session_start_step"], resumed["steps"]) == (0, 4, 6)
    assert resumed["tokens_per_s"] > 0 and resumed["first_step_s"] > 0


@pytest.mark.parametrize("now, ended, reached", [
    (dict(max_steps=4), dict(steps=4, ended_by="max_steps"), True),
    (dict(max_steps=6), dict(steps=4, ended_by="max_steps"), False),
    (dict(max_steps=3), dict(steps=4, ended_by="max_steps"), True),
    (dict(max_steps=None, time_budget="1m"), dict(steps=9, ended_by="time_budget", time_budget_s=60.0), True),
    (dict(max_steps=None, time_budget="2m"), dict(steps=9, ended_by="time_budget", time_budget_s=60.0), False),
    (dict(max_steps=50, time_budget="1m"), dict(steps=9, ended_by="time_budget", time_budget_s=60.0), True),
    (dict(max_steps=9, time_budget="2m"), dict(steps=9, ended_by="time_budget", time_budget_s=60.0), True),
], ids=["same-steps", "more-steps", "fewer-steps", "same-budget", "larger-budget", "more-steps-same-budget",
        "larger-budget-steps-reached"])
def test_a_completed_run_trains_on_only_past_a_raised_limit(now, ended, reached):
    assert limits_reached(OmegaConf.create({"max_steps": None, "time_budget": None} | now), ended) is reached


def test_a_temporary_file_of_a_killed_write_goes_with_the_next_write_of_that_file(tmp_path):
    """kill -9 during a write leaves <name>.tmp-<pid>: the next write of that file removes it once its writer is
    gone; a live writer's, and another file's, stay."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = [tmp_path / f"config.yaml.tmp-{dead.stdout.strip()}", tmp_path / f"summary.json.tmp-{dead.stdout.strip()}",
            tmp_path / f"config.yaml.tmp-{os.getpid()}9"]  # the last: no such process either, but for another check
    live = tmp_path / f"config.yaml.tmp-{os.getppid()}"  # a writer still running
    for path in [*left, live]:
        path.write_text("half")
    atomic_write(tmp_path / "config.yaml", lambda f: f.write(b"whole"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["config.yaml", live.name, left[1].name])
    write_json(tmp_path / "summary.json", {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", live.name, "summary.json"]


def test_a_directory_as_data_path_is_named_a_directory(tiny, workdir, monkeypatch, capsys):
    run_dir = workdir / "dir-as-data"
    assert train_in_process(run_dir, [*tiny, f"data.path={workdir}"], monkeypatch) == 2
    assert last_error(capsys.readouterr().err) == (f"error: data.path='{workdir}' is a directory; name its files, "
                                                    f"e.g. data.path='{workdir}/*.txt'")
    assert not run_dir.exists()
