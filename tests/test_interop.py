"""Interop with transformers: export.py writes a LlamaForCausalLM directory (Qwen3ForCausalLM with QK-norm),
interop/load.py reads one, with equal logits and greedy text both ways, and the refusals of what has no
counterpart."""
import copy
import json
import re
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM, GPT2Config,
                          GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen3Config,
                          Qwen3ForCausalLM)

from data.tokenizer import TRAINER_SETTINGS, Tokenizer
import generate
from interop import InteropError
from interop.families import FAMILIES, family_for, family_of
from interop.hf import hf_config, hf_head_dim, hf_layer_types, hf_state_dict, model_config_from_hf
from interop.load import load_model
from interop_helpers import PROMPT, TEXTS, VOCAB, corpus, greedy_ids, llama_cfg, one_error_line, run_export
from model.block import rope_dim
from model.transformer import Transformer
from settings import compose_config
from storage.checkpoint import CheckpointError, save_checkpoint
from training.config import model_config
from weights import far_from_init


# model.qk_norm -> the transformers architecture that a model with it exports to
TRANSFORMERS_CLASSES = {"none": (LlamaConfig, LlamaForCausalLM), "rmsnorm": (Qwen3Config, Qwen3ForCausalLM)}


def hf_model(tie: bool, qk_norm: str = "none", intermediate_size: int = 96) -> PreTrainedModel:
    """A transformers LLaMA (or Qwen3) of llama_cfg's sizes, far from init: its q/k norm gains too."""
    config_class, model_class = TRANSFORMERS_CLASSES[qk_norm]
    return far_from_init(model_class(config_class(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=intermediate_size, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-4,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, tie_word_embeddings=tie,
        bos_token_id=1, eos_token_id=2)))


def transformers_greedy_ids(hf: PreTrainedModel, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
    return out[0, len(prompt):].tolist()


def assert_same_model(ours: Transformer, ckpt: Path, theirs: PreTrainedModel, tok: Tokenizer, capsys,
                      float64_steps: float = 2 ** -19, float32_steps: float | None = None):
    """Equal logits, equal greedy ids, and generate.py --temperature 0 on ckpt prints transformers' greedy text."""
    tokens = torch.randint(VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, expected = ours(tokens), theirs(tokens).logits
        logits64, expected64 = copy.deepcopy(ours).double()(tokens), copy.deepcopy(theirs).double()(tokens).logits
    assert expected.std() > 1  # the tolerance is small next to the logits
    # In float32 ours runs the very same torch ops in the same order (0.0 apart, measured, LLaMA and Qwen3 alike).
    # 1e-5 is ~10 float32 steps of the largest logits (~10, step 9.5e-7). (float32_steps: gpt-oss, below)
    float32_bound = 1e-5 if float32_steps is None else float32_steps * expected.abs().max().item()
    assert (logits - expected).abs().max().item() <= float32_bound
    # In float64 too, though only to float32's precision: transformers' RMSNorm (QK-norm's included) computes in
    # float32 whatever the model's dtype, so each norm's output is rounded to float32 there and not here. Measured
    # on these models: 3.3e-6 to 3.8e-6 apart for Qwen3, 8.4e-6 to 1.09e-5 for LLaMA, at most 16 float32 steps
    # (2^-20) of the largest logit; a dropped or swapped weight moves logits of std > 1 by O(1).
    # (float64_steps: MLA's two more norms a layer round more, below)
    assert (logits64 - expected64).abs().max().item() <= float64_steps * expected64.abs().max().item()
    prompt = [tok.bos_id] + tok.encode(PROMPT)
    new = transformers_greedy_ids(theirs, prompt)
    assert len(set(new)) > 3  # a real continuation, not one token repeated
    assert greedy_ids(ours, prompt, tok.eos_id) == new
    capsys.readouterr()
    assert generate.main(["--ckpt", str(ckpt), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "40",
                          "--device", "cpu"]) == 0
    assert capsys.readouterr().out == tok.decode(prompt + new) + "\n"


def exported(model: Transformer, tmp_path: Path, tokenizer_file, class_name: str) -> PreTrainedModel:
    """model saved as a checkpoint, exported to tmp_path / "hf" and loaded by transformers as class_name (its eager
    loop over experts: its grouped_mm, the CPU default, has no float64 kernel)."""
    save_checkpoint(tmp_path / "ckpt", model, tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 0
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", experts_implementation="eager").eval()
    assert type(theirs).__name__ == class_name
    return theirs


# --- export: this repo -> transformers ---------------------------------------------------------

@pytest.mark.parametrize("tie, qk_norm", [(True, "none"), (False, "none"), (True, "rmsnorm")])
def test_export_loads_as_llama_or_qwen3_with_equal_logits_and_greedy_text(tmp_path, tokenizer_file, tok, capsys,
                                                                         tie, qk_norm):
    # far from init: the q/k norm gains too, so a mapping that drops or swaps them fails
    model = far_from_init(Transformer(llama_cfg(tie_embeddings=tie, qk_norm=qk_norm)))
    save_checkpoint(tmp_path / "ckpt", model, tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 0
    # every file readable by whoever may read the folder, as any file written here is (the umask's mode)
    assert {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "hf").iterdir()} == {
        path.name: (tmp_path / "hf" / "config.json").stat().st_mode & 0o777 for path in (tmp_path / "hf").iterdir()}

    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs) is TRANSFORMERS_CLASSES[qk_norm][1]
    if qk_norm == "rmsnorm":  # every layer attends to the whole context, as ours
        assert theirs.config.layer_types == ["full_attention"] * 2 and theirs.config.sliding_window is None
    assert (theirs.lm_head.weight is theirs.model.embed_tokens.weight) == tie
    assert ("lm_head.weight" in load_file(tmp_path / "hf" / "model.safetensors")) == (not tie)
    assert (theirs.config.bos_token_id, theirs.config.eos_token_id) == (tok.bos_id, tok.eos_id)
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys)

    # and back: the exported directory loads here as the same model
    reloaded, hf_dir = load_model(tmp_path / "hf")
    tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens), model(tokens))
    assert hf_dir == tmp_path / "hf" and reloaded.cfg.qk_norm == qk_norm


def test_export_tokenizer_files_encode_like_ours(tmp_path, tokenizer_file, tok):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg()), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 0
    assert (tmp_path / "hf" / "tokenizer.model").read_bytes() == tokenizer_file.read_bytes()
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS + corpus()[:50]:
        ids = theirs.encode(text)
        assert ids == [tok.bos_id] + tok.encode(text), text  # BOS first, as in training and generation
        assert theirs.decode(ids, skip_special_tokens=True) == tok.decode(ids) == text


def test_export_ships_only_tokenizer_model_when_transformers_would_encode_differently(tmp_path, capsys):
    # with a dummy prefix, transformers' LlamaTokenizer drops the dummy space before leading whitespace
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=VOCAB, minloglevel=2, **TRAINER_SETTINGS | {"add_dummy_prefix": True})
    prefixed = tmp_path / "sp.model"
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg()), prefixed)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 0
    assert "note: no tokenizer_config.json: tokenizer.model has add_dummy_prefix=True" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors",
                                                                   "tokenizer.model"]


