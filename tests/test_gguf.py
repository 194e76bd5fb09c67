"""GGUF export (export.py --format gguf), read back by independent readers: the gguf package's reader (metadata,
tensors, tokenizer), transformers (logits) and llama.cpp itself through llama-cpp-python (logits, greedy text,
tokenization) where that is installed; llama.cpp's llama architecture, its qwen3 one for QK-norm and its deepseek2
one for multi-head latent attention; and the refusals, with nothing written."""
import errno
import itertools
from pathlib import Path

import gguf
import numpy as np
import pytest
import sentencepiece as spm
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from transformers import AutoConfig, AutoModelForCausalLM

from data.tokenizer import TRAINER_SETTINGS
from data_helpers import write_corpus
from interop import InteropError
from interop.gguf import write_gguf
from interop_helpers import PROMPT, TEXTS, VOCAB, corpus, greedy_ids, llama_cfg, one_error_line, run_export
from model.transformer import Transformer
from storage.checkpoint import save_checkpoint
from weights import far_from_init

try:
    import llama_cpp
except ImportError:
    llama_cpp = None
# llama-cpp-python compiles llama.cpp from source as it installs, longer than CI's test budget allows
# (docs/interop.md), so CI runs without it and pytest -rs prints this reason in the summary.
needs_llama_cpp = pytest.mark.skipif(
    llama_cpp is None, reason="llama-cpp-python is not installed: `pip install llama-cpp-python` (it compiles "
                              "llama.cpp, minutes) runs llama.cpp's greedy text and tokenization against ours")


# an MLA of 4 heads: a latent of 16, a query latent of 12, a RoPE part of 4 (two pairs), values of 6 dims beside keys
# of 8; norm_eps 1e-6, the latents' own, since llama.cpp gives every RMSNorm the one eps
MLA = dict(n_kv_heads=4, kv_rank=16, q_rank=12, rope_head_dim=4, v_head_dim=6, norm_eps=1e-6)
# ffn=moe: 4 experts of 16, 2 per token, as each of llama.cpp's MoE graphs takes it: Mixtral's (its llama graph,
# every block sparse), Qwen3-MoE's (qwen3moe, with QK-norm) and DeepSeek-V3's (deepseek2: MLA, the sigmoid router
# with its bias, a shared expert, the first block dense)
EXPERTS = dict(ffn="moe", n_experts=4, experts_per_token=2, expert_d_ff=16)
MOE = {"mixtral": EXPERTS, "qwen3_moe": EXPERTS | dict(qk_norm="rmsnorm"),
       "deepseek_v3": EXPERTS | MLA | dict(router="sigmoid", n_shared_experts=1, dense_layers=1)}
ROUTER_BIAS = [0.4, -0.3, 0.2, -0.1]  # the sigmoid router's, enough to change some choices
# Qwen3.5's 3:1 hybrid (llama.cpp's qwen35): three Gated DeltaNet layers of 2 key and 6 value heads of 8 dims (an
# order of the value heads that is not its own inverse), then attention with its output gate, QK-norm and RoPE on
# three quarters of each head (3 pairs: each of llama.cpp's three RoPE sections gets one); norm_eps 1e-6, the L2
# norms' own, since llama.cpp gives them the RMSNorms' eps
HYBRID = dict(n_layers=4, qk_norm="rmsnorm", linear_pattern="3:1", attention_gate=True, rotary_fraction=0.75,
              linear_key_heads=2, linear_value_heads=6, linear_head_dim=8, linear_chunk=8, norm_eps=1e-6)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tokenizer_file):
    """export(tie, dtype, qk_norm, mla) -> (our model, the GGUF file): one checkpoint per tie, QK-norm and attention
    setting, one export per dtype. Far from init: the q/k norm gains too, so a mapping that drops or swaps them
    fails."""
    root, made = tmp_path_factory.mktemp("gguf"), {}

    def export(tie: bool, dtype: str = "f32", qk_norm: str = "none", mla: bool = False,
               moe: str | None = None, hybrid: bool = False) -> tuple[Transformer, Path]:
        key = tie, qk_norm, mla, moe, hybrid
        d = root / f"tie_{tie}-qk_norm_{qk_norm}-mla_{mla}-moe_{moe}-hybrid_{hybrid}"
        if key not in made:
            cfg = llama_cfg(**dict(tie_embeddings=tie, qk_norm=qk_norm) | (MLA if mla else {}) | MOE.get(moe, {}) |
                            (HYBRID if hybrid else {}))
            model = made[key] = far_from_init(Transformer(cfg))
            with torch.no_grad():
                for layer in model.moe_layers().values():
                    layer.bias.copy_(torch.tensor(ROUTER_BIAS if cfg.router == "sigmoid" else [0.0] * 4))
                for block in model.blocks[:3] if hybrid else []:  # gates that fade slowly: the state carries far
                    block.attn.A_log.copy_(torch.linspace(0.02, 0.5, 6).log())
            save_checkpoint(d / "ckpt", model, tokenizer_file)
        out = d / f"model-{dtype}.gguf"
        if not out.exists():
            assert run_export("--ckpt", d / "ckpt", "--format", "gguf", "--dtype", dtype, "--out", out) == 0
        return made[key], out
    return export


