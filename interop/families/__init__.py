"""The registry of transformers families: one file each in this folder (base.py: what they share), listed from the
most general to the most specific. Export, import and the GGUF writer read it:

    family_of(cfg)         the family a ModelConfig exports to (or is refused by, with its reasons): the most specific
                           that claims it, so a family refines the ones listed before it (Mistral is LLaMA's with a
                           window, Qwen3-MoE Qwen3's with experts)
    family_for(hf)         the family of a config.json's model_type, or an InteropError naming the supported ones
    reader_for(hf)         as family_for, or base's generic reading for a model_type no family has (the KV-cache
                           estimator reads any config.json)

Adding a family: its file (a Family subclass and FAMILY = its instance) and its line in FAMILIES (imported above it).
"""
from interop import InteropError
from interop.families import deepseek_v3, gpt_oss, llama, ministral, mistral, mixtral, qwen2, qwen3, qwen3_5, \
    qwen3_moe, qwen3_next
from interop.families.base import Family
from model.config import ModelConfig

FAMILIES = (
    llama.FAMILY,
    mistral.FAMILY,
    ministral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    mixtral.FAMILY,
    qwen3_moe.FAMILY,
    qwen3_5.FAMILY,
    qwen3_next.FAMILY,  # Qwen3-MoE's with a shared expert, and Qwen3.5's hybrid with experts
    deepseek_v3.FAMILY,
    gpt_oss.FAMILY,
)
BY_MODEL_TYPE = {family.model_type: family for family in FAMILIES}
GENERIC = Family()


def family_of(cfg: ModelConfig) -> Family:
    return next(family for family in reversed(FAMILIES) if family.claims(cfg))  # LLaMA claims every model


def family_for(hf: dict) -> Family:
    family = BY_MODEL_TYPE.get(hf.get("model_type"))
    if family is None:
        supported = [repr(family.model_type) for family in FAMILIES if family.refusal is None]
        raise InteropError(f"model_type={hf.get('model_type')!r} is not supported; only model_type="
                           f"{' or '.join(supported)} is")
    if family.refusal is not None:
        raise InteropError(f"model_type={family.model_type!r} is not supported: {family.refusal}")
    return family


def reader_for(hf: dict) -> Family:
    return BY_MODEL_TYPE.get(hf.get("model_type"), GENERIC)