@pytest.mark.parametrize("switches", [
    dict(norm="layernorm"), dict(norm_position="post"), dict(position="sinusoidal"), dict(position="learned"),
    dict(position="none"), dict(ffn="relu"), dict(ffn="gelu"), dict(ffn="relu2"), dict(bias=True),
    dict(norm="layernorm", norm_position="post", position="sinusoidal", ffn="relu", bias=True),
    dict(qk_norm="rmsnorm", ffn="relu2"), dict(qk_norm="rmsnorm", norm_position="post", bias=True),
    dict(logit_softcap=15.0), dict(value_embeddings="alternate"), dict(residual_scalars=True)])
def test_export_refuses_switches_with_no_counterpart_naming_each(tmp_path, tokenizer_file, capsys, switches):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(**switches)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 2
    arch = "Qwen3" if switches.get("qk_norm") == "rmsnorm" else "LLaMA"  # model.qk_norm picks which it would be
    named = ", ".join(f"model.{key}={value}" for key, value in switches.items() if key != "qk_norm")
    assert f"error: no transformers {arch} equivalent for {named} ({arch} is model.norm=rmsnorm" in one_error_line(
        capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing written, no temporary left


def test_export_refuses_non_empty_out_unless_force(tmp_path, tokenizer_file, capsys):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg()), tokenizer_file)
    out = tmp_path / "hf"
    out.mkdir()
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", out) == 0  # an empty directory is fine
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", out) == 2
    assert f"--out {out} exists and is not empty; pass --force" in one_error_line(capsys)
    (out / "config.json").write_text("mine")
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", out) == 2
    assert (out / "config.json").read_text() == "mine"
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", out, "--force") == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "hf"]


def training_run(folder: Path, tokenizer_file: Path) -> Path:
    """A run dir as train.py leaves it, as far as export can tell: its config.yaml and its checkpoint in ckpt/."""
    save_checkpoint(folder / "ckpt", far_from_init(Transformer(llama_cfg())), tokenizer_file)
    (folder / "config.yaml").write_text("train:\n  max_steps: 8\n")
    return folder


def files_and_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out, force, why", [
    ("ckpt/hf", False, "is inside the checkpoint dir {run}/ckpt"),  # the next save would delete it
    ("ckpt/m.gguf", False, "is inside the checkpoint dir {run}/ckpt"),
    ("ckpt.tmp/hf", True, "is inside the checkpoint dir {run}/ckpt.tmp"),  # where the next save starts
    ("ckpt.old", True, "is the checkpoint dir {run}/ckpt.old"),
    ("ckpt", True, "is the checkpoint dir {run}/ckpt"),  # --force would replace the training checkpoint
    (".", True, "holds the checkpoint {run}/ckpt, which --force never replaces")])
def test_export_never_goes_into_or_replaces_a_training_checkpoint(tmp_path, tokenizer_file, capsys, out, force, why):
    run = training_run(tmp_path / "run", tokenizer_file)
    before = files_and_bytes(tmp_path)
    fmt = ["--format", "gguf"] if out.endswith(".gguf") else []
    assert run_export("--ckpt", run, "--out", run / out, *fmt, *(["--force"] if force else [])) == 2
    assert why.format(run=run) in one_error_line(capsys)
    assert files_and_bytes(tmp_path) == before and sorted(p.name for p in run.iterdir()) == ["ckpt", "config.yaml"]


def test_export_names_the_run_it_read_by_its_real_path_and_a_failed_write_keeps_the_old_export(tmp_path,
                                                                                               tokenizer_file, capsys):
    """Through a link, as outputs/latest is; then the same export with --force while files may not grow past half
    the weights (a disk that fills): one error line naming --out, after what was read, and the first export whole."""
    run = training_run(tmp_path / "run", tokenizer_file)
    (tmp_path / "latest").symlink_to(run)
    export = ("--ckpt", tmp_path / "latest", "--out", tmp_path / "hf")
    assert run_export(*export) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"checkpoint: {run.resolve()}"
    before = files_and_bytes(tmp_path / "hf")
    limit = (run / "ckpt" / "model.safetensors").stat().st_size // 2
    handler, limits = signal.signal(signal.SIGXFSZ, signal.SIG_IGN), resource.getrlimit(resource.RLIMIT_FSIZE)
    try:  # a write past the limit fails with EFBIG (SIGXFSZ ignored), as a full disk fails with ENOSPC
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limits[1]))
        code = run_export(*export, "--force")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    captured = capsys.readouterr()
    assert code == 2 and captured.err == f"error: cannot write {tmp_path / 'hf'}: File too large\n"
    assert captured.out == f"checkpoint: {run.resolve()}\n"
    assert files_and_bytes(tmp_path / "hf") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "latest", "run"]  # no hf.tmp left


def test_export_refuses_vocab_mismatch(tmp_path, tokenizer_file, capsys):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(vocab_size=VOCAB + 20)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 2
    assert f"the model has vocab_size={VOCAB + 20} but its tokenizer" in one_error_line(capsys)
    assert not (tmp_path / "hf").exists()


# --- import: transformers -> this repo ---------------------------------------------------------

# 96 is the rule's SwiGLU width at d 32 (8/3 d up to 32s); 40 is narrower than the rule builds: model.d_ff takes it
@pytest.mark.parametrize("tie, shard, qk_norm, ffn_width", [
    (True, False, "none", 96), (False, False, "none", 96), (False, True, "none", 96), (False, False, "rmsnorm", 96),
    (False, False, "none", 40)])
def test_import_transformers_dir_with_equal_logits_and_greedy_text(tmp_path, tokenizer_file, tok, capsys, tie, shard,
                                                                   qk_norm, ffn_width):
    theirs = hf_model(tie, qk_norm, ffn_width)
    theirs.save_pretrained(tmp_path / "hf", max_shard_size="40KB" if shard else "1GB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file() == shard
    shutil.copyfile(tokenizer_file, tmp_path / "hf" / "tokenizer.model")
    ours, hf_dir = load_model(tmp_path / "hf")
    assert hf_dir == tmp_path / "hf" and (ours.cfg.tie_embeddings, ours.cfg.qk_norm) == (tie, qk_norm)
    assert (ours.cfg.n_kv_heads, ours.cfg.ffn_width, ours.cfg.rope_base, ours.cfg.norm_eps) == (2, ffn_width, 500.0,
                                                                                         1e-4)
    assert_same_model(ours, tmp_path / "hf", theirs, tok, capsys)


@pytest.fixture(scope="module")
def hf_config_json(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("hf_cfg")
    hf_model(tie=True).config.save_pretrained(d)
    return json.loads((d / "config.json").read_text())


@pytest.fixture(scope="module")
def qwen3_config_json(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("qwen3_cfg")
    Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64).save_pretrained(d)
    return json.loads((d / "config.json").read_text())


def write_hf_dir(d: Path, config: dict, tokenizer_file: Path | None) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, d / "tokenizer.model")
    return d


@pytest.mark.parametrize("key, value, named", [
    ("attention_bias", True, "attention_bias=True"), ("mlp_bias", True, "mlp_bias=True"),
    ("hidden_act", "gelu", "hidden_act='gelu'"),
    ("rope_parameters", {"rope_type": "llama3", "factor": 2.0, "rope_theta": 500.0}, "rope_type='llama3'"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0, "beta_fast": 16},
     "rope_parameters.beta_fast=16 is not supported for rope_type='yarn'"),
    ("head_dim", 16, "head_dim=16"),
    ("vocab_size", VOCAB + 20, f"vocab_size={VOCAB + 20} but its tokenizer")])