def metadata(path: Path, prefix: str) -> dict:
    return {key: field.contents() for key, field in GGUFReader(path).fields.items() if key.startswith(prefix)}


def tensors(path: Path) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


@pytest.mark.parametrize("qk_norm, arch", [("none", "llama"), ("rmsnorm", "qwen3")])
def test_metadata_and_tensor_names_round_trip_through_the_gguf_reader(exported, qk_norm, arch):
    model, path = exported(tie=False, qk_norm=qk_norm)
    assert metadata(path, "general.") == {"general.architecture": arch, "general.name": "nanollama",
                                          "general.file_type": 0, "general.quantization_version": 2}
    # the same keys under the architecture's prefix; float32 in the file: 500 is exact, 1e-4 is its nearest float32
    assert metadata(path, f"{arch}.") == {f"{arch}.{key}": value for key, value in {
        "vocab_size": VOCAB, "context_length": 64, "embedding_length": 32, "block_count": 2,
        "feed_forward_length": 96, "attention.head_count": 4, "attention.head_count_kv": 2,
        "rope.dimension_count": 8, "rope.freq_base": 500.0,
        "attention.layer_norm_rms_epsilon": float(np.float32(1e-4))}.items()}
    layer = {"attn_norm": [32], "attn_q": [32, 32], "attn_k": [16, 32], "attn_v": [16, 32], "attn_output": [32, 32],
             "ffn_norm": [32], "ffn_gate": [96, 32], "ffn_up": [96, 32], "ffn_down": [32, 96]}
    if qk_norm == "rmsnorm":
        layer |= {"attn_q_norm": [8], "attn_k_norm": [8]}  # one gain per head dim, shared by the heads
    expected = {"token_embd.weight": [VOCAB, 32], "output_norm.weight": [32], "output.weight": [VOCAB, 32]}
    expected |= {f"blk.{i}.{name}.weight": shape for i in range(2) for name, shape in layer.items()}
    found = tensors(path)
    # GGUF lists a tensor's dims innermost first: torch's [out, in] is [in, out] in the file
    assert {name: t.shape.tolist()[::-1] for name, t in found.items()} == expected
    assert {t.tensor_type for t in found.values()} == {Q.F32}
    if qk_norm == "rmsnorm":
        # llama.cpp's qwen3 graph rotates the pairs (i, i + D/2), as ours does: q and k rows stay in our order
        attn = model.blocks[1].attn
        q, k, _ = attn.qkv.weight.detach().split([32, 16, 16])
        for name, ours in {"attn_q": q, "attn_k": k, "attn_q_norm": attn.qk_norm.q_norm.weight,
                           "attn_k_norm": attn.qk_norm.k_norm.weight}.items():
            assert np.array_equal(found[f"blk.1.{name}.weight"].data, ours.detach().numpy()), name
    _, tied = exported(tie=True, qk_norm=qk_norm)
    assert set(tensors(tied)) == set(expected) - {"output.weight"}  # llama.cpp reuses token_embd


