"""Multi-head latent attention (model/mla.py): the absorbed form against the naive one, cached decoding against
recomputation for every combination MLA takes, the latent cache's bytes against the formula and GQA's, decoding
that never up-projects a cached token, the settings it refuses, a training run, the exports it has no
counterpart in, and the estimator's MLA rows (the chapter's LLaMA-2-7B sizes, DeepSeek-V3's own)."""
import itertools
import json

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from data_helpers import metrics, train_in_process
from errors import ConfigError
from generation.engine import Engine
from generation.kv_memory import estimate
from interop_helpers import one_error_line, run_export
from model import ModelConfig, Transformer
from model.mla import LatentAttention
from settings import compose_config
from storage.checkpoint import load_checkpoint
from training.config import model_config
from weights import far_from_init

# what MLA takes: a query latent or a full query, each position kind (RoPE: a decoupled part; else none), values
# as wide as the heads or not, Pre- or Post-Norm, and RoPE past its context (YaRN)
COMBINATIONS = [dict(q_rank=q_rank, position=position, v_head_dim=v_head_dim, norm_position=norm_position)
                for q_rank, position, v_head_dim, norm_position in itertools.product(
                    (None, 12), ("rope", "sinusoidal", "learned", "none"), (None, 6), ("pre", "post"))]
COMBINATIONS.append(dict(rope_scaling="yarn", rope_factor=2.0, context_length=12))
NAMES = ["-".join(f"{k}={v}" for k, v in c.items()) for c in COMBINATIONS]


def mla_model(seed: int = 0, **settings) -> Transformer:
    """A tiny MLA model (d_c = 10, d_R = 4 with RoPE), its weights far from init, in float64."""
    cfg = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, context_length=32, kv_rank=10,
               rope_head_dim=4) | settings
    if cfg.get("position", "rope") != "rope":  # no RoPE, no RoPE part
        cfg["rope_head_dim"] = 0
    return far_from_init(Transformer(ModelConfig(**cfg)), seed).double()


@pytest.mark.parametrize("settings", COMBINATIONS, ids=NAMES)
def test_the_absorbed_form_equals_the_naive_one(settings):
    """Each layer's attention over 9 positions, as decoding computes it against the latents alone and as training
    computes it with every head's K and V, in float64: the same to 1e-10 (they differ by the order of the sums,
    ~1e-16 of outputs of order 1)."""
    model = mla_model(**settings)
    torch.manual_seed(1)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    for block in model.blocks:
        attn: LatentAttention = block.attn
        q, latents = attn.project(x, start=3)
        k, v = attn.expand(latents)
        naive = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(attn.absorbed(q, latents, n_new=9), naive, rtol=1e-10, atol=1e-10)
        # and with the last 2 positions new, as a chunk after a cached prefix: the causal mask's offset
        torch.testing.assert_close(attn.absorbed(q[:, :, 7:], latents, n_new=2), naive[:, :, 7:],
                                   rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("settings", COMBINATIONS, ids=NAMES)
def test_cached_greedy_decoding_equals_recomputation(settings):
    """A prefill of 5 tokens, then 14 decoded ones against the latent cache (past the YaRN model's 12-token
    context), against recomputing the whole prefix each step: the same tokens, and logits to 1e-10 in float64."""
    model = mla_model(COMBINATIONS.index(settings), **settings)
    prompts = [[1, 5, 9, 13, 17], [2, 40, 3, 63, 7]]
    steps = {}
    for use_cache in (True, False):
        engine, logits = Engine(model), []
        engine._forward = lambda tokens, start, cache, model=None, forward=engine._forward: logits.append(
            forward(tokens, start, cache, model)) or logits[-1]
        steps[use_cache] = (torch.stack(list(engine.generate(prompts, 14, temperature=0, use_cache=use_cache)),
                                        dim=1).tolist(), logits)
    (cached, with_cache), (recomputed, without_cache) = steps[True], steps[False]
    assert cached == recomputed
    for a, b in zip(with_cache, without_cache, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_decoding_never_up_projects_a_cached_token():
    """A decode step with the cache runs the absorbed form: W_uk and W_uv are read as weights, never applied to a
    latent; the prefill applies them once, to its own tokens."""
    model = mla_model()
    applied = []
    for block in model.blocks:
        for linear in (block.attn.k_up, block.attn.v_up):
            linear.register_forward_hook(lambda module, inputs, output: applied.append(inputs[0].shape[1]))
    cache = model.new_kv_cache(batch=1, max_len=8, dtype=torch.float64)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), 0, cache)
        assert applied == [3] * 4  # k_up and v_up of 2 layers, on the prefill's 3 tokens
        for t in range(3, 8):
            model(torch.tensor([[t]]), t, cache)
    assert applied == [3] * 4


def test_the_latent_cache_holds_d_c_plus_d_r_per_token_and_layer():
    model = mla_model()  # d_c = 10, d_R = 4, 2 layers
    cache = model.new_kv_cache(batch=3, max_len=7, dtype=torch.float32)
    assert cache.nbytes == 2 * (10 + 4) * 7 * 3 * 4 == model.kv_cache_bytes_per_token(torch.float32) * 7 * 3
    # llama_tiny's attention=mla (64 + 16 per token and layer) against its GQA (2 K/V heads of 32: 2 x 2 x 32)
    sizes = {attention: Transformer(model_config(compose_config([f"attention={attention}"]), 1024))
             .kv_cache_bytes_per_token(torch.float32) for attention in ("gqa", "mla", "mqa")}
    assert sizes == {"gqa": 4 * 2 * 2 * 32 * 4, "mla": 4 * 80 * 4, "mqa": 4 * 2 * 1 * 32 * 4}  # 4 layers, fp32