def test_import_refuses_what_has_no_counterpart(tmp_path, tokenizer_file, hf_config_json, key, value, named):
    d = write_hf_dir(tmp_path / "hf", hf_config_json | {key: value}, tokenizer_file)
    with pytest.raises(CheckpointError, match=named) as error:
        load_model(d)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("key, value, named", [
    ("layer_types", ["full_attention", "sliding_attention"], "layer_types=['full_attention', 'sliding_attention'] is "
                                                            "not supported; this repo's local layers are"),
    ("layer_types", ["chunked_attention", "full_attention"], "layer_types[0]='chunked_attention' is not supported"),
    ("layer_types", ["full_attention"] * 3, "layer_types has 3 entries, num_hidden_layers is 2: it names each layer's "
                                            "attention, one entry per layer"),
    ("attention_bias", True, "attention_bias=True"),
    ("head_dim", None, "head_dim=128 is not supported")])  # None: absent, so Qwen3Config's own default, 128
def test_import_refuses_what_qwen3_has_and_this_repo_lacks(tmp_path, tokenizer_file, qwen3_config_json, key, value,
                                                           named):
    windowed = {"use_sliding_window": True, "sliding_window": 8} if key == "layer_types" else {}
    config = {k: v for k, v in (qwen3_config_json | windowed | {key: value}).items() if k != key or v is not None}
    with pytest.raises(CheckpointError, match=re.escape(named)) as error:
        load_model(write_hf_dir(tmp_path / "hf", config, tokenizer_file))
    assert "\n" not in str(error.value)


def test_import_refuses_non_llama_config_and_export_says_so(tmp_path, tokenizer_file, capsys):
    d = tmp_path / "gpt2"
    GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4).save_pretrained(d)
    shutil.copyfile(tokenizer_file, d / "tokenizer.model")
    with pytest.raises(CheckpointError, match="model_type='gpt2' is not supported; only model_type='llama'"):
        load_model(d)
    assert run_export("--ckpt", d, "--out", tmp_path / "out") == 2
    assert "model_type='gpt2'" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_import_needs_the_sentencepiece_model(tmp_path, hf_config_json):
    d = write_hf_dir(tmp_path / "hf", hf_config_json, tokenizer_file=None)
    with pytest.raises(CheckpointError, match="has no tokenizer.model"):
        load_model(d)


def test_a_native_checkpoint_is_generated_from_without_the_transformers_mapping(tmp_path, tokenizer_file):
    """generate.py reads a transformers directory too, yet on this repo's own checkpoint it never imports
    interop/hf.py or the families: a fresh process generates, then lists what it imported."""
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg()), tokenizer_file)
    script = ("import sys, generate; code = generate.main(['--ckpt', sys.argv[1], '--max-new-tokens', '2']); "
              "print(code, 'interop.hf' in sys.modules or 'interop.families' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ckpt")], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, check=True)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stderr


# --- DeepseekV3: multi-head latent attention -----------------------------------------------------

# Measured for the models below: 8.6e-6 to 2.04e-5 apart in float64, at largest logits 9.3 to 10.2 (LLaMA's: up to
# 1.09e-5): the latents' RMSNorms (kv_a_layernorm, q_a_layernorm) are rounded to float32 in transformers as its
# others are, two more a layer; 2^-18 of the largest logit is 1.8x the largest measured. Without the RoPE rows'
# reordering (interleaved_pairs) the logits move by 11.2.
MLA_FLOAT64_STEPS = 2 ** -18


def mla_cfg(q_rank: int | None):
    """llama_cfg's model with MLA: a latent of 16, a RoPE part of 4 (two pairs, so a mapping that rotates the
    wrong pairs fails), values of 6 dims beside keys of 8."""
    return llama_cfg(n_kv_heads=4, kv_rank=16, q_rank=q_rank, rope_head_dim=4, v_head_dim=6)


@pytest.mark.parametrize("q_rank", [None, 12])
def test_mla_exports_to_deepseek_v3_with_equal_logits_and_greedy_text_and_back(tmp_path, tokenizer_file, tok,
                                                                               capsys, q_rank):
    model = far_from_init(Transformer(mla_cfg(q_rank)))
    save_checkpoint(tmp_path / "ckpt", model, tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["kv_lora_rank"], config["q_lora_rank"], config["qk_rope_head_dim"], config["qk_nope_head_dim"],
            config["v_head_dim"], config["rope_interleave"], config["first_k_dense_replace"]) == (
        16, q_rank, 4, 8, 6, True, 2)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs) is DeepseekV3ForCausalLM
    assert all(type(layer.mlp).__name__ == "DeepseekV3MLP" for layer in theirs.model.layers)  # dense, no experts
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys, MLA_FLOAT64_STEPS)
    reloaded, _ = load_model(tmp_path / "hf")
    tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens), model(tokens))
    assert (reloaded.cfg.attention, reloaded.cfg.q_rank, reloaded.cfg.value_dim) == ("mla", q_rank, 6)


def hf_deepseek(rope_interleave: bool, first_k_dense_replace: int = 2, **settings) -> DeepseekV3ForCausalLM:
    return far_from_init(DeepseekV3ForCausalLM(DeepseekV3Config(**settings,
        vocab_size=VOCAB, hidden_size=32, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=first_k_dense_replace, max_position_embeddings=64, rms_norm_eps=1e-4,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rope_interleave=rope_interleave,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)))


@pytest.mark.parametrize("rope_interleave", [True, False])
def test_import_deepseek_v3_dir_with_equal_logits_and_greedy_text(tmp_path, tokenizer_file, tok, capsys,
                                                                  rope_interleave):
    """DeepSeek's interleaved RoPE pairs (its checkpoints') and transformers' half-split ones alike."""
    theirs = hf_deepseek(rope_interleave).eval()
    theirs.save_pretrained(tmp_path / "hf")
    shutil.copyfile(tokenizer_file, tmp_path / "hf" / "tokenizer.model")
    ours, _ = load_model(tmp_path / "hf")
    assert (ours.cfg.attention, ours.cfg.kv_rank, ours.cfg.q_rank, rope_dim(ours.cfg), ours.cfg.value_dim,
            ours.cfg.head_dim, ours.cfg.norm_eps) == ("mla", 16, 12, 4, 6, 8, 1e-4)
    assert_same_model(ours, tmp_path / "hf", theirs, tok, capsys, MLA_FLOAT64_STEPS)


# --- mixture of experts (model/moe.py): Mixtral, Qwen3-MoE, DeepseekV3 -------------------------------------