def test_mla_round_trips_as_deepseek2_with_the_latent_as_one_kv_head(exported):
    """llama.cpp's deepseek2 runs MLA as multi-query attention against the latent: one K/V head of d_c + d_R keys
    and d_c values, a head's own sizes as *_mla, kv_b_proj as each head's W_uk transposed and W_uv."""
    model, path = exported(tie=False, mla=True)
    assert metadata(path, "general.architecture") == {"general.architecture": "deepseek2"}
    assert metadata(path, "deepseek2.") == {f"deepseek2.{key}": value for key, value in {
        "vocab_size": VOCAB, "context_length": 64, "embedding_length": 32, "block_count": 2,
        "feed_forward_length": 96, "attention.head_count": 4, "attention.head_count_kv": 1,
        "rope.dimension_count": 4, "rope.freq_base": 500.0, "attention.q_lora_rank": 12,
        "attention.kv_lora_rank": 16, "attention.key_length": 20, "attention.value_length": 16,
        "attention.key_length_mla": 12, "attention.value_length_mla": 6, "leading_dense_block_count": 2,
        "expert_feed_forward_length": 96, "expert_shared_count": 0,
        "attention.layer_norm_rms_epsilon": float(np.float32(1e-6))}.items()}
    layer = {"attn_norm": [32], "attn_q_a": [12, 32], "attn_q_a_norm": [12], "attn_q_b": [48, 12],
             "attn_kv_a_mqa": [20, 32], "attn_kv_a_norm": [16], "attn_k_b": [4, 16, 8], "attn_v_b": [4, 6, 16],
             "attn_output": [32, 24], "ffn_norm": [32], "ffn_gate": [96, 32], "ffn_up": [96, 32], "ffn_down": [32, 96]}
    expected = {"token_embd.weight": [VOCAB, 32], "output_norm.weight": [32], "output.weight": [VOCAB, 32]}
    expected |= {f"blk.{i}.{name}.weight": shape for i in range(2) for name, shape in layer.items()}
    found = tensors(path)
    assert {name: t.shape.tolist()[::-1] for name, t in found.items()} == expected
    attn = model.blocks[1].attn
    k_up, v_up = attn.k_up.weight.detach().view(4, 8, 16), attn.v_up.weight.detach().view(4, 6, 16)
    assert np.array_equal(found["blk.1.attn_k_b.weight"].data, k_up.transpose(1, 2).numpy())
    assert np.array_equal(found["blk.1.attn_v_b.weight"].data, v_up.numpy())
    # the RoPE rows in adjacent pairs: kv_a_mqa's last 4 rows are ours [0, 2, 1, 3]
    kv_down = attn.kv_down.weight.detach()
    assert np.array_equal(found["blk.1.attn_kv_a_mqa.weight"].data, kv_down[[*range(16), 16, 18, 17, 19]].numpy())


