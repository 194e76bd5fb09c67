"""What a size will take against the memory the machine has free, checked before anything of that size is allocated:
a context, a length or a batch too large is one error line in a second, not an out-of-memory kill minutes later
(or a RuntimeError traceback from deep inside the model under a memory limit).

The callers count what they will allocate at least (position tables, the KV cache, the token window, a batch's
logits), so a refusal is never wrong; a size that passes may still need more than its count at its peak. Nothing
here imports the interop mappings: the engine uses it on every generation.
"""
import os
from pathlib import Path

import torch


def available_memory(device: str | torch.device) -> tuple[int, str]:
    """(bytes a new allocation can take on `device`, where that number comes from): a GPU's free memory, or the
    kernel's MemAvailable (what can be allocated without swapping), lowered to a cgroup's memory.max when one is
    set (a container's or a systemd unit's limit)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free on {device}"
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        free, source = int(meminfo["MemAvailable"].split()[0]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, KeyError, ValueError):  # not Linux
        free, source = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages (sysconf)"
    try:
        cgroup = Path("/sys/fs/cgroup")
        room = int((cgroup / "memory.max").read_text()) - int((cgroup / "memory.current").read_text())
        if room < free:
            free, source = room, "left under the cgroup's memory.max"
    except (OSError, ValueError):  # no cgroup v2, or memory.max is "max"
        pass
    return free, source


def memory_shortfall(needs: dict[str, int], device: str | torch.device) -> str | None:
    """None when the needs, bytes by what holds them, fit in what the device has free; else what a refusal says:
    "needs at least N GB (<each need>), more than the M GB <where that number comes from>"."""
    total = sum(needs.values())
    free, source = available_memory(device)
    if total <= free:
        return None
    parts = ", ".join(f"{name} {size / 1e9:,.1f} GB" for name, size in needs.items() if size)
    return f"needs at least {total / 1e9:,.1f} GB ({parts}), more than the {free / 1e9:,.1f} GB {source}"