def moe_cfg(**settings):
    """llama_cfg's model with 4 experts of 12, 2 per token."""
    return llama_cfg(**dict(ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12) | settings)


# transformers' routers compute in float32 whatever the model's dtype (softmax(dtype=float), DeepseekV3's linear
# in float32), so each gate is rounded to float32 there and not here. Measured on these models in float64, as a
# fraction of the largest logit: Mixtral 1.27e-6 (1.35e-5 of 10.6), Qwen3-MoE 3.0e-7, DeepseekV3 7.5e-7 (export)
# and 9.4e-7 (import), all under 2^-19; the bound leaves 3x. A dropped or swapped expert moves logits by O(1).
MOE_FLOAT64_STEPS = 2 ** -18
MOE_FAMILIES = {  # the switches that make each family, and the class transformers builds for it
    "mixtral": (dict(), "MixtralForCausalLM"),
    "qwen3_moe": (dict(qk_norm="rmsnorm", dense_layers=1), "Qwen3MoeForCausalLM"),
    "deepseek_v3": (dict(n_kv_heads=4, kv_rank=16, rope_head_dim=4, router="sigmoid", n_shared_experts=1,
                         dense_layers=1, router_bias_rate=1e-3), "DeepseekV3ForCausalLM")}


# gpt-oss runs other float32 ops than ours: eager attention with the sink's column concatenated, and experts whose
# up projection carries the bias -1 that its (up + 1) takes back, rounding twice. Measured on these models (3 seeds,
# dense and top-2 of 4): 1.0e-6 to 1.9e-6 of the largest logit apart (9-16 float32 steps of 2^-23); the bound leaves
# 2x. In float64 they agree to float32's rounding of its RMSNorms, as LLaMA's do (5.2e-7 to 1.0e-6).
GPT_OSS_FLOAT32_STEPS = 2 ** -18
# a window of 8 over 64 tokens: the switches, the class transformers builds, and the window keys it reads back
WINDOWED = {
    "mistral": (dict(window=8), "MistralForCausalLM"),
    "ministral": (dict(window=8, window_pattern="alternate"), "MinistralForCausalLM"),
    "qwen3": (dict(window=8, window_pattern="alternate", qk_norm="rmsnorm"), "Qwen3ForCausalLM"),
    "mixtral": (dict(window=8, ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12), "MixtralForCausalLM"),
    "qwen3_moe": (dict(window=8, qk_norm="rmsnorm", ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12),
                  "Qwen3MoeForCausalLM"),
    # sink logits: gpt-oss, its dense SwiGLU one expert, or top-2 of 4
    "gpt_oss": (dict(window=8, window_pattern="alternate", sinks=True), "GptOssForCausalLM"),
    "gpt_oss_moe": (dict(window=8, window_pattern="alternate", sinks=True, ffn="moe", n_experts=4, experts_per_token=2,
                         expert_d_ff=12), "GptOssForCausalLM")}


@pytest.mark.parametrize("family", WINDOWED)
def test_a_windowed_model_exports_with_equal_logits_past_the_window_and_back(tmp_path, tokenizer_file, tok, capsys,
                                                                            family):
    """Every layer local (Mistral, Mixtral, Qwen3-MoE: sliding_window) or alternating (Ministral, Qwen3, gpt-oss
    with its sink logits: layer_types): the same logits over 64 tokens, 8 windows, and greedy text as transformers,
    and the directory loads back as the same model."""
    switches, class_name = WINDOWED[family]
    # seed 1: under seed 0 the dense gpt-oss model's greedy text reaches EOS after 2 tokens, too short to compare
    model = far_from_init(Transformer(llama_cfg(**switches)), seed=1)
    theirs = exported(model, tmp_path, tokenizer_file, class_name)
    assert theirs.config.sliding_window == 8
    if family in ("ministral", "qwen3", "gpt_oss", "gpt_oss_moe"):
        assert theirs.config.layer_types == ["sliding_attention", "full_attention"]
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys,
                      MOE_FLOAT64_STEPS if model.cfg.ffn == "moe" else 2 ** -19,
                      GPT_OSS_FLOAT32_STEPS if model.cfg.sinks else None)
    with torch.no_grad():  # the window matters here: the same model without it computes other logits
        full = Transformer(replace(model.cfg, window=None, window_pattern="all"))
        full.load_state_dict(model.state_dict())
        tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
        assert (full(tokens) - model(tokens)).abs().max() > 0.1
    reloaded, _ = load_model(tmp_path / "hf")
    with torch.no_grad():
        assert torch.equal(reloaded(tokens), model(tokens))
    assert (reloaded.cfg.window, reloaded.cfg.window_pattern) == (8, model.cfg.window_pattern)