def test_the_hybrid_round_trips_as_qwen35_with_its_value_heads_tiled(exported):
    """llama.cpp's qwen35 (interop/families/qwen3_5.py): the layers' kinds as an interval, the linear layers' sizes as
    its ssm.* keys, the decay's rate negated, each gain whole, and the value heads in ggml's tiled order: with 2 key
    heads and 6 value heads, ours 0-5 (0, 1 and 2 read key head 0) are written [0, 3, 1, 4, 2, 5]; the 3 rotated
    pairs one in each RoPE section."""
    model, path = exported(tie=False, hybrid=True)
    assert metadata(path, "general.architecture") == {"general.architecture": "qwen35"}
    found_keys = metadata(path, "qwen35.")
    assert {key: found_keys[f"qwen35.{key}"] for key in (
        "block_count", "full_attention_interval", "attention.head_count", "attention.head_count_kv",
        "attention.key_length", "rope.dimension_count", "rope.dimension_sections", "ssm.conv_kernel",
        "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size")} == {
        "block_count": 4, "full_attention_interval": 4, "attention.head_count": 4, "attention.head_count_kv": 2,
        "attention.key_length": 8, "rope.dimension_count": 6, "rope.dimension_sections": [1, 1, 1, 0],
        "ssm.conv_kernel": 4, "ssm.state_size": 8, "ssm.group_count": 2, "ssm.time_step_rank": 6,
        "ssm.inner_size": 48}
    found, tiled = tensors(path), [0, 3, 1, 4, 2, 5]
    linear, attention = model.blocks[0].attn, model.blocks[3].attn
    weight = {name: p.detach() for name, p in linear.named_parameters()}
    assert np.array_equal(found["blk.0.ssm_a"].data, -weight["A_log"].exp()[tiled].numpy())
    assert np.array_equal(found["blk.0.ssm_dt.bias"].data, weight["dt_bias"][tiled].numpy())
    assert np.array_equal(found["blk.0.ssm_alpha.weight"].data, weight["decay_proj.weight"][tiled].numpy())
    assert np.array_equal(found["blk.0.ssm_out.weight"].data,
                          weight["out.weight"].view(32, 6, 8)[:, tiled].reshape(32, 48).numpy())
    qk, v = weight["conv.weight"].squeeze(1).split([32, 48])  # [C, K]: q's and k's channels, then v's by head
    assert np.array_equal(found["blk.0.ssm_conv1d.weight"].data,
                          torch.cat([qk, v.view(6, 8, 4)[tiled].reshape(48, 4)]).numpy())
    assert np.array_equal(found["blk.0.ssm_norm.weight"].data, weight["norm.weight"].numpy())  # a plain gain
    # the (1 + w) gains, g - 1 in transformers' file, whole again: exact for g >= 1/2, within 2^-24 below
    gains = {"blk.3.attn_q_norm.weight": attention.qk_norm.q_norm.weight, "output_norm.weight": model.final_norm.weight,
             "blk.0.post_attention_norm.weight": model.blocks[0].ffn_norm.weight}
    assert max(np.abs(found[name].data - g.detach().numpy()).max() for name, g in gains.items()) <= 2 ** -24
    _, quantized = exported(tie=False, hybrid=True, dtype="q8_0")
    assert tensors(quantized)["blk.0.ssm_conv1d.weight"].tensor_type == Q.F32  # as llama.cpp's converter keeps it


@pytest.mark.parametrize("moe", MOE)
def test_moe_round_trips_through_the_gguf_reader(exported, moe):
    """Each MoE as its llama.cpp graph reads it: E and k, each expert's width, the router (ffn_gate_inp), the experts'
    projections stacked [E, out, in], deepseek2's dense first block, shared expert and bias (exp_probs_b)."""
    model, path = exported(tie=False, moe=moe)
    arch = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "deepseek_v3": "deepseek2"}[moe]
    found, keys = tensors(path), metadata(path, f"{arch}.")
    assert (keys[f"{arch}.expert_count"], keys[f"{arch}.expert_used_count"]) == (4, 2)
    # llama's MoE graph reads feed_forward_length as each expert's width; the others have their own key
    width = "feed_forward_length" if arch == "llama" else "expert_feed_forward_length"
    assert keys[f"{arch}.{width}"] == 16
    if arch == "deepseek2":
        assert {key: keys[f"deepseek2.{key}"] for key in (
            "leading_dense_block_count", "expert_shared_count", "expert_gating_func", "expert_weights_norm",
            "expert_weights_scale", "expert_group_count", "expert_group_used_count")} == {
            "leading_dense_block_count": 1, "expert_shared_count": 1, "expert_gating_func": 2,  # sigmoid
            "expert_weights_norm": True, "expert_weights_scale": 1.0, "expert_group_count": 1,
            "expert_group_used_count": 1}
        assert {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"} <= set(found)
        assert found["blk.1.exp_probs_b.bias"].data.tolist() == pytest.approx(ROUTER_BIAS)
        assert [found[f"blk.1.ffn_{p}_shexp.weight"].shape.tolist()[::-1] for p in ("gate", "up", "down")] == [
            [16, 32], [16, 32], [32, 16]]
    moe_block = max(model.moe_layers())
    experts = model.blocks[moe_block].ffn
    shapes = {f"blk.{moe_block}.{name}.weight": t.shape.tolist()[::-1] for name, t in (
        (name, found[f"blk.{moe_block}.{name}.weight"]) for name in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps",
                                                                    "ffn_down_exps"))}
    assert list(shapes.values()) == [[4, 32], [4, 16, 32], [4, 16, 32], [4, 32, 16]]
    w_in = experts.experts_in.weight.detach().view(4, 2, 16, 32)
    w_out = experts.experts_out.weight.detach().view(4, 16, 32)
    assert np.array_equal(found[f"blk.{moe_block}.ffn_gate_exps.weight"].data, w_in[:, 0].numpy())
    assert np.array_equal(found[f"blk.{moe_block}.ffn_up_exps.weight"].data, w_in[:, 1].numpy())
    assert np.array_equal(found[f"blk.{moe_block}.ffn_down_exps.weight"].data, w_out.transpose(1, 2).numpy())
    assert np.array_equal(found[f"blk.{moe_block}.ffn_gate_inp.weight"].data, experts.router.weight.detach().numpy())


