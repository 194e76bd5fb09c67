"""The processes a test starts, whatever starts them (a fork, a launcher's worker, a tracker they spawn), and whether
any outlives it.

A thread samples this process's descendants every SAMPLE_S from /proc, each by (pid, start time), so that a process
orphaned by a kill (reparented to init, no longer a descendant) is still known by what it was, and a recycled pid
is not taken for it. A process that lives less than one sample cannot outlive anything by much; every process the
multirun tests care about (jobs, loky's workers and resource trackers, submitit's job processes) lives seconds.
"""
import os
import threading
import time
from pathlib import Path

SAMPLE_S = 0.5  # a few ms a sample: every process the tests care about lives for seconds
GRACE_S = 30  # how long a process may take to end once what started it is gone (issue: "a bounded time")


def stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


class Descendants:
    """Every process descended from this one since start(): seen, the (pid, start time) of each."""

    def __init__(self):
        self.seen: set[tuple[int, int]] = set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, name="descendants", daemon=True)

    def start(self) -> "Descendants":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def _sample(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            time.sleep(SAMPLE_S)

    def sample(self) -> None:
        processes = {int(d): s for d in os.listdir("/proc") if d.isdigit() and (s := stat(int(d))) is not None}
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _) in processes.items():
            children.setdefault(parent, []).append(pid)
        below = list(children.get(os.getpid(), []))
        while below:
            pid = below.pop()
            self.seen.add((pid, processes[pid][2]))
            below += children.get(pid, [])

    def running(self, among: set[tuple[int, int]] | None = None) -> list[str]:
        """The processes seen (or those of `among`) that still run: 'pid command line' each (a zombie has ended)."""
        alive = []
        for pid, started in sorted(self.seen if among is None else among):
            now = stat(pid)
            if now is not None and now[2] == started and now[1] != "Z":
                alive.append(f"{pid} {command_line(pid)}")
        return alive

    def outliving(self, among: set[tuple[int, int]] | None = None, grace_s: float = GRACE_S) -> list[str]:
        """running(), once the processes have had grace_s to end; each left is killed, so that none outlives the
        test that finds it."""
        self.sample()
        deadline = time.monotonic() + grace_s
        while (left := self.running(among)) and time.monotonic() < deadline:
            time.sleep(SAMPLE_S)
        for line in left:
            try:
                os.kill(int(line.split()[0]), 9)
            except ProcessLookupError:
                pass
        return left
