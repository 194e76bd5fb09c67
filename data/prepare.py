"""Corpus -> train/val split -> tokenizer -> flat token streams, cached on disk.

Cache layout: <data.cache_dir>/<data.name>-<key>/ holds tokenizer.model, train.bin, val.bin
(raw uint16 ids, uint32 above 65536 pieces) and manifest.json. The key hashes the source's
identity and every setting the tokens depend on, plus CACHE_FORMAT, so a changed setting gets a
fresh directory and an unchanged one is memory-mapped without touching the corpus.
Each file is written to a temporary name and renamed; manifest.json goes last and records every
stream's length and the sha256 of each stream and of tokenizer.model, checked at every load (about a
second per GB), so a cache half written by a killed process (no manifest), truncated, corrupted in place
or written by another format is rebuilt with a one-line notice, never used. A build removes the
temporary files a killed build left, and a build that fails removes the directory it created.
The manifest also keeps the val split's unigram level (unigram_val_bpb below), computed once with the
streams: a bincount over the whole train stream, gigabytes on a large corpus.

Each stream is the split's documents, each as BOS + ids + EOS, joined end to end.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from data.batches import eval_batches, get_batch
from data.sources import SOURCES, DataError
from data.task_sets import TaskData, prepare_task
from data.tokenizer import TRAINER_SETTINGS, Tokenizer, train_tokenizer
from storage.files import atomic_write, remove_dead_temporaries, sha256, write_json
from tasks import SET_SETTINGS, task_setting_names

if TYPE_CHECKING:  # datasets is imported by data/sources.py where documents are loaded
    import datasets

CACHE_FORMAT = 3
REQUIRED_SETTINGS = ("name", "source", "val_fraction", "cache_dir", "num_proc")
# data.vocab_size=null: the tokenizer's size by the train split's size in UTF-8 bytes, (bound, pieces) pairs, the
# first bound at or above it. The study of docs/data.md ("The vocabulary rule": the default model, its 5-minute budget,
# 2 seeds) found 512 pieces best at 0.91 MB of train text and 2048 at 4.68 MB, each by more than its seeds' spread;
# the bound between them is where those sizes meet on a log scale (2 MB), not a measured crossing.
VOCAB_RULE = ((2_000_000, 512), (math.inf, 2048))
SPLITS = ("train", "val")


@dataclass
class TokenData:
    tokenizer: Tokenizer
    train: np.ndarray  # 1-D memmap of token ids
    val: np.ndarray
    bytes_per_token: dict  # {"train": float, "val": float}: UTF-8 bytes of the split / its tokens, BOS and EOS included
    stats: dict  # per split: documents, characters, bytes, tokens
    cache_dir: Path
    unigram_val_bpb: float  # the val bpb of predicting each token by its train frequency alone
    context_length: int  # the windows' length

    # what train.py asks of its data (a task's data/task_sets.py answers alike)
    def train_batch(self, batch_size: int, generator, device) -> tuple:
        return get_batch(self.train, batch_size, self.context_length, generator, device)

    def eval_batches(self, batch_size: int, count: int, device) -> list[tuple]:
        """`count` windows of the val split (data/batches.py), with no level's name: no accuracy is scored."""
        return [(x, y, None) for x, y in eval_batches(self.val, batch_size, self.context_length, count, device)]

    def sample_prompt(self, configured: str) -> str:
        return configured

    def task_metrics(self, val: dict, num_params: int) -> dict:
        """A synthetic task's own metrics of an eval (data/task_sets.py); a corpus has none."""
        return {}

    def val_split(self) -> tuple[np.ndarray, float]:
        """(the val token stream, its bytes per token): what evaluate.py and the report score."""
        return self.val, self.bytes_per_token["val"]


