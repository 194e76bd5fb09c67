"""The SentencePiece model in other tools' terms: transformers' tokenizer_config.json (its LlamaTokenizer, rebuilt
from tokenizer.model) and llama.cpp's tokenizer.ggml.* keys (its "llama" tokenizer). Every family shares it: this repo
trains one tokenizer kind."""
from __future__ import annotations

from pathlib import Path

import gguf
from sentencepiece import sentencepiece_model_pb2

# The SentencePiece settings under which a LLaMA tokenizer (transformers' LlamaTokenizer, llama.cpp's "llama"
# tokenizer: BPE merges by score, byte fallback, spaces as U+2581, nothing normalised) encodes as SentencePiece does.
LLAMA_TOKENIZER = {"model_type": "BPE", "byte_fallback": True, "normalization_rule_name": "identity",
                   "remove_extra_whitespaces": False}


def read_tokenizer_proto(tokenizer_file: Path) -> sentencepiece_model_pb2.ModelProto:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(tokenizer_file).read_bytes())
    return proto


def settings_unlike(proto: sentencepiece_model_pb2.ModelProto, wanted: dict) -> list[str]:
    """The tokenizer's settings that differ from `wanted`, as 'name=value'."""
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    settings = {"model_type": sentencepiece_model_pb2.TrainerSpec.ModelType.Name(trainer.model_type),
                "byte_fallback": trainer.byte_fallback, "normalization_rule_name": normalizer.name,
                "remove_extra_whitespaces": normalizer.remove_extra_whitespaces,
                "add_dummy_prefix": normalizer.add_dummy_prefix}
    return [f"{name}={settings[name]!r}" for name, value in wanted.items() if settings[name] != value]


def hf_tokenizer_config(tokenizer_file: Path, context_length: int) -> tuple[dict | None, str]:
    """(tokenizer_config.json, '') when transformers' LlamaTokenizer reproduces this SentencePiece
    model's ids exactly, else (None, why not).

    transformers rebuilds LlamaTokenizer from tokenizer.model as a byte-fallback BPE with no
    normalisation and a fixed whitespace rule, so only a model trained that way, without a dummy
    prefix (add_prefix_space=False), encodes the same: leading spaces otherwise differ.
    """
    proto = read_tokenizer_proto(tokenizer_file)
    trainer = proto.trainer_spec
    unfaithful = settings_unlike(proto, LLAMA_TOKENIZER | {"add_dummy_prefix": False})
    if unfaithful:
        return None, (f"tokenizer.model has {', '.join(unfaithful)}, which transformers' LlamaTokenizer does not "
                      f"reproduce; load it with sentencepiece.SentencePieceProcessor(model_file=...)")
    special = {f"{kind}_token": proto.pieces[i].piece
               for kind, i in (("bos", trainer.bos_id), ("eos", trainer.eos_id), ("unk", trainer.unk_id),
                               ("pad", trainer.pad_id)) if i >= 0}
    return {"tokenizer_class": "LlamaTokenizer", **special,
            # training joins documents as BOS text EOS, so a prompt starts with BOS
            "add_bos_token": trainer.bos_id >= 0, "add_eos_token": False,
            "add_prefix_space": False, "legacy": False, "clean_up_tokenization_spaces": False,
            "model_max_length": context_length}, ""


def add_gguf_tokenizer(writer: gguf.GGUFWriter, proto: sentencepiece_model_pb2.ModelProto) -> None:
    """The SentencePiece model as llama.cpp's "llama" tokenizer: pieces, scores and types as they are in it."""
    piece_type = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([p.piece.encode() for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([gguf.TokenType[piece_type.Name(p.type)] for p in proto.pieces])  # the same six names
    trainer = proto.trainer_spec
    for add_id, i in ((writer.add_bos_token_id, trainer.bos_id), (writer.add_eos_token_id, trainer.eos_id),
                      (writer.add_unk_token_id, trainer.unk_id), (writer.add_pad_token_id, trainer.pad_id)):
        if i >= 0:  # SentencePiece's -1: the tokenizer has no such piece
            add_id(i)
    # training joins documents as BOS text EOS, so a prompt starts with BOS (generate.py's too)
    writer.add_add_bos_token(trainer.bos_id >= 0)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