@pytest.mark.parametrize("switches, message", [
    (dict(window=8, window_pattern="alternate", ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12),
     "model.window=8 with model.window_pattern=alternate has no {target} Mixtral equivalent"),
    (dict(window=8, window_pattern="2:1", qk_norm="rmsnorm", ffn="moe", n_experts=4, experts_per_token=2,
          expert_d_ff=12), "model.window=8 with model.window_pattern=2:1 has no {target} Qwen3-MoE equivalent: its "
                           "window is in every layer"),
])
def test_export_refuses_a_window_or_sinks_the_format_lacks(tmp_path, tokenizer_file, capsys, switches, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(**switches)), tokenizer_file)
    for fmt, target in (("transformers", "transformers"), ("gguf", "llama.cpp")):
        out = tmp_path / f"out.{fmt}"
        assert run_export("--ckpt", tmp_path / "ckpt", "--format", fmt, "--out", out) == 2
        assert one_error_line(capsys).startswith(f"error: {message.format(target=target)}")
        assert not out.exists()
    save_checkpoint(tmp_path / "windowed", Transformer(llama_cfg(window=8)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "windowed", "--format", "gguf", "--out", tmp_path / "w.gguf") == 2
    assert one_error_line(capsys).startswith("error: model.window=8 has no llama.cpp export here")
    save_checkpoint(tmp_path / "sinks", Transformer(llama_cfg(sinks=True)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "sinks", "--format", "gguf", "--out", tmp_path / "s.gguf") == 2
    assert one_error_line(capsys).startswith("error: model.sinks=true has no llama.cpp export here: llama.cpp's graph "
                                             "with sink logits, gpt-oss's, clamps its experts' SwiGLU at 7")
    assert not (tmp_path / "s.gguf").exists()


def test_sinks_without_a_window_export_as_gpt_oss_with_every_layer_full(tmp_path):
    """gpt-oss's own default alternates 128-token windows: a model with sinks and full attention writes every layer
    full_attention and a window none uses (the context), and reads back without one."""
    model = far_from_init(Transformer(llama_cfg(sinks=True, context_length=256)))
    config = hf_config(model.cfg)
    assert (config["layer_types"], config["sliding_window"]) == (["full_attention"] * 2, 256)
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (1, 1)
    save_file(hf_state_dict(model), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="eager").eval().double()
    tokens = torch.randint(VOCAB, (1, 256), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # 256 tokens: a window of 128 in any layer would move these
        ours, expected = copy.deepcopy(model).double()(tokens), theirs(tokens).logits
    assert (ours - expected).abs().max().item() <= 2 ** -19 * expected.abs().max().item()  # as assert_same_model's
    assert model_config_from_hf(config).window is None


@pytest.mark.parametrize("switches, named", [
    (dict(qk_norm="rmsnorm"), "no transformers gpt-oss equivalent for model.qk_norm=rmsnorm"),
    (dict(ffn="moe", n_experts=4, experts_per_token=2, router="sigmoid"), "model.router=sigmoid"),
    (dict(ffn="moe", n_experts=4, experts_per_token=2, n_shared_experts=1), "model.n_shared_experts=1"),
    (dict(ffn="moe", n_experts=4, experts_per_token=2, dense_layers=1), "model.dense_layers=1"),
    (dict(ffn="moe", n_experts=4, experts_per_token=1), "model.experts_per_token=1 has no transformers gpt-oss"),
])
def test_sinks_with_what_gpt_oss_lacks_are_refused_by_name(tmp_path, tokenizer_file, capsys, switches, named):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(sinks=True, **switches)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 2
    assert named in one_error_line(capsys)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("left_out, named", [
    ("swiglu_alpha", "swiglu_alpha=1.702 is not supported"),  # GptOssConfig's defaults, not ours
    ("rope_parameters", "rope_parameters.truncate=False is not supported for rope_type='yarn'"),
    ("head_dim", "head_dim=64 is not supported")])
def test_a_gpt_oss_config_json_is_read_with_gpt_osss_own_defaults(tmp_path, tokenizer_file, left_out, named):
    """A key the config.json leaves out is what GptOssConfig reads for it, OpenAI's setting, not this repo's: each
    refused by name where it is not this repo's."""
    model = Transformer(llama_cfg(sinks=True, window=8, window_pattern="alternate"))
    config = {k: v for k, v in hf_config(model.cfg).items() if k not in (left_out, "rope_theta")}
    d = write_hf_dir(tmp_path / "hf", config, tokenizer_file)
    save_file(hf_state_dict(model), d / "model.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(named)) as error:
        load_model(d)
    assert "\n" not in str(error.value)


def test_import_refuses_one_expert_a_token(tmp_path, tokenizer_file):
    """A softmax router's single gate is renormalised to 1 in transformers, where this repo's top-1 gate is p."""
    model = Transformer(llama_cfg(ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12))
    d = write_hf_dir(tmp_path / "hf", hf_config(model.cfg) | {"num_experts_per_tok": 1}, tokenizer_file)
    with pytest.raises(CheckpointError, match=re.escape("num_experts_per_tok=1 is not supported for Mixtral")):
        load_model(d)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_exports_to_its_family_with_equal_logits_and_greedy_text_and_back(tmp_path, tokenizer_file, tok,
                                                                             capsys, family):
    """The softmax router to Mixtral (LLaMA's attention) or Qwen3-MoE (QK-norm; its first block dense), the sigmoid
    router with a shared expert and its balancing bias to DeepseekV3 (MLA): the same logits and greedy text, and
    the exported directory loads back as the same model."""
    switches, class_name = MOE_FAMILIES[family]
    model = far_from_init(Transformer(moe_cfg(**switches)))
    with torch.no_grad():  # a bias that moves choices: DeepseekV3's e_score_correction_bias must carry it
        for moe in model.moe_layers().values():
            moe.bias.copy_(torch.tensor([0.4, -0.3, 0.2, -0.1]) if family == "deepseek_v3" else torch.zeros(4))
    theirs = exported(model, tmp_path, tokenizer_file, class_name)
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys, MOE_FLOAT64_STEPS)
    reloaded, _ = load_model(tmp_path / "hf")
    tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens), model(tokens))
    assert (reloaded.cfg.ffn, reloaded.cfg.router, reloaded.cfg.dense_layers, reloaded.cfg.n_shared_experts) == (
        "moe", model.cfg.router, model.cfg.dense_layers, model.cfg.n_shared_experts)


@pytest.mark.parametrize("switches, message", [
    (dict(router="sigmoid"), "no transformers equivalent for model.router=sigmoid with model.attention=gqa: the "
                             "sigmoid router's family, DeepseekV3, has multi-head latent attention"),
    (dict(n_shared_experts=1), "no transformers Mixtral equivalent for model.n_shared_experts=1"),
    (dict(router_bias_rate=1e-3), "no transformers Mixtral equivalent for model.router_bias_rate=0.001"),
    (dict(dense_layers=1), "no transformers Mixtral equivalent for model.dense_layers=1"),
    (dict(experts_per_token=1), "model.experts_per_token=1 has no transformers Mixtral equivalent"),
    (dict(qk_norm="rmsnorm", router_bias_rate=1e-3),
     "no transformers Qwen3-MoE equivalent for model.router_bias_rate=0.001"),
    (dict(n_kv_heads=4, kv_rank=16, rope_head_dim=4), "no transformers DeepseekV3 equivalent for model.router=softmax"),
])
def test_moe_export_refuses_a_router_or_expert_its_family_lacks(tmp_path, tokenizer_file, capsys, switches, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(moe_cfg(**switches)), tokenizer_file)
    for fmt in ("transformers", "gguf"):
        out = tmp_path / f"out.{fmt}"
        assert run_export("--ckpt", tmp_path / "ckpt", "--format", fmt, "--out", out) == 2
        assert one_error_line(capsys).startswith(f"error: {message}".replace("transformers", {
            "transformers": "transformers", "gguf": "llama.cpp"}[fmt]))
        assert not out.exists()


@pytest.mark.parametrize("changes, named", [
    ({}, "attention_bias=True is not supported; this repo's gpt-oss has attention_bias=False"),
    ({"attention_bias": False}, "swiglu_alpha=1.702 is not supported; this repo's gpt-oss has swiglu_alpha=1.0"),
    ({"attention_bias": False, "swiglu_alpha": 1.0, "swiglu_limit": torch.finfo(torch.float32).max},
     "model.layers.0.mlp.experts.gate_up_proj_bias is not supported: this repo's experts and router have no biases")])
def test_import_refuses_gpt_oss_as_openai_builds_it(tmp_path, tokenizer_file, changes, named):
    """gpt-oss under GptOssConfig's own defaults (biases in its attention, its SwiGLU's alpha 1.702 and clamp at 7)
    has no counterpart here; with this repo's settings but its own expert biases (0 on up, where ours are -1), none
    either: each refused in one line."""
    config = GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                          num_experts_per_tok=2, max_position_embeddings=64, sliding_window=8,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **changes)
    GptOssForCausalLM(config).save_pretrained(tmp_path / "hf")
    shutil.copyfile(tokenizer_file, tmp_path / "hf" / "tokenizer.model")
    with pytest.raises(CheckpointError, match=re.escape(named)) as error:
        load_model(tmp_path / "hf")
    assert "\n" not in str(error.value)


