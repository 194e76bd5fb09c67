"""Shared by the data and training tests: the real configs/data/*.yaml, composed by Hydra, as plain
dicts, and a small corpus to train on."""
import hashlib
import io
import json
import logging
import os
import random
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from settings import compose_config
from study import launch
from training.multirun import die_with_parent

ROOT = Path(__file__).resolve().parent.parent
# Tiny threads-free runs: a 20 k-parameter model gains nothing from a thread pool on shared cores.
TRAIN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
TRAIN = (sys.executable, str(ROOT / "train.py"))


def data_settings(name: str, cache_dir, **changes) -> dict:
    """configs/data/<name>.yaml with data.cache_dir=cache_dir and `changes` applied."""
    data = compose_config([f"data={name}"]).data
    settings = OmegaConf.to_container(data, resolve=True)
    settings.update(cache_dir=str(cache_dir), **changes)
    return settings


def documents(stream, tokenizer) -> list[str]:
    """A token stream cut at its BOS/EOS marks back into decoded documents."""
    starts = np.flatnonzero(stream == tokenizer.bos_id)
    ends = np.flatnonzero(stream == tokenizer.eos_id)
    assert len(starts) == len(ends) and starts[0] == 0 and ends[-1] == len(stream) - 1
    return [tokenizer.decode(stream[s + 1 : e]) for s, e in zip(starts, ends)]


def write_corpus(path: Path) -> Path:
    """A small play-shaped text with enough regularity for the loss to fall within a few steps."""
    rng = random.Random(0)
    words = "the a my good sweet lord lady king night day love heart hand speak come go see know".split()
    speeches = []
    for _ in range(300):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 8))).capitalize() + ","
                 for _ in range(rng.randint(1, 3))]
        speeches.append(rng.choice(["ANNA", "BORIS", "CLARA"]) + "\n" + "\n".join(lines) + "\n")
    path.write_text("\n".join(speeches))
    return path


def tiny_run(workdir: Path) -> list[str]:
    """train.py overrides for a tiny run on write_corpus's text (8 x 32 tokens a step, a 1-layer d 32 model);
    norm=layernorm also exercises the run name built from switches."""
    corpus = write_corpus(workdir / "corpus.txt")
    return ["data=text", f"data.path={corpus}", "data.vocab_size=300", f"data.cache_dir={workdir / 'cache'}",
            "data.num_proc=1", "norm=layernorm", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
            "model.n_kv_heads=1", "model.context_length=32", "train.batch_size=8",
            "train.micro_batch_size=4", "train.time_budget=null", "train.max_steps=8", "train.warmup_fraction=0.25", "train.eval_tokens=256", "train.log_interval=1",
            "train.eval_interval=4", "train.ckpt_interval=4", "train.sample_interval=4", "train.sample_tokens=8",
            "wandb.mode=disabled", f"latest_link={workdir / 'latest'}"]


def metrics(run_dir: Path) -> list[dict]:
    """A run's metrics.jsonl, one dict per line."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(run_dir: Path) -> dict:
    """A run's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())


