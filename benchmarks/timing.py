"""Timing on a shared machine: runs alternated, medians, tokens/s against a baseline row, and the machine's name."""
from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from training.config import autocast_for


class Device:
    """Where and in which precision both implementations run, and how to wait for them."""

    def __init__(self, name: str):
        self.name = name
        self.cuda = name == "cuda"

    def autocast(self):
        return autocast_for(torch.device(self.name))  # as train.py trains: bf16 autocast on CUDA, fp32 on CPU

    def sync(self):
        if self.cuda:  # kernels run asynchronously; wait for them before reading the clock
            torch.cuda.synchronize()


def timed_alternately(what: str, runs: dict, repeats: int, device: Device,
                      warm_up: bool = True) -> tuple[dict, dict, dict]:
    """Calls the runs in turn, A B C, C B A, A B C ..., `repeats` times, after one untimed call of each if warm_up:
    the order flips every round so that no run always follows the same one.
    Returns ({name: [seconds]}, {name: the last call's return value}, {name: its warm-up call's seconds})."""
    seconds, results, warm_up_s = {name: [] for name in runs}, {}, {}
    print(f"bench: {what}: {', '.join(runs)}, {repeats} timed runs each", file=sys.stderr, flush=True)
    for repeat in range(repeats + warm_up):
        for name, run in list(runs.items())[::1 if repeat % 2 == 0 else -1]:
            device.sync()
            start = time.perf_counter()
            results[name] = run()
            device.sync()
            if repeat >= warm_up:
                seconds[name].append(time.perf_counter() - start)
            else:
                warm_up_s[name] = time.perf_counter() - start
    return seconds, results, warm_up_s


def speed_rows(seconds: dict[str, list[float]], tokens_per_run: dict[str, int], baseline: str) -> dict:
    """Each run's tokens/s from its timed calls: the median, the range, the seconds, and
    vs_baseline = its median tokens/s / the baseline's: above 1 it is faster than the baseline."""
    rows = {}
    for name, tokens in tokens_per_run.items():
        s = seconds[name]
        rows[name] = {"tokens_per_s": tokens / statistics.median(s), "tokens_per_s_range": [tokens / max(s),
                                                                                            tokens / min(s)],
                      "step_s": s}
    for row in rows.values():
        row["vs_baseline"] = row["tokens_per_s"] / rows[baseline]["tokens_per_s"]
    return rows


def speed_table(rows: dict, first: str, baseline: str, columns: dict[str, Callable] | None = None,
                measure: str = "training tokens/s") -> str:
    """speed_rows as markdown; columns: header -> a row's cell, between the range and vs <baseline>."""
    columns = columns or {}
    lines = [f"| {first} | {measure} (median) | min - max | {' | '.join([*columns, f'vs {baseline}'])} |",
             "|---|" + "---:|" * (3 + len(columns))]
    for name, row in rows.items():
        low, high = row["tokens_per_s_range"]
        cells = [f"{row['tokens_per_s']:,.0f}", f"{low:,.0f} - {high:,.0f}", *(cell(row) for cell in columns.values()),
                 f"{row['vs_baseline']:.3f}x"]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def memory_bandwidth(device: Device, megabytes: int = 256) -> float:
    """Bytes per second of the best of 5 copies of a `megabytes` fp32 tensor (each reads and writes it once)."""
    src = torch.randn(megabytes * 2**20 // 4, device=device.name)
    dst, best = torch.empty_like(src), math.inf
    for _ in range(5):
        device.sync()
        start = time.perf_counter()
        dst.copy_(src)
        device.sync()
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best


def machine(device: Device) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    name = f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}"
    return name + (f", {torch.cuda.get_device_name()}" if device.cuda else "")