@pytest.mark.parametrize("switches, message", [
    (MOE["qwen3_moe"] | dict(dense_layers=1), "model.dense_layers=1 has no llama.cpp qwen3moe equivalent: its graph "
                                              "has experts in every block"),
    (MOE["deepseek_v3"] | dict(n_shared_experts=0), "model.n_shared_experts=0 has no llama.cpp deepseek2 equivalent"),
])
def test_an_moe_a_llama_cpp_graph_cannot_run_is_refused(tmp_path, tokenizer_file, capsys, switches, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(**switches)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "m.gguf") == 2
    assert one_error_line(capsys).startswith(f"error: {message}")
    assert not (tmp_path / "m.gguf").exists()


def test_mla_without_a_query_latent_is_refused_where_llama_cpp_cannot_read_it(tmp_path, tokenizer_file, capsys):
    """llama.cpp takes deepseek2's full query projection only at 26 or 27 layers (DeepSeek-V2-Lite's): measured,
    its loader stops at `key not found in model: deepseek2.attention.q_lora_rank` for a 2-layer one."""
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(**MLA | {"q_rank": None})), tokenizer_file)
    capsys.readouterr()
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "m.gguf") == 2
    assert one_error_line(capsys) == (
        "error: model.q_rank=null with model.n_layers=2 has no llama.cpp deepseek2 equivalent: llama.cpp reads a full "
        "query projection only at DeepSeek-V2-Lite's 26 or 27 layers; give MLA a query latent (model.q_rank)\n")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("scaling", ["linear", "yarn"])
def test_mla_with_a_rope_scaling_llama_cpp_applies_otherwise_is_refused(tmp_path, tokenizer_file, capsys, scaling):
    cfg = llama_cfg(**MLA, rope_scaling=scaling, rope_factor=2.0, rope_original_context=32)
    save_checkpoint(tmp_path / "ckpt", Transformer(cfg), tokenizer_file)
    capsys.readouterr()
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "m.gguf") == 2
    assert one_error_line(capsys).startswith(f"error: model.rope_scaling={scaling} with attention=mla has no llama.cpp")
    assert not (tmp_path / "m.gguf").exists()


def test_mla_with_another_norm_eps_exports_with_a_note_that_llama_cpp_differs(tmp_path, tokenizer_file, capsys):
    """llama.cpp's deepseek2 reads one eps for all its RMSNorms; our latents keep 1e-6, so norm_eps=1e-5 is said."""
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(**{**MLA, "norm_eps": 1e-5})), tokenizer_file)
    capsys.readouterr()
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "m.gguf") == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert notes == ["note: model.norm_eps=1e-05: llama.cpp gives the latents' RMSNorms that eps too, where this "
                     "model's have 1e-06; its logits differ from ours by that"]
    assert GGUFReader(tmp_path / "m.gguf").fields["deepseek2.attention.layer_norm_rms_epsilon"].contents() == \
        pytest.approx(1e-5)