def test_every_parameter_gets_a_gradient():
    model = mla_model(q_rank=12)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("overrides, message", [
    (["model.kv_rank=64"], "model.kv_rank=64 is a setting of attention=mla, not of attention=gqa"),
    (["model.q_rank=8"], "model.q_rank=8 is a setting of attention=mla, but this model has no latent"),
    (["attention=mla", "model.kv_rank=null"], "model.attention=mla needs the latent's width, but model.kv_rank=null"),
    (["attention=mla", "model.kv_rank=0"], "model.kv_rank=0 must be a positive integer"),
    (["attention=mla", "model.kv_rank=257"], "model.kv_rank=257 must be at most the keys and values it compresses, "
                                             "model.n_heads x (head_dim + v_head_dim) = 256"),
    (["attention=mla", "model.q_rank=0"], "model.q_rank=0 must be a positive integer"),
    (["attention=mla", "model.rope_head_dim=7"], "model.rope_head_dim=7 must be even and at most the head dim"),
    (["attention=mla", "model.rope_head_dim=34"], "model.rope_head_dim=34 must be even and at most the head dim"),
    (["attention=mla", "model.rope_head_dim=0"], "model.rope_head_dim=0 with model.position=rope: MLA's RoPE part "
                                                 "carries RoPE's positions"),
    (["attention=mla", "position=learned", "model.rope_head_dim=16"], "model.rope_head_dim=16 with "
                                                                       "model.position=learned"),
    (["attention=mla", "qk_norm=rmsnorm"], "model.qk_norm=rmsnorm with attention=mla"),
    (["attention=mla", "model.n_kv_heads=2"], "model.attention=mla up-projects a key and a value for every query "
                                              "head: model.n_kv_heads=2 must be model.n_heads=4"),
])
def test_settings_mla_cannot_take_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        model_config(compose_config(overrides))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_run_trains_with_muon_generates_from_its_checkpoint_and_refuses_the_exports(workdir, tiny, monkeypatch,
                                                                                     capsys):
    """train.py with attention=mla and Muon (each of [W_dkv; W_kr] orthogonalised on its own): the loss falls,
    the checkpoint is MLA's and generates, and the exports with no counterpart are one line, nothing written;
    a refused setting through train.py is one line, exit 2, and no file."""
    run_dir, tiny = workdir / "mla", [o for o in tiny if not o.startswith("model.n_kv_heads=")]  # MLA's: n_heads
    assert train_in_process(run_dir, [*tiny, "attention=mla", "model.q_rank=16", "optim=muon", "train.lr=0.01",
                                      "train.max_steps=12"], monkeypatch) == 0
    assert OmegaConf.load(run_dir / "config.yaml").model.attention == "mla"
    losses = [m["train_loss"] for m in metrics(run_dir)]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3
    model, _ = load_checkpoint(run_dir)
    assert (model.cfg.attention, model.cfg.kv_rank, model.cfg.q_rank) == ("mla", 64, 16)  # configs/attention/mla.yaml
    assert isinstance(model.blocks[0].attn, LatentAttention)
    decoded = [[int(t) for t in Engine(model).generate([[1, 2, 3]], 6, temperature=0, use_cache=use_cache)]
               for use_cache in (True, False)]
    assert decoded[0] == decoded[1]
    capsys.readouterr()
    # tiny's LayerNorm has no DeepseekV3 counterpart (tests/test_interop.py and test_gguf.py export RMSNorm MLAs)
    for fmt in ("transformers", "gguf"):
        out = workdir / f"mla-export.{fmt}"
        assert run_export("--ckpt", run_dir, "--format", fmt, "--out", out) == 2
        assert "DeepseekV3 equivalent for model.norm=layernorm" in one_error_line(capsys) and not out.exists()
    refused = workdir / "mla-refused"
    assert train_in_process(refused, [*tiny, "attention=mla", "qk_norm=rmsnorm"], monkeypatch) == 2
    assert one_error_line(capsys).startswith("error: model.qk_norm=rmsnorm with attention=mla")
    assert not any(refused.rglob("*"))


def test_the_estimator_gives_the_chapters_fourth_row_and_deepseek_v3s_cache(tmp_path):
    """LLaMA-2-7B's 32 layers and 4,096 tokens with a latent of 512 + 64 at fp16: 0.151 GB, beside the chapter's
    MHA 2.1, GQA 0.54 and MQA 0.07 GB (test_kv_cache.py); DeepSeek-V3's config: 70,272 bytes per token at bf16."""
    report = estimate(["--layers", "32", "--kv-rank", "512", "--rope-head-dim", "64", "--seq", "4096"])
    assert f"= {32 * 576 * 4096 * 2:,} bytes = 0.151 GB" in report
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": 61, "kv_lora_rank": 512,
                                "qk_rope_head_dim": 64, "num_attention_heads": 128, "hidden_size": 7168,
                                "max_position_embeddings": 163840}))
    assert "; 70,272 bytes per token per sequence" in estimate(["--hf-config", str(path), "--dtype", "bf16"])
