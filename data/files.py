"""Files written whole or not at all: a reader (a resumed run, another process, a plot viewer) sees the old
file or the new one, never half of one. No heavy imports, so every script can use it."""
import hashlib
import os
from pathlib import Path


TMP_MARK = ".tmp-"  # atomic_write's temporary file: <name>.tmp-<pid of the writer>


def atomic_write(path: Path, write) -> None:
    """write(f) fills a temporary file beside `path` (opened "wb"), which then replaces `path` in one rename."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:  # a full disk, a kill signal's exception: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    """path.write_bytes(data), with the path in the OSError of a failed write (a full disk's error names no file)."""
    try:
        Path(path).write_bytes(data)
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def remove_dead_temporaries(folder: Path) -> None:
    """The temporary files atomic_write left in `folder` when its process was killed, once that process is gone
    (a process writing there at this moment keeps its own)."""
    for tmp in folder.glob(f"*{TMP_MARK}*"):
        try:
            os.kill(int(tmp.name.rsplit(TMP_MARK, 1)[1]), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (ValueError, PermissionError):  # not atomic_write's naming, or a live process of another user
            pass


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