def test_qwen3_rope_keys_are_llamas_under_its_prefix(tmp_path, tokenizer_file):
    """A RoPE scaling reaches llama.cpp's qwen3 as it reaches its llama, and dynamic is refused for both."""
    yarn = dict(rope_scaling="yarn", rope_factor=4.0, rope_original_context=16)
    rope = {}
    for qk_norm, arch in (("none", "llama"), ("rmsnorm", "qwen3")):
        write_gguf(Transformer(llama_cfg(qk_norm=qk_norm, **yarn)), tokenizer_file, tmp_path / f"{arch}.gguf")
        rope[arch] = {k.removeprefix(arch): v for k, v in metadata(tmp_path / f"{arch}.gguf", f"{arch}.rope").items()}
        with pytest.raises(InteropError, match=f"{arch}.rope.scaling.type is none, linear, yarn or longrope"):
            write_gguf(Transformer(llama_cfg(qk_norm=qk_norm, rope_scaling="dynamic", rope_factor=4.0)),
                       tokenizer_file, tmp_path / "dynamic.gguf")
    assert rope["qwen3"] == rope["llama"] and rope["qwen3"][".rope.scaling.type"] == "yarn"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.gguf", "qwen3.gguf"]


@pytest.mark.parametrize("dtype, qtype, file_type, bytes_per_weight", [
    ("f16", Q.F16, 1, 2), ("q8_0", Q.Q8_0, 7, 34 / 32)])
def test_quantized_matrices_are_within_their_rounding_of_f32(exported, dtype, qtype, file_type, bytes_per_weight):
    _, f32 = exported(tie=False)
    _, small = exported(tie=False, dtype=dtype)
    assert metadata(small, "general.file_type") == {"general.file_type": file_type}
    exact, rounded = tensors(f32), tensors(small)
    for name, t in rounded.items():
        w = exact[name].data.astype(np.float64)
        if w.ndim == 1:  # norm gains stay float32, as llama.cpp's converter keeps them
            assert t.tensor_type == Q.F32 and np.array_equal(t.data, exact[name].data)
            continue
        assert t.tensor_type == qtype and t.n_bytes == t.n_elements * bytes_per_weight
        error = np.abs(gguf.dequantize(t.data, qtype).reshape(w.shape) - w)
        if qtype == Q.F16:
            # round to nearest with 11 significant bits; below 2^-14 (subnormal) the spacing is a fixed 2^-24
            bound = np.maximum(np.abs(w) * 2.0 ** -11, 2.0 ** -25)
        else:
            # d = max |block| / 127, each weight rounded to a multiple of d (at most d / 2 off), and d itself
            # stored as f16 (at most 2^-11 d off, times |q| <= 127)
            d = np.abs(w).reshape(-1, 32).max(axis=1, keepdims=True) / 127
            bound = np.broadcast_to(d * (0.5 + 127 * 2.0 ** -11), (d.shape[0], 32)).reshape(w.shape)
        assert (error <= bound * (1 + 1e-6)).all(), name
        assert error.max() > 0  # really rounded
    assert small.stat().st_size < f32.stat().st_size


def test_q8_0_keeps_a_matrix_whose_rows_are_not_whole_blocks_f16_with_a_note(tmp_path, tokenizer_file, capsys):
    # d 48: rows of 48 weights are one and a half q8_0 blocks; ffn_down's rows are d_ff = 128, four whole blocks
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(d_model=48, n_layers=1)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--dtype", "q8_0",
                      "--out", tmp_path / "m.gguf") == 0
    types = {name: t.tensor_type for name, t in tensors(tmp_path / "m.gguf").items() if len(t.shape) == 2}
    assert types.pop("blk.0.ffn_down.weight") == Q.Q8_0
    assert set(types.values()) == {Q.F16}
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert sorted(line.split()[1] for line in notes) == sorted(types)
    assert "rows of 48 are not whole Q8_0 blocks of 32" in notes[0]


@pytest.mark.parametrize("tie, qk_norm, moe, class_name", [(True, "none", None, "LlamaForCausalLM"),
                                                           (False, "none", None, "LlamaForCausalLM"),
                                                           (True, "rmsnorm", None, "Qwen3ForCausalLM"),
                                                           (False, "none", "qwen3_moe", "Qwen3MoeForCausalLM")])
