"""One writer per run dir: an exclusive fcntl lock on run_dir/.lock, held for the whole run.

The OS drops the lock when the holder's process ends, however it ends (kill -9 included), so a
stale lock never blocks the next run. The holder writes its pid into the file, so a second run
on the same dir can say which process has it. Under DDP only rank 0 takes it (the other ranks
write nothing of their own to the run dir).
"""
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from errors import ConfigError


@contextmanager
def run_dir_lock(run_dir: Path):
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(f"hydra.run.dir={run_dir} is in use by another training run (pid {holder}); "
                              f"wait for it to end or choose another hydra.run.dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