def prepare_data(data_cfg, context_length: int, batch_size: int) -> TokenData | TaskData:
    """The corpus's token streams, or a synthetic task's sets where data.task names one (tasks/)."""
    cfg = as_dict(data_cfg)
    if cfg.get("task") is not None:
        return prepare_task(cfg, context_length)
    check_settings(cfg)
    source = SOURCES[cfg["source"]](cfg)
    key_fields = {
        "format": CACHE_FORMAT,
        "source": cfg["source"],
        "identity": source.identity,
        "vocab_size": cfg["vocab_size"] or f"rule {VOCAB_RULE}",
        "val_fraction": cfg["val_fraction"],
        "tokenizer": TRAINER_SETTINGS,
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(cfg["cache_dir"]).expanduser() / f"{cfg['name']}-{key}"

    manifest, problem = read_manifest(cache, key)
    if manifest is None:
        if problem:
            print(f"data: rebuilding the cache in {cache}: {problem}")
        manifest = build_cache(cache, key, source, cfg)
    else:
        print(f"data: using cached tokens in {cache}")
    dtype = np.dtype(manifest["dtype"])
    streams = {split: np.memmap(cache / f"{split}.bin", dtype=dtype, mode="r") for split in SPLITS}
    stats = manifest["splits"]

    needed = batch_size * (context_length + 1)
    for split in SPLITS:
        if len(streams[split]) < needed:
            more = "a larger data.val_fraction" if split == "val" else "a larger corpus"
            raise DataError(f"{describe(cfg)}: the {split} split has {len(streams[split])} tokens, fewer than one batch "
                            f"of batch_size={batch_size} x (context_length={context_length} + 1) = {needed}; use "
                            f"{more}, or a smaller train.micro_batch_size or model.context_length")
    return TokenData(
        tokenizer=Tokenizer(cache / "tokenizer.model"),
        train=streams["train"],
        val=streams["val"],
        bytes_per_token={split: stats[split]["bytes"] / stats[split]["tokens"] for split in SPLITS},
        stats=stats,
        cache_dir=cache,
        unigram_val_bpb=manifest["unigram_val_bpb"],
        context_length=context_length,
    )


def as_dict(data_cfg) -> dict:
    if isinstance(data_cfg, dict):
        return dict(data_cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(data_cfg, resolve=True)


def describe(cfg) -> str:
    return f"data.path={cfg['path']!r}" if cfg["source"] == "text" else f"data={cfg['name']}"


def check_settings(cfg):
    for key in (*SET_SETTINGS, *task_setting_names()):
        if cfg.get(key) is not None:
            raise DataError(f"data.{key}={cfg[key]} is a setting of a synthetic task (data=task), not of "
                            f"{describe(cfg)}")
    for key in REQUIRED_SETTINGS:
        if cfg.get(key) is None:
            raise DataError(f"data.{key} is not set")
    if cfg["source"] not in SOURCES:
        raise DataError(f"data.source={cfg['source']!r} is not one of {', '.join(SOURCES)}")
    for key in ("vocab_size", "num_proc"):
        if (cfg[key] is not None or key == "num_proc") and (not isinstance(cfg[key], int) or cfg[key] < 1):
            raise DataError(f"data.{key}={cfg[key]!r} must be a positive integer")
    if not isinstance(cfg["val_fraction"], (int, float)) or not 0 < cfg["val_fraction"] <= 0.5:
        raise DataError(f"data.val_fraction={cfg['val_fraction']!r} must be in (0, 0.5]")


def split_documents(docs: datasets.Dataset, val_fraction: float):
    """Deterministic split. n * val_fraction whole documents (rounded half up), spread evenly through
    the corpus, go to val. With too few documents for that (fewer than 0.5 / val_fraction), each
    document's last ceil(len * val_fraction) characters go to val and the rest to train."""
    n = len(docs)
    n_val = math.floor(n * val_fraction + 0.5)
    if n_val >= 1:
        val_rows = [(2 * k + 1) * n // (2 * n_val) for k in range(n_val)]
        held_out = set(val_rows)
        return docs.select([i for i in range(n) if i not in held_out]), docs.select(val_rows)
    heads, tails = [], []
    for text in docs["text"]:
        cut = len(text) - math.ceil(len(text) * val_fraction)
        heads.append(text[:cut])
        tails.append(text[cut:])
    return type(docs).from_dict({"text": heads}), type(docs).from_dict({"text": tails})


def read_manifest(cache: Path, key: str) -> tuple[dict | None, str | None]:
    """(the manifest, None) if the cache in `cache` is complete, intact and ours; else (None, what is wrong),
    the reason None where there is no finished cache at all."""
    try:
        manifest = json.loads((cache / "manifest.json").read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"unreadable manifest.json ({e})"
    try:
        if manifest["format"] != CACHE_FORMAT:
            return None, f"manifest.json is of format {manifest['format']}, this nanollama writes {CACHE_FORMAT}"
        if manifest["key"] != key:
            return None, "manifest.json was written for other data settings"
        itemsize = np.dtype(manifest["dtype"]).itemsize
        for s in SPLITS:
            size, expected = (cache / f"{s}.bin").stat().st_size, manifest["splits"][s]["tokens"] * itemsize
            if size != expected:
                return None, f"{s}.bin has {size} bytes, its manifest says {expected}"
        float(manifest["unigram_val_bpb"])
        for name, digest in manifest["sha256"].items():
            if sha256(cache / name) != digest:
                return None, f"{name} does not match the sha256 in manifest.json"
    except OSError as e:
        return None, f"{e.filename}: {e.strerror}"
    except (ValueError, KeyError, TypeError) as e:
        return None, f"manifest.json is not one this nanollama wrote ({type(e).__name__}: {e})"
    return manifest, None


def build_cache(cache: Path, key: str, source, cfg) -> dict:
    print(f"data: building {describe(cfg)} tokens in {cache}")
    docs = source.load()
    if len(docs) == 0:
        raise DataError(f"{describe(cfg)}: the corpus has no documents")
    created = not cache.exists()
    cache.mkdir(parents=True, exist_ok=True)
    try:
        return fill_cache(cache, key, docs, cfg)
    except BaseException:
        if created:  # nothing in it is of use: no empty or half-built dir is left behind
            shutil.rmtree(cache, ignore_errors=True)
        raise


def fill_cache(cache: Path, key: str, docs: datasets.Dataset, cfg) -> dict:
    (cache / "manifest.json").unlink(missing_ok=True)  # from here on the old streams must not be used
    remove_dead_temporaries(cache)  # of a build that was killed
    train_docs, val_docs = split_documents(docs, cfg["val_fraction"])

    model_file = cache / "tokenizer.model"
    tokenizer = None
    if model_file.is_file():  # same key -> same corpus and settings: a tokenizer that made it to disk is final
        try:
            tokenizer = Tokenizer(model_file)
        except (OSError, RuntimeError):  # ... unless it is damaged: train it again
            model_file.unlink()
    if tokenizer is None:
        train_bytes = sum(len(text.encode("utf-8")) for batch in train_docs.iter(batch_size=1024) for text in batch["text"])
        tokenizer = train_on(train_docs, cfg, cfg["vocab_size"] or vocab_for(train_bytes), model_file)
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    splits = {
        split: write_stream(split_docs, model_file, dtype, cache / f"{split}.bin", cfg["num_proc"], split)
        for split, split_docs in zip(SPLITS, (train_docs, val_docs))
    }
    digests = {name: sha256(cache / name) for name in ("tokenizer.model", *(f"{s}.bin" for s in SPLITS))}
    streams = [np.memmap(cache / f"{split}.bin", dtype=dtype, mode="r") for split in SPLITS]
    unigram = unigram_bpb(*streams, tokenizer.vocab_size, splits["val"]["bytes"] / splits["val"]["tokens"])
    manifest = {"format": CACHE_FORMAT, "key": key, "dtype": dtype.name, "splits": splits, "sha256": digests,
                "unigram_val_bpb": unigram}
    write_json(cache / "manifest.json", manifest)
    for split, s in splits.items():
        print(f"data: {split}: {s['documents']} docs, {s['characters']:,} chars, {s['tokens']:,} tokens, "
              f"{s['bytes'] / s['tokens']:.3f} bytes/token")
    return manifest


def unigram_bpb(train_tokens: np.ndarray, val_tokens: np.ndarray, vocab_size: int, bytes_per_token: float) -> float:
    """The val bpb of the unigram solution: each val token predicted by its add-one smoothed frequency
    in the train split, whatever came before it. A model stuck near it has learnt no use of context."""
    counts = np.bincount(train_tokens, minlength=vocab_size)[:vocab_size] + 1.0
    nats = -np.log(counts[val_tokens] / counts.sum()).mean()
    return float(nats / math.log(2) / bytes_per_token)


def vocab_for(train_bytes: int) -> int:
    """data.vocab_size=null: VOCAB_RULE's size for a train split of this many bytes."""
    return next(vocab for bound, vocab in VOCAB_RULE if train_bytes <= bound)


def train_on(train_docs: datasets.Dataset, cfg, vocab_size: int, model_file: Path) -> Tokenizer:
    n_chars = 0

    def lines():
        nonlocal n_chars
        with tqdm(total=len(train_docs), desc="tokenizer: reading train documents", unit="doc") as bar:
            for batch in train_docs.iter(batch_size=256):
                for text in batch["text"]:
                    n_chars += len(text)
                    yield from text.split("\n")
                bar.update(len(batch["text"]))

    rule = "" if cfg["vocab_size"] else " (data.vocab_size=null: the vocabulary rule's size for its bytes)"
    print(f"data: training a {vocab_size}-piece BPE tokenizer on the train split{rule}")
    try:
        return train_tokenizer(lines(), vocab_size, model_file)
    except RuntimeError as e:
        if n_chars == 0:
            raise DataError(f"{describe(cfg)}: the train split has no text") from None
        reason = str(e).strip().splitlines()[-1].split("] ")[-1]  # drop SentencePiece's source location
        raise DataError(f"data.vocab_size={vocab_size}: the train split of {describe(cfg)} cannot "
                        f"support it: {reason}") from None


@functools.lru_cache(maxsize=1)
def cached_tokenizer(model_file: str, written_ns: int) -> Tokenizer:
    return Tokenizer(model_file)  # loaded once per worker process of datasets.map


def encode_documents(batch, model_file: str, written_ns: int, dtype: str):
    tokenizer = cached_tokenizer(model_file, written_ns)
    texts = batch["text"]
    return {
        "ids": [np.array([tokenizer.bos_id, *tokenizer.encode(t), tokenizer.eos_id], dtype=dtype) for t in texts],
        "characters": [len(t) for t in texts],
        "bytes": [len(t.encode("utf-8")) for t in texts],
    }


def write_stream(docs: datasets.Dataset, model_file: Path, dtype: np.dtype, path: Path, num_proc, split: str) -> dict:
    workers = min(num_proc, len(docs))
    encoded = docs.map(
        encode_documents,
        batched=True,
        batch_size=16,  # small batches: the progress bar moves even on corpora of a few long documents
        num_proc=workers if workers > 1 else None,  # datasets starts a process pool even for num_proc=1
        remove_columns=docs.column_names,
        # The file's write time tells a retrained tokenizer apart, for our cache and for datasets' own.
        fn_kwargs={"model_file": str(model_file), "written_ns": model_file.stat().st_mtime_ns, "dtype": dtype.name},
        desc=f"tokenizing {split}",
    )
    n_tokens = 0

    def write(f):
        nonlocal n_tokens
        for chunk in encoded.data.column("ids").chunks:  # flatten() honours the chunk's row offsets
            ids = chunk.flatten().to_numpy().astype(dtype, copy=False)
            f.write(ids.tobytes())
            n_tokens += len(ids)

    atomic_write(path, write)
    return {
        "documents": len(docs),
        "characters": sum(encoded["characters"]),
        "bytes": sum(encoded["bytes"]),
        "tokens": n_tokens,
    }