def test_transformers_reads_the_file_with_equal_logits(exported, tie, qk_norm, moe, class_name):
    model, path = exported(tie=tie, qk_norm=qk_norm, moe=moe)
    qk_norm = model.cfg.qk_norm
    # transformers 5.24 reads no head dim from a qwen3 file (neither rope.dimension_count nor attention.key_length)
    # and takes Qwen3Config's 128; llama.cpp derives embedding_length / head_count, 8 here, so it is passed as that
    # and its qwen3_moe mapping reads no expert_feed_forward_length: Qwen3MoeConfig's 768 unless given
    given = {"Qwen3ForCausalLM": {"head_dim": model.cfg.head_dim},
             "Qwen3MoeForCausalLM": {"moe_intermediate_size": model.cfg.expert_d_ff}}.get(class_name, {})
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, **given)
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=config).eval()
    assert type(theirs).__name__ == class_name and theirs.config.tie_word_embeddings == tie
    tokens = torch.randint(VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, expected = model(tokens), theirs(tokens).logits
    # float32 on both sides (transformers' RMSNorm computes in float32 whatever the model's dtype): sums taken in
    # another order differ by ~100 roundings of 2^-24 relative to the largest value, while a wrong q/k order, head
    # count or eps moves logits of std > 1 by O(1)
    assert expected.std() > 1
    assert (logits - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()


@pytest.fixture(scope="module")
def padded_prefixed_tokenizer(tmp_path_factory) -> Path:
    """A SentencePiece model with a pad piece and a dummy prefix, the two settings data/tokenizer.py does not use."""
    prefix = tmp_path_factory.mktemp("sp") / "sp"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_prefix=str(prefix), vocab_size=VOCAB,
                                   minloglevel=2, **TRAINER_SETTINGS | {"add_dummy_prefix": True, "pad_id": 3})
    return prefix.with_suffix(".model")


@pytest.mark.parametrize("kind", ["ours", "padded_prefixed"])
def test_the_embedded_tokenizer_round_trips(tmp_path, tokenizer_file, padded_prefixed_tokenizer, kind):
    model_file = tokenizer_file if kind == "ours" else padded_prefixed_tokenizer
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg()), model_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "m.gguf") == 0
    found = metadata(tmp_path / "m.gguf", "tokenizer.ggml.")
    ids = range(sp.get_piece_size())
    kinds = [gguf.TokenType.CONTROL if sp.is_control(i) else gguf.TokenType.UNKNOWN if sp.is_unknown(i)
             else gguf.TokenType.BYTE if sp.is_byte(i) else gguf.TokenType.NORMAL for i in ids]
    assert {gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN, gguf.TokenType.BYTE, gguf.TokenType.NORMAL} <= set(kinds)
    pad = {"tokenizer.ggml.padding_token_id": 3} if kind == "padded_prefixed" else {}
    assert found == {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
                     "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in ids],
                     "tokenizer.ggml.scores": [float(np.float32(sp.get_score(i))) for i in ids],
                     "tokenizer.ggml.token_type": kinds,
                     "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                     "tokenizer.ggml.unknown_token_id": 0, **pad, "tokenizer.ggml.add_bos_token": True,
                     "tokenizer.ggml.add_eos_token": False, "tokenizer.ggml.add_space_prefix": kind != "ours"}


@pytest.mark.parametrize("switches", [dict(norm_position="post"), dict(ffn="relu"), dict(ffn="relu2"),
                                      dict(norm="layernorm", position="learned"), dict(qk_norm="rmsnorm", ffn="relu2")])
def test_checkpoints_with_no_counterpart_are_refused_naming_each_switch(tmp_path, tokenizer_file, capsys, switches):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg(**switches)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", tmp_path / "m.gguf") == 2
    arch = "Qwen3" if switches.get("qk_norm") == "rmsnorm" else "LLaMA"  # model.qk_norm picks which it would be
    named = ", ".join(f"model.{key}={value}" for key, value in switches.items() if key != "qk_norm")
    assert f"error: no llama.cpp {arch} equivalent for {named} ({arch} is model.norm=rmsnorm" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing written, no temporary left


