"""SentencePiece BPE tokenizer with an exact round trip: decode(encode(text)) == text for any text.

Exactness comes from the trainer settings below: no Unicode normalisation, no dummy prefix space,
whitespace kept verbatim (runs of spaces may become pieces of their own), and byte fallback, so a
character outside the vocabulary becomes its UTF-8 bytes instead of <unk>.
BOS and EOS are control ids that mark document boundaries in the token streams; encode never adds
them and decode drops them.
"""
import io
import os
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from storage.files import atomic_write

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
TRAINER_SETTINGS = dict(
    model_type="bpe",
    byte_fallback=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    allow_whitespace_only_pieces=True,
    split_digits=True,
    character_coverage=0.9995,  # the rarest characters go to byte fallback instead of taking vocab slots
    unk_id=UNK_ID,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    pad_id=-1,
    # A sample of lines bounds training time and memory on large corpora (TinyStories has ~20 M lines).
    input_sentence_size=2_000_000,
    shuffle_input_sentence=True,
)

# SentencePiece writes spaces as U+2581 internally, so a literal U+2581 in the text would decode as a
# space. Encoding that character through its byte-fallback pieces keeps the round trip exact.
SPACE_SYMBOL = "\u2581"


class Tokenizer:
    def __init__(self, model_file):
        self.model_file = Path(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        self.vocab_size = self.sp.vocab_size()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        self._space_symbol_ids = [self.sp.piece_to_id(f"<0x{b:02X}>") for b in SPACE_SYMBOL.encode()]

    def encode(self, text: str) -> list[int]:
        if SPACE_SYMBOL not in text:
            return self.sp.encode(text)
        first, *rest = text.split(SPACE_SYMBOL)
        ids = self.sp.encode(first)
        for part in rest:
            ids += self._space_symbol_ids + self.sp.encode(part)
        return ids

    def decode(self, ids) -> str:
        """ids: a list, numpy array or 1-D tensor of token ids."""
        return self.sp.decode(ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids])


def train_tokenizer(lines: Iterable[str], vocab_size: int, model_file) -> Tokenizer:
    """Train on `lines` (SentencePiece learns within lines; newlines are encoded as byte pieces) and
    write the model to `model_file` atomically. Raises RuntimeError when the corpus cannot fill
    `vocab_size` pieces."""
    model = io.BytesIO()
    spm.set_random_generator_seed(0)  # the line sample, hence the tokenizer, is the same on every run
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
        **TRAINER_SETTINGS,
    )
    model_file = Path(model_file)
    atomic_write(model_file, lambda f: f.write(model.getvalue()))
    return Tokenizer(model_file)
