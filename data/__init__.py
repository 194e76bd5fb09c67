"""Corpora, tokenizer and token streams: prepare_data() gives cached train/val token streams and
their tokenizer; get_batch() and eval_batches() cut them into (x, y) batches."""
from data.batches import eval_batches, get_batch
from data.prepare import TokenData, prepare_data
from data.sources import DataError
from data.tokenizer import Tokenizer

__all__ = ["prepare_data", "get_batch", "eval_batches", "DataError", "Tokenizer", "TokenData"]
