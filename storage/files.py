"""Files written whole or not at all: a reader (a resumed run, another process, a plot viewer) sees the old
file or the new one, never half of one. No heavy imports, so every script can use it."""
import glob
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from errors import UsageError


TMP_MARK = ".tmp-"  # atomic_write's temporary file: <name>.tmp-<pid of the writer>


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yields a temporary path beside `path` for a writer that opens files by name; when the block succeeds
    the file there replaces `path` in one rename."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:  # a full disk, a kill signal's exception: no half-written temporary left behind
        tmp.unlink(missing_ok=True)
        raise
    remove_dead_temporaries(path.parent, path.name)  # of an earlier write of this file that was killed (kill -9)


def atomic_write(path: Path, write) -> None:
    """write(f) fills a temporary file beside `path` (opened "wb"), which then replaces `path` in one rename."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        write(f)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A script's output file or folder: an OSError in the block (a full disk, a missing or read-only folder, a
    directory where a file goes) becomes one UsageError line, `cannot write <path>: <the OS's reason>`, naming
    what the user asked for rather than the temporary file that failed. Only writes go in the block, so that a
    failed read is never called a write."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


def write_bytes(path: Path, data: bytes) -> None:
    """path.write_bytes(data), with the path in the OSError of a failed write (a full disk's error names no file)."""
    try:
        Path(path).write_bytes(data)
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_json(path: Path, values: dict) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(values, indent=2) + "\n").encode()))


def remove_dead_temporaries(folder: Path, name: str | None = None) -> None:
    """The temporary files atomic_write left in `folder` (of the file `name`, default every file) when its process
    was killed, once that process is gone (a process writing there at this moment keeps its own)."""
    for tmp in Path(folder).glob(f"{'*' if name is None else glob.escape(name)}{TMP_MARK}*"):
        try:
            os.kill(int(tmp.name.rsplit(TMP_MARK, 1)[1]), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (ValueError, PermissionError):  # not atomic_write's naming, or a live process of another user
            pass


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def atomic_symlink(link: Path, target: Path) -> None:
    """Points `link` at `target` (relative to the link's folder, so the pair can move together), in one rename:
    a reader finds the old target or the new one, never no link."""
    link = Path(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f"{link.name}{TMP_MARK}{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(Path(target).resolve(), link.parent.resolve()), tmp)
    os.replace(tmp, link)
    remove_dead_temporaries(link.parent, link.name)


@contextmanager
def atomic_dir(final_dir: str | Path) -> Iterator[Path]:
    """Yields an empty sibling directory to fill; when the block succeeds it replaces final_dir."""
    final_dir = Path(final_dir)
    tmp, old = final_dir.with_name(final_dir.name + ".tmp"), final_dir.with_name(final_dir.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final_dir.exists():
        shutil.rmtree(old, ignore_errors=True)
        final_dir.rename(old)
    tmp.rename(final_dir)
    shutil.rmtree(old, ignore_errors=True)
