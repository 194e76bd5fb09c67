"""training/diagnostics.py: each statistic on inputs whose value is known by construction, and
layer_stats on a real model leaves the model exactly as it found it."""
import math

import pytest
import torch

from model.config import ModelConfig
from model.transformer import Transformer
from model.attention import attention_weights
from training.diagnostics import layer_stats, normalised_entropy, position_cosine


def test_position_cosine_is_one_for_identical_positions_and_zero_for_orthogonal_ones():
    same = torch.randn(2, 1, 16).expand(2, 5, 16)
    assert position_cosine(same) == pytest.approx(1.0, abs=1e-6)
    orthogonal = torch.eye(8).unsqueeze(0)  # position t is the t-th basis vector
    assert position_cosine(orthogonal) == pytest.approx(0.0, abs=1e-7)
    # two positions at 60 degrees: cos = 0.5 for the one pair (the self-similarities are left out)
    pair = torch.tensor([[[1.0, 0.0], [0.5, math.sqrt(3) / 2]]])
    assert position_cosine(pair) == pytest.approx(0.5, abs=1e-6)


def attention_entropy(q: torch.Tensor, k: torch.Tensor) -> float:
    """What layer_stats logs for a layer whose q and k these are (Attention.weights' softmax)."""
    return normalised_entropy(attention_weights(q, k)).mean().item()


def test_attention_entropy_is_one_when_uniform_and_zero_when_on_one_key():
    B, H, T, D = 1, 4, 6, 8
    assert attention_entropy(torch.zeros(B, H, T, D), torch.randn(B, 2, T, D)) == pytest.approx(1.0, abs=1e-6)
    # every query a huge multiple of key 0: softmax puts all of its weight there
    k = torch.zeros(B, 1, T, D)
    k[..., 0, 0] = 1.0
    q = torch.zeros(B, H, T, D)
    q[..., 0] = 1e4
    assert attention_entropy(q, k) == pytest.approx(0.0, abs=1e-6)


def test_attention_entropy_of_two_equal_keys_among_three_visible():
    # query t=2 sees keys 0, 1, 2 with scores (s, s, -inf-ish): entropy ln 2 of max ln 3; rows 1: (s, s) -> ln 2 / ln 2
    k = torch.tensor([[[[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]]]])
    q = torch.tensor([[[[0.0, 0.0], [1e4, 0.0], [1e4, 0.0]]]])
    expected = (1.0 + math.log(2) / math.log(3)) / 2
    assert attention_entropy(q, k) == pytest.approx(expected, abs=1e-6)


def test_layer_stats_reports_every_layer_and_leaves_the_model_untouched():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, context_length=16,
                      norm_position="post", dropout=0.1)
    model = Transformer(cfg).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randint(64, (2, 16)), torch.randint(64, (2, 16))
    rng = torch.get_rng_state()
    stats = layer_stats(model, x, y)
    assert torch.equal(torch.get_rng_state(), rng)  # eval mode: no dropout mask was drawn
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    names = ("stream_rms", "attn_ratio", "ffn_ratio", "position_cos", "attn_entropy", "grad_norm")
    assert set(stats) == {f"diag/{n}/{i}" for n in names for i in range(3)} | {"diag/token_rms"}  # RoPE: no table
    assert stats["diag/token_rms"] == pytest.approx(0.02, rel=0.1)  # 64 x 32 draws of N(0, 0.02^2)
    for i in range(3):
        assert stats[f"diag/stream_rms/{i}"] == pytest.approx(1.0, abs=1e-3)  # Post-Norm: each block ends in a norm
        assert 0 < stats[f"diag/attn_entropy/{i}"] <= 1 and stats[f"diag/grad_norm/{i}"] > 0
    # at initialisation attention is near uniform (q.k ~ 0) and positions carry different tokens
    assert stats["diag/attn_entropy/0"] > 0.99 and abs(stats["diag/position_cos/0"]) < 0.2


def embedding_parts(position: str, scale: str) -> dict:
    """layer_stats at init of a d = 128 model whose 4096 tokens are each read once: 4096 x 128 draws of E, so the
    rms of the draws is within ~1% of their std (a learned table's 128 x 128 draws too)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, d_model=128, n_layers=1, n_heads=8, n_kv_heads=2, context_length=128,
                      position=position, embedding_scale=scale)
    x = torch.arange(4096).view(32, 128)
    return layer_stats(Transformer(cfg), x, x.roll(-1, dims=1))


@pytest.mark.parametrize("scale, token_rms", [("gpt2", 0.02 * 128 ** 0.5), ("transformer2017", 1.0)])
def test_the_embedding_scale_sets_the_token_part_beside_the_sinusoidal_table(scale, token_rms):
    """model.embedding_scale: sqrt(d) E has rms 0.02 sqrt(d) = 0.23 with GPT-2's init and 1 with the 2017
    Transformer's N(0, 1/d); the sinusoidal table has rms 1/sqrt(2) = 0.71 either way."""
    stats = embedding_parts("sinusoidal", scale)
    assert stats["diag/token_rms"] == pytest.approx(token_rms, rel=0.02)
    assert stats["diag/position_rms"] == pytest.approx(0.5 ** 0.5, rel=0.01)


@pytest.mark.parametrize("scale, token_rms", [("gpt2", 0.02), ("transformer2017", 1.0)])
def test_a_learned_table_starts_at_the_token_signal_rms(scale, token_rms):
    stats = embedding_parts("learned", scale)
    assert stats["diag/token_rms"] == pytest.approx(token_rms, rel=0.02)
    assert stats["diag/position_rms"] == pytest.approx(token_rms, rel=0.02)


def test_a_linear_layer_logs_no_attention_entropy_and_the_attention_layer_does():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, context_length=16,
                      linear_pattern="3:1")
    stats = layer_stats(Transformer(cfg), torch.randint(64, (2, 16)), torch.randint(64, (2, 16)))
    assert [f"diag/attn_entropy/{i}" in stats for i in range(4)] == [False, False, False, True]
    assert 0 < stats["diag/attn_entropy/3"] <= 1 and stats["diag/stream_rms/0"] > 0
