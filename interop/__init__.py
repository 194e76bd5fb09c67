"""Other tools' formats: transformers' (hf.py: config.json and safetensors both ways; load.py reads a transformers
directory or this repo's checkpoint) and llama.cpp's GGUF (gguf.py). What each transformers family is, how this
repo's model maps to it and what it refuses, is one file in families/, behind the registry there; layout.py holds the
tensor reshuffles the families share, tokenizer.py the SentencePiece model in both formats."""
from errors import UsageError


class InteropError(UsageError):
    """A model, config or tokenizer that has no faithful counterpart on the other side; one line."""
