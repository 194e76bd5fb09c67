"""The SentencePiece tokenizer: exact round trip for any text, byte fallback, BOS/EOS only as marks."""
import pytest

from data.tokenizer import SPACE_SYMBOL, Tokenizer, train_tokenizer

TRAIN_TEXT = """To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune,
Or to take arms against a sea of troubles
And by opposing end them. To die: to sleep;
""" * 20

HARD_TEXTS = [
    "two  spaces and   three",
    "\ttab\tseparated\t",
    "line\n\nbreaks\n",
    "\n",
    " leading space",
    "   leading spaces",
    "trailing spaces   ",
    "café, naïve, Ærø",
    "cafe\u0301 (decomposed accent)",
    "emoji 🦙🎭 and ❤️",
    "中文 and русский",
    "no\u00a0break space",
    "a literal " + SPACE_SYMBOL + " lower one eighth block",
    "<s> </s> <unk> <0x41>",
    "digits 1234567890",
    "",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return train_tokenizer(TRAIN_TEXT.split("\n"), 400, tmp_path_factory.mktemp("tok") / "tokenizer.model")


@pytest.mark.parametrize("text", HARD_TEXTS)
def test_decode_encode_is_exact(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_round_trip_of_the_hard_texts_joined(tokenizer):
    text = "\n".join(HARD_TEXTS)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_settings_and_special_ids(tokenizer):
    assert tokenizer.vocab_size == 400
    assert (tokenizer.bos_id, tokenizer.eos_id) == (1, 2)
    assert Tokenizer(tokenizer.model_file).encode(TRAIN_TEXT) == tokenizer.encode(TRAIN_TEXT)


def test_unseen_characters_fall_back_to_their_utf8_bytes(tokenizer):
    # The llama emoji is 4 UTF-8 bytes and never occurs in the training text: one byte piece each.
    ids = tokenizer.encode("🦙")
    assert [tokenizer.sp.id_to_piece(i) for i in ids] == ["<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]


def test_merges_make_training_text_shorter_than_its_bytes(tokenizer):
    line = "Whether 'tis nobler in the mind to suffer"
    assert len(tokenizer.encode(line)) < len(line.encode()) / 2


def test_bos_eos_are_never_produced_and_decode_drops_them(tokenizer):
    ids = tokenizer.encode("<s>hello</s>")
    assert tokenizer.bos_id not in ids and tokenizer.eos_id not in ids
    assert tokenizer.decode([tokenizer.bos_id, *tokenizer.encode("hello"), tokenizer.eos_id]) == "hello"