def test_import_deepseek_v3_with_moe_layers(tmp_path, tokenizer_file, tok, capsys):
    """DeepseekV3's sigmoid router with its e_score_correction_bias, its shared experts and first dense block."""
    theirs = hf_deepseek(rope_interleave=True, first_k_dense_replace=1, routed_scaling_factor=1.0).eval()
    theirs.set_experts_implementation("eager")  # its grouped_mm, the CPU default, has no float64 kernel
    with torch.no_grad():
        theirs.model.layers[1].mlp.gate.e_score_correction_bias.copy_(torch.tensor([0.4, -0.3, 0.2, -0.1]))
    theirs.save_pretrained(tmp_path / "hf")
    shutil.copyfile(tokenizer_file, tmp_path / "hf" / "tokenizer.model")
    ours, _ = load_model(tmp_path / "hf")
    assert (ours.cfg.ffn, ours.cfg.router, ours.cfg.n_experts, ours.cfg.dense_layers, ours.cfg.n_shared_experts) == (
        "moe", "sigmoid", 4, 1, 1)
    assert ours.blocks[1].ffn.bias.tolist() == pytest.approx([0.4, -0.3, 0.2, -0.1])
    assert_same_model(ours, tmp_path / "hf", theirs, tok, capsys, MOE_FLOAT64_STEPS)


def test_import_refuses_deepseek_v3s_rescaled_gates(tmp_path, tokenizer_file):
    hf_deepseek(rope_interleave=True, first_k_dense_replace=1).save_pretrained(tmp_path / "hf")
    shutil.copyfile(tokenizer_file, tmp_path / "hf" / "tokenizer.model")
    with pytest.raises(CheckpointError, match=re.escape("routed_scaling_factor=2.5 is not supported")) as error:
        load_model(tmp_path / "hf")
    assert "\n" not in str(error.value)

# --- Qwen3-Next: moe_tiny's shared expert (interop/families/qwen3_next.py) ------------------------------------

def moe_tiny_cfg(**settings):
    """moe_cfg's experts with moe_tiny's other parts: QK-norm, the softmax router and one shared expert."""
    return moe_cfg(**dict(qk_norm="rmsnorm", n_shared_experts=1) | settings)


def norm_gains(model: Transformer) -> set[str]:
    return {name for name in model.state_dict() if name.endswith("norm.weight")}


# The zero gates (sigmoid(0) = 1/2) and the doubled o_proj and shared down_proj cancel exactly (powers of two); a
# gain g is stored as g - 1, which float32 holds exactly for g >= 1/2 and to half a step of its binade below (2^-24
# for |g - 1| < 2): a relative error under float32's own rounding of each RMSNorm's output in transformers. So the
# float64 bound is the other MoE families' (MOE_FLOAT64_STEPS, 2^-18 = 3.8e-6). Measured on these models (no dense
# block / a dense first one; 8 and 7 of 192 gains below 1/2): float32 2.4e-6 / 9.5e-7 apart at largest logits 10.1 /
# 9.9, under assert_same_model's 1e-5; float64 6.9e-7 / 9.0e-7 of the largest logit.
@pytest.mark.parametrize("dense_layers", [0, 1])
def test_moe_tiny_exports_to_qwen3_next_with_equal_logits_and_greedy_text_and_back(tmp_path, tokenizer_file, tok,
                                                                                  capsys, dense_layers):
    """QK-norm, the softmax router and a shared expert: Qwen3-Next with every layer attention, its output gate and
    its shared expert's gate zero (1/2, undone by doubled down projections), its (1 + w) norms storing g - 1."""
    model = far_from_init(Transformer(moe_tiny_cfg(dense_layers=dense_layers)))
    theirs = exported(model, tmp_path, tokenizer_file, "Qwen3NextForCausalLM")
    config = theirs.config
    assert (config.layer_types, config.rope_parameters["partial_rotary_factor"], config.mlp_only_layers,
            config.shared_expert_intermediate_size) == (["full_attention"] * 2, 1.0, list(range(dense_layers)), 12)
    written, state = load_file(tmp_path / "hf" / "model.safetensors"), model.state_dict()
    last = "model.layers.1."
    assert not written[last + "mlp.shared_expert_gate.weight"].any()
    assert not written[last + "self_attn.q_proj.weight"].view(4, 2, 8, 32)[:, 1].any()  # each head's gate rows
    assert torch.equal(written[last + "self_attn.o_proj.weight"], 2 * state["blocks.1.attn.out.weight"])
    assert torch.equal(written[last + "mlp.shared_expert.down_proj.weight"],
                       2 * state["blocks.1.ffn.shared.w_out.weight"])
    assert torch.equal(written[last + "self_attn.q_norm.weight"], state["blocks.1.attn.qk_norm.q_norm.weight"] - 1)
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys, MOE_FLOAT64_STEPS)

    reloaded, _ = load_model(tmp_path / "hf")
    assert (reloaded.cfg.qk_norm, reloaded.cfg.router, reloaded.cfg.n_shared_experts, reloaded.cfg.dense_layers) == (
        "rmsnorm", "softmax", 1, dense_layers)
    back = reloaded.state_dict()
    for name in state.keys() - norm_gains(model):
        assert torch.equal(back[name], state[name]), name
    gains = torch.cat([state[name] for name in sorted(norm_gains(model))])
    returned = torch.cat([back[name] for name in sorted(norm_gains(model))])
    above = gains >= 0.5
    assert torch.equal(returned[above], gains[above]) and (~above).sum() > 0 and (gains - 1).abs().max() < 2
    assert (returned - gains).abs().max() <= 2 ** -24
    tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (reloaded(tokens) - model(tokens)).abs().max() <= 1e-5  # assert_same_model's float32 bound


def test_moe_tiny_preset_exports_to_qwen3_next_and_refuses_gguf(tmp_path, tokenizer_file, capsys):
    """The preset itself is Qwen3-Next's; llama.cpp's qwen3next graph is not written, with the reason in one line."""
    config = hf_config(model_config(compose_config(["model=moe_tiny"])))
    assert [config[key] for key in ("model_type", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                    "shared_expert_intermediate_size", "mlp_only_layers")] == [
        "qwen3_next", 15, 3, 88, 88, []]
    save_checkpoint(tmp_path / "ckpt", Transformer(moe_tiny_cfg()), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "out.gguf") == 2
    assert one_error_line(capsys).startswith(
        "error: model.n_shared_experts with model.qk_norm=rmsnorm has no llama.cpp export here: its family, "
        "Qwen3-Next, is llama.cpp's qwen3next graph, whose loader makes three layers in four Gated DeltaNet")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("switches, message", [
    (dict(window=8), "model.window=8 has no transformers Qwen3-Next equivalent: its attention layers attend to every "
                     "earlier position"),
    (dict(router_bias_rate=1e-3), "no transformers Qwen3-Next equivalent for model.router_bias_rate=0.001"),
    (dict(experts_per_token=1), "model.experts_per_token=1 has no transformers Qwen3-Next equivalent")])
