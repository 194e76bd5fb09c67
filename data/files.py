"""Files written whole or not at all: a reader (a resumed run, another process, a plot viewer) sees the old
file or the new one, never half of one. No heavy imports, so every script can use it."""
import os
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """write(f) fills a temporary file beside `path` (opened "wb"), which then replaces `path` in one rename."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)
