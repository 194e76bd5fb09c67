"""One writer per dir: an exclusive fcntl lock on a file in it, held for as long as the writer works there.

The OS drops the lock when the holder's process ends, however it ends (kill -9 included), so a
stale lock never blocks the next writer. The holder writes its pid into the file, so a second writer
can say which process has it. A run dir's lock is run_dir/.lock, held for the whole run (under DDP
only rank 0 takes it: the other ranks write nothing of their own to the run dir); a multirun's and a
study's locks are training/multirun.py's and sweep.py's.
"""
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from errors import ConfigError


@contextmanager
def dir_lock(lock_file: Path, in_use: str):
    """Holds lock_file; in_use: the ConfigError's message when another process holds it, with {pid}. A holder that
    fails before writing anything beside the lock (a run refused for its data) leaves no dir behind."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(in_use.format(pid=holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        except BaseException:  # the holder failed: a dir that holds nothing but this lock is not left behind
            if [path.name for path in lock_file.parent.iterdir()] == [lock_file.name]:
                lock_file.unlink()
                lock_file.parent.rmdir()
            raise
    finally:
        os.close(fd)  # releases the lock


def lock_holder(lock_file: Path) -> int | None:
    """The pid of the process that holds (or last held) lock_file, None where there is none."""
    try:
        return int(lock_file.read_text())
    except (OSError, ValueError):
        return None


def run_dir_lock(run_dir: Path):
    return dir_lock(run_dir / ".lock", f"hydra.run.dir={run_dir} is in use by another training run (pid {{pid}}); "
                                       f"wait for it to end or choose another hydra.run.dir")
