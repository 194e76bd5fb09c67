"""Corpora, tokenizer and token streams: prepare_data() gives cached train/val token streams and
their tokenizer; get_batch() and eval_batches() cut them into (x, y) batches."""
import importlib

_EXPORTS = {"eval_batches": "data.batches", "get_batch": "data.batches", "TokenData": "data.prepare",
            "prepare_data": "data.prepare", "DataError": "data.sources", "Tokenizer": "data.tokenizer"}
__all__ = list(_EXPORTS)


def __getattr__(name):
    # Lazy, so generate.py's `from data.tokenizer import Tokenizer` does not pay for importing `datasets`.
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")