def hashes(folder: Path) -> dict[str, str]:
    """The sha256 of every file under folder, by its path there."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_train(run_dir: Path, *overrides: str, command=None, **kwargs) -> subprocess.CompletedProcess:
    """train.py (or `command`, e.g. torchrun, in a process started anew) as a user runs it, on run_dir, until it
    ends."""
    if command is not None:
        return subprocess.run([*command, *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=TRAIN_ENV,
                              capture_output=True, text=True, timeout=300, **kwargs)
    return run_script(ROOT / "train.py", *overrides, f"hydra.run.dir={run_dir}", **kwargs)


def run_script(script: Path, *args: str, preexec_fn=None, timeout: float = 300, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """`python <script> <args>` in ROOT with TRAIN_ENV (and env's changes), as subprocess.run(capture_output=True,
    text=True) gives it, run by a fork of this process (start_script), until it ends."""
    started = start_script(script, *args, preexec_fn=preexec_fn, env=env)
    try:
        out, err = started.communicate(timeout)
    except subprocess.TimeoutExpired:
        started.kill()
        started.wait()
        raise
    return subprocess.CompletedProcess(started.args, started.returncode, out, err)


def start_script(script: Path, *args: str, preexec_fn=None, new_session: bool = False, env: dict | None = None,
                 output=None) -> "ForkedScript":
    """`python <script> <args>` started as subprocess.Popen(stdout=PIPE, stderr=PIPE, text=True) starts it, run by a
    fork of this process: the script's own code runs as __main__ in a process of its own (its signals, its exit, its
    state are its own), without the ~4 s a new interpreter spends importing torch and Hydra. preexec_fn runs in the
    fork before the script, as Popen's does; a resource limit it sets binds the captured stdout and stderr too, as
    they are files here. new_session: the fork leads a process group of its own (Popen's start_new_session).
    output: a file that takes both stdout and stderr (Popen's stdout=output, stderr=STDOUT): then nothing is
    captured, and communicate returns ("", "")."""
    return ForkedScript(script, args, preexec_fn, new_session, env or {}, output)


class ForkedScript:
    """What start_script started: Popen's pid, poll, wait, send_signal, kill, communicate and returncode."""

    def __init__(self, script: Path, args, preexec_fn, new_session: bool, env: dict, output=None):
        self.args, self.returncode, self._captured = [str(script), *args], None, output is None
        self._out, self._err = (output, output) if output else (tempfile.TemporaryFile(), tempfile.TemporaryFile())
        sys.stdout.flush(), sys.stderr.flush()  # what is buffered is this process's to print, not the fork's too
        self.pid = os.fork()
        if self.pid == 0:
            if new_session:
                os.setsid()
            os._exit(run_as_main(script, args, self._out.fileno(), self._err.fileno(), preexec_fn, env))

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Waits for the end, then (stdout, stderr)."""
        self.wait(timeout)
        return tuple(self._read(f) if self._captured else "" for f in (self._out, self._err))

    @staticmethod
    def _read(file) -> str:
        file.seek(0)
        return file.read().decode(errors="replace")


def run_as_main(script: Path, args, out_fd: int, err_fd: int, preexec_fn, env: dict) -> int:
    """In start_script's fork: what `python <script> <args>` does from its first line, its exit code as the
    interpreter would give it. It ends with os._exit, never returning into pytest's code."""
    code = 1
    try:
        os.dup2(out_fd, 1), os.dup2(err_fd, 2)  # C-level writes too (torch's warnings)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        os.chdir(ROOT)
        os.environ.clear()
        os.environ.update(TRAIN_ENV, **env)
        # pytest's warning capture would keep the script's warnings in this fork's memory: print them to its stderr
        # (pytest's filters still choose which)
        warnings.showwarning = warnings._showwarning_orig
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()
        sys.argv, sys.path[0] = [str(script), *args], str(script.parent)
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as ended:  # the interpreter's reading of sys.exit's argument
        if ended.code is None or isinstance(ended.code, int):
            code = ended.code or 0
        else:
            print(ended.code, file=sys.stderr)
    except KeyboardInterrupt:  # python then dies by SIGINT itself, returncode -2
        traceback.print_exc()
        sys.stdout.flush(), sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
    return code


def train_in_process(run_dir: Path, overrides: list[str], monkeypatch) -> int:
    """`python train.py <overrides> hydra.run.dir=<run_dir>` in this process, without an interpreter to start (what a
    test patches in the modules train.py imports applies): its exit code. The run's own Ctrl-C handling is undone."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"])
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    # Hydra's own logging config gives the root logger a handler on this test's captured stdout, at INFO: left
    # there, a later test's library log line (gguf's writer logs at INFO) goes to that closed stream and fails
    root_handlers, root_level = list(logging.root.handlers), logging.root.level
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
        return 0
    except SystemExit as ended:
        return ended.code
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        logging.root.handlers[:] = root_handlers
        logging.root.setLevel(root_level)


def multirun_in_a_fork(command: list[str], output, cwd: Path = ROOT) -> "ForkedScript":
    """study/launch.start_multirun's process as a fork of this one that runs train.py as __main__ (start_script), in
    its own session and dying with its parent as Popen's is: the same multirun, without the ~4 s a new interpreter
    spends importing torch at each stage. The tests of a study killed outright keep the real interpreter."""
    python, script, *args = command
    assert python == sys.executable and Path(cwd) == ROOT  # start_script runs in ROOT
    return start_script(Path(script), *args, new_session=True, preexec_fn=die_with_parent, output=output)


@contextmanager
def stages_in_forks():
    """Every stage study/launch.start_multirun starts from here on, in this process or a fork of it (run_script),
    is multirun_in_a_fork's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch, "start_multirun", multirun_in_a_fork)
        yield