def test_an_existing_out_is_replaced_whole_or_not_at_all(tmp_path, tokenizer_file, capsys, monkeypatch):
    save_checkpoint(tmp_path / "ckpt", far_from_init(Transformer(llama_cfg())), tokenizer_file)
    out = tmp_path / "m.gguf"
    export = ("--ckpt", tmp_path / "ckpt", "--format", "gguf", "--out", out)
    assert run_export(*export) == 0
    before = out.read_bytes()
    assert run_export(*export, "--dtype", "q8_0") == 2
    assert f"--out {out} exists; pass --force to replace it" in one_error_line(capsys)

    def disk_full_halfway(writer, **kwargs):
        writer.fout[0].write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full_halfway)
        assert run_export(*export, "--dtype", "q8_0", "--force") == 2
    assert one_error_line(capsys) == f"error: cannot write {out}: No space left on device\n"
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "m.gguf"]  # no temporary left behind
    assert run_export(*export, "--dtype", "q8_0", "--force") == 0
    assert metadata(out, "general.file_type") == {"general.file_type": 7}


@pytest.mark.parametrize("args, out_is_dir, message", [
    (["--dtype", "q8_0"], False, "--dtype=q8_0 applies to --format gguf only"),
    (["--format", "gguf", "--dtype", "q4_0"], False, "argument --dtype: invalid choice: 'q4_0'"),
    (["--format", "gguf"], True, "is a directory; --format gguf writes one file")])
def test_bad_flags_get_one_line_and_write_nothing(tmp_path, tokenizer_file, capsys, args, out_is_dir, message):
    save_checkpoint(tmp_path / "ckpt", Transformer(llama_cfg()), tokenizer_file)
    out = tmp_path / "out"
    if out_is_dir:
        out.mkdir()
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", out, *args) == 2
    assert message in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"] + ["out"] * out_is_dir
    assert not out_is_dir or not any(out.iterdir())


@needs_llama_cpp
@pytest.mark.parametrize("tie, qk_norm, mla, moe, hybrid", [
    (True, "none", False, None, False), (False, "none", False, None, False), (True, "rmsnorm", False, None, False),
    (False, "none", True, None, False), *((False, "none", False, moe, False) for moe in MOE),
    (False, "rmsnorm", False, None, True)])
def test_llama_cpp_runs_the_file_as_ours(exported, tok, tmp_path, tie, qk_norm, mla, moe, hybrid):
    model, path = exported(tie=tie, qk_norm=qk_norm, mla=mla, moe=moe, hybrid=hybrid)
    # a float32 KV cache: llama.cpp's default f16 one rounds every cached k and v to 11 bits
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)

    tokens = torch.randint(VOCAB, (64,), generator=torch.Generator().manual_seed(1))
    llm.reset()
    llm.eval(tokens.tolist())
    theirs = torch.from_numpy(np.array(llm.scores[:64], dtype=np.float64))
    with torch.no_grad():
        ours = model(tokens[None])[0].double()
    # float32 on both sides, but llama.cpp's own kernels: RoPE angles from repeated products of theta, SIMD
    # approximations of exp in softmax and SiLU, other orders of summation. Each is a few 2^-24 steps off, and a
    # few hundred of them compound into a logit: 3e-5 of the largest one; a wrong layout moves logits by O(1)
    tolerance = 3e-5 * ours.abs().max().item()
    assert ours.std() > 1
    assert (ours - theirs).abs().max().item() <= tolerance

    prompt = [tok.bos_id] + tok.encode(PROMPT)
    expected = greedy_ids(model, prompt, eos_id=None)
    # each of our greedy picks beats the runner-up by more than the two implementations can differ,
    # so llama.cpp must make the same pick: equality is forced, not luck
    with torch.no_grad():
        logits = model(torch.tensor([prompt + expected]))[0, len(prompt) - 1:-1]
    top2 = logits.topk(2).values
    assert (top2[:, 0] - top2[:, 1]).min().item() > 2 * tolerance
    greedy = llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True)
    assert list(itertools.islice(greedy, len(expected))) == expected

    play = write_corpus(tmp_path / "play.txt").read_text()  # newlines and capitals: byte fallback at work
    for text in TEXTS + corpus()[:50] + [play[:2000]]:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), text
    assert llm.tokenize(PROMPT.encode(), add_bos=True, special=False) == prompt