def test_qwen3_next_export_refuses_what_it_lacks(tmp_path, tokenizer_file, capsys, switches, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(moe_tiny_cfg(**switches)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 2
    assert one_error_line(capsys).startswith(f"error: {message}")
    assert not (tmp_path / "hf").exists()


def gate_rows_of_head_0(state: dict[str, torch.Tensor]) -> None:
    state["model.layers.0.self_attn.q_proj.weight"][8:16] = 0.1


def shared_gate(state: dict[str, torch.Tensor]) -> None:
    state["model.layers.1.mlp.shared_expert_gate.weight"][0, 3] = 0.1


@pytest.mark.parametrize("config_changes, weights_change, named", [
    # None: Qwen3-Next's own, three layers in four linear: both of these two layers, and no attention layer
    ({"layer_types": None}, None, "layer_types=['linear_attention', 'linear_attention'] is not supported"),
    ({"shared_expert_intermediate_size": 18}, None, "shared_expert_intermediate_size=18 is not supported"),
    # a hybrid's layers listed for 4 layers of the 2: the length named, not the pattern
    ({"layer_types": 3 * ["linear_attention"] + ["full_attention"]}, None, "layer_types has 4 entries, "
                                                                          "num_hidden_layers is 2"),
    ({}, gate_rows_of_head_0, "model.layers.0.self_attn.q_proj.weight's output gate (each head's last head_dim rows) "
                              "is not zero: this repo reads an all-attention Qwen3-Next's attention as gate-less"),
    ({}, shared_gate, "model.layers.1.mlp.shared_expert_gate.weight is not zero: this repo's shared experts are not "
                      "gated")])
def test_import_refuses_what_qwen3_next_has_and_this_repo_lacks(tmp_path, tokenizer_file, config_changes,
                                                                weights_change, named):
    """Qwen3-Next's default layers (three in four Gated DeltaNet) where that leaves no attention layer, a shared
    expert of another width, and gates that are not zero: each refused in one line."""
    model = Transformer(moe_tiny_cfg(dense_layers=1))
    config = hf_config(model.cfg) | config_changes
    d = write_hf_dir(tmp_path / "hf", {k: v for k, v in config.items() if v is not None}, tokenizer_file)
    state = hf_state_dict(model)
    if weights_change is not None:
        weights_change(state)
    save_file(state, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=re.escape(named)) as error:
        load_model(d)
    assert "\n" not in str(error.value)

# --- the registry (interop/families/) ---------------------------------------------------------

@pytest.mark.parametrize("switches, model_type", [
    (dict(), "llama"), (dict(qk_norm="rmsnorm"), "qwen3"),
    (dict(ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12, qk_norm="rmsnorm", n_shared_experts=1),
     "qwen3_next"),
    (dict(n_layers=4, qk_norm="rmsnorm", linear_pattern="3:1", attention_gate=True), "qwen3_5_text"),
    (dict(n_layers=4, qk_norm="rmsnorm", linear_pattern="3:1", attention_gate=True, ffn="moe", n_experts=4,
          experts_per_token=2, expert_d_ff=12, n_shared_experts=1), "qwen3_next"),
    (dict(kv_rank=16, rope_head_dim=4, n_kv_heads=4), "deepseek_v3"),
    *((dict(ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12) | switches, family)
      for family, (switches, _) in MOE_FAMILIES.items()),
    *((switches, family.removesuffix("_moe") if family == "gpt_oss_moe" else family)
      for family, (switches, _) in WINDOWED.items())])
def test_the_registry_gives_a_model_and_its_config_json_one_family(switches, model_type):
    """family_of asks the most specific family first: each model goes to its own, and its config.json comes back
    to the same one."""
    cfg = llama_cfg(**switches)
    assert family_of(cfg).model_type == model_type == family_for(hf_config(cfg)).model_type
    assert len({family.model_type for family in FAMILIES}) == len(FAMILIES)


def test_a_qwen2_config_json_is_read_for_its_windows_and_refused_by_import():
    """Qwen2 (no family this repo exports) reads as transformers does: its window only with use_sliding_window, from
    max_window_layers on, and hidden / heads as its head dim; an import names why it is refused."""
    config = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "sliding_window": 16}
    assert hf_layer_types(config, 3) == (None, 3 * ["full_attention"]) and hf_head_dim(config) == 16
    windowed = config | {"use_sliding_window": True, "max_window_layers": 1}
    assert hf_layer_types(windowed, 3) == (16, ["full_attention"] + 2 * ["sliding_attention"])
    with pytest.raises(InteropError, match="model_type='qwen2' is not supported: its q, k and v projections have "
                                           "biases"):
        model_config_from_hf(windowed)


# --- Qwen3.5: the 3:1 hybrid of Gated DeltaNet and gated attention (interop/families/qwen3_5.py) ----------------

def hybrid_cfg(**settings):
    """Three Gated DeltaNet layers (2 key and 4 value heads of 8 dims) to one attention layer with Qwen's output gate,
    QK-norm and RoPE on a quarter of each head."""
    return llama_cfg(**dict(n_layers=4, qk_norm="rmsnorm", linear_pattern="3:1", attention_gate=True,
                            rotary_fraction=0.25, linear_key_heads=2, linear_value_heads=4, linear_head_dim=8,
                            linear_chunk=8) | settings)


# transformers' Qwen3.5 rounds to float32 inside a float64 model: its RMSNorms (the gated one too), the gate's log decay
# (A_log.float(), a.float()) and its delta-rule kernels cast to float32 whatever the model's dtype. Measured on this
# model (max logit 9.5): 8.1e-5 apart in float64, 7.9e-5 in float32 (8.5e-6 of the largest logit, 2^-16.8); with
# those casts taken out of transformers (its norms' and kernels' code run in float64, Tensor.float made the identity:
# an experiment, not this test) 3.6e-15 apart, so the mapping itself is exact. Bound: 2^-15 of the largest logit
# (3.1e-5 of it) in both dtypes; a dropped or swapped weight moves logits of std > 1 by O(1).
def hybrid_far_from_init(cfg) -> Transformer:
    """far_from_init's model with gates that fade slowly: the state carries the prompt's start to its end."""
    model = far_from_init(Transformer(cfg))
    with torch.no_grad():
        for block in model.blocks[:3]:
            block.attn.A_log.copy_(torch.linspace(0.02, 0.5, 4).log())
    return model


def reloaded_hybrid(hf_dir: Path, model: Transformer) -> Transformer:
    """The export in hf_dir loaded back: every weight equal but the (1 + w) gains below 1/2, within 2^-24 (their
    g - 1 rounded), and so its logits within the test's bound of ours."""
    reloaded, _ = load_model(hf_dir)
    state, back = model.state_dict(), reloaded.state_dict()
    gains = {name for name in state if name.endswith("norm.weight") and ".attn.norm." not in name}
    assert all(torch.equal(back[name], state[name]) for name in state.keys() - gains)
    assert max((back[name] - state[name]).abs().max() for name in gains) <= 2 ** -24
    tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # the same ops in the same order; only gains below 1/2 differ, by at most 2^-24
        expected = model(tokens)
        assert (reloaded(tokens) - expected).abs().max() <= 2 ** -15 * expected.abs().max()
    return reloaded


def test_the_hybrid_exports_to_qwen3_5_with_equal_logits_and_greedy_text_and_back(tmp_path, tokenizer_file, tok,
                                                                                 capsys):
    model = hybrid_far_from_init(hybrid_cfg())
    theirs = exported(model, tmp_path, tokenizer_file, "Qwen3_5ForCausalLM")
    assert (theirs.config.layer_types, theirs.config.rope_parameters["partial_rotary_factor"]) == (
        3 * ["linear_attention"] + ["full_attention"], 0.25)
    written, state = load_file(tmp_path / "hf" / "model.safetensors"), model.state_dict()
    assert torch.equal(written["model.layers.0.linear_attn.in_proj_z.weight"], state["blocks.0.attn.gate.weight"])
    assert torch.equal(written["model.layers.3.self_attn.q_proj.weight"].view(4, 2, 8, 32)[:, 1],
                       state["blocks.3.attn.gate.weight"].view(4, 8, 32))  # each head's rows [W_q,h; W_g,h]
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys, 2 ** -15, 2 ** -15)

    reloaded = reloaded_hybrid(tmp_path / "hf", model)
    assert (reloaded.cfg.linear_pattern, reloaded.cfg.n_linear_value_heads, reloaded.cfg.rotary_fraction,
            reloaded.cfg.attention_gate) == ("3:1", 4, 0.25, True)


@pytest.mark.parametrize("settings, message", [
    (dict(attention_gate=False), "no transformers Qwen3.5 equivalent for model.attention_gate=False"),
    # all linear: named by its pattern, not by the attention settings it leaves at their defaults as it must
    (dict(linear_pattern="all", position="none", qk_norm="none", attention_gate=False, rotary_fraction=1.0),
     "model.linear_pattern=all has no transformers equivalent here: the families with linear layers, Qwen3.5 and "
     "Qwen3-Next, have gated, QK-normed, rotated attention layers (model.attention_gate=true, qk_norm=rmsnorm, "
     "position=rope), which a model with no attention layer refuses; a hybrid such as model.linear_pattern=3:1 "
     "exports")])
def test_the_qwen3_5_export_refuses_what_it_lacks(tmp_path, tokenizer_file, capsys, settings, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(hybrid_cfg(**settings)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 2
    assert message in one_error_line(capsys) and not (tmp_path / "hf").exists()


def test_a_model_with_linear_layers_is_refused_by_every_other_family():
    """LLaMA's switches hold no linear layer, gate or partial RoPE: only Qwen3.5 (and Qwen3-Next, with experts)
    claims a model with them."""
    assert family_of(hybrid_cfg()).model_type == "qwen3_5_text"
    for switches in (dict(attention_gate=True), dict(rotary_fraction=0.5)):
        with pytest.raises(InteropError, match=f"model.{next(iter(switches))}="):
            hf_config(llama_cfg(**switches))


# --- Qwen3-Next as Qwen ships it: the 3:1 hybrid with experts (interop/families/qwen3_next.py) ----------------------

def hybrid_moe_cfg(**settings):
    """hybrid_cfg's layers (2 key heads, each serving 2 of the 4 value heads) with moe_tiny's experts: 4 of 12, 2 a
    token, one shared, the first block dense."""
    return hybrid_cfg(**dict(ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=12, n_shared_experts=1,
                             dense_layers=1) | settings)


# transformers' Qwen3-Next rounds to float32 inside a float64 model where its Qwen3.5 does (the norms, the gate's log
# decay, the delta-rule kernels) and in its router (MOE_FLOAT64_STEPS). Measured on this model (max logit 10.0): 9.0e-5
# apart in float32, 6.7e-5 in float64 (6.7e-6 of the largest logit), under the Qwen3.5 test's bound of 2^-15 of it
# (3.1e-5 of it). With its module's float32 made float64 (an experiment, not this test): 4.6e-8, as the Qwen3.5
# model under the same experiment (2.6e-8, which is exact with every cast taken out), so what is left is the casts,
# not the mapping; a weight put in another key head's group moves logits of std > 1 by O(1).
def test_the_hybrid_with_experts_exports_to_qwen3_next_with_equal_logits_and_greedy_text_and_back(
        tmp_path, tokenizer_file, tok, capsys):
    model = hybrid_far_from_init(hybrid_moe_cfg())
    theirs = exported(model, tmp_path, tokenizer_file, "Qwen3NextForCausalLM")
    config = theirs.config
    assert (config.layer_types, config.rope_parameters["partial_rotary_factor"], config.mlp_only_layers,
            config.linear_num_value_heads) == (3 * ["linear_attention"] + ["full_attention"], 0.25, [0], 4)
    written, state = load_file(tmp_path / "hf" / "model.safetensors"), model.state_dict()
    # key head 1's group in in_proj_qkvz: its q (8 rows), its k (8), value heads 2 and 3 (16), their z (16)
    qkv, group = state["blocks.1.attn.qkv.weight"], written["model.layers.1.linear_attn.in_proj_qkvz.weight"][48:]
    assert torch.equal(group, torch.cat([qkv[8:16], qkv[24:32], qkv[48:64], state["blocks.1.attn.gate.weight"][16:]]))
    b, a = state["blocks.1.attn.beta_proj.weight"], state["blocks.1.attn.decay_proj.weight"]
    # key head 1's group in in_proj_ba: b_2, b_3, then a_2, a_3
    assert torch.equal(written["model.layers.1.linear_attn.in_proj_ba.weight"][4:], torch.cat([b[2:], a[2:]]))
    assert torch.equal(written["model.layers.3.self_attn.q_proj.weight"].view(4, 2, 8, 32)[:, 1],
                       state["blocks.3.attn.gate.weight"].view(4, 8, 32))  # the gate itself, o_proj as it is
    assert torch.equal(written["model.layers.3.self_attn.o_proj.weight"], state["blocks.3.attn.out.weight"])
    assert_same_model(model, tmp_path / "ckpt", theirs, tok, capsys, 2 ** -15, 2 ** -15)

    reloaded = reloaded_hybrid(tmp_path / "hf", model)
    assert (reloaded.cfg.linear_pattern, reloaded.cfg.attention_gate, reloaded.cfg.rotary_fraction,
            reloaded.cfg.n_shared_experts, reloaded.cfg.dense_layers) == ("3:1", True, 0.25, 1, 1)


@pytest.mark.parametrize("cfg, message", [
    (hybrid_moe_cfg(n_shared_experts=0), "model.n_shared_experts=0 has no transformers Qwen3-Next equivalent: its "
                                         "sparse blocks always have a shared expert"),
    (hybrid_moe_cfg(attention_gate=False), "model.attention_gate=False with model.linear_pattern=3:1 has no "
                                           "transformers Qwen3-Next equivalent here"),
    (moe_tiny_cfg(attention_gate=True), "model.attention_gate=True with model.linear_pattern=None has no "
                                        "transformers Qwen3-Next equivalent here"),
    (hybrid_moe_cfg(linear_pattern="all", position="none", qk_norm="none", attention_gate=False, rotary_fraction=1.0),
     "model.linear_pattern=all has no transformers equivalent here: the families with linear layers")])
def test_the_qwen3_next_export_refuses_a_gate_or_shared_expert_its_import_would_read_otherwise(
        tmp_path, tokenizer_file, capsys, cfg, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(cfg), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 2
    assert one_error_line(capsys).startswith(f"error: {message}") and not (tmp_path / "hf").exists()
