"""Transformer.flops_per_token against a hand count of each preset, and against torch's FlopCounterMode on a forward
pass, and the causal span it counts against the mask the attention applies."""
from dataclasses import replace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from model import Transformer
from model.attention import mean_keys_seen, visible_keys
from settings import compose_config
from training.config import model_config

T, V, d = 128, 1024, 128  # every preset's context, vocabulary (the default corpus's) and width
HEAD = 2 * d * V  # the LM head
CAUSAL = (T + 1) / 2  # the keys a query sees on average in a causal sequence of T


def gqa(n_kv_heads: int, span: float = CAUSAL) -> float:
    """Attention of 4 heads of 32: W_qkv, W_o, then q k^T and the weights times v over `span` keys."""
    return 2 * d * (4 + 2 * n_kv_heads) * 32 + 2 * 4 * 32 * d + 2 * 2 * 4 * 32 * span


HAND_COUNTS = {  # forward FLOPs per token at T = 128, written out from each preset's sizes
    "llama_tiny": 4 * (gqa(2) + 3 * 2 * d * 352) + HEAD,  # SwiGLU of d_ff 352
    "modern_tiny": 4 * (gqa(2) + 2 * 2 * d * 512) + HEAD,  # ReLU² of 4 d; QK-norm is element-wise
    "transformer2017_tiny": 4 * (gqa(4) + 2 * 2 * d * 512) + HEAD,  # MHA, ReLU of 4 d
    # MLA of d_c 48, d_R 16: W_dkv and W_kr, W_q, W_uk, W_uv, W_o, then scores over 32 + 16 dims and values over 32
    "deepseek_tiny": 4 * (2 * d * (48 + 16) + 2 * d * 4 * (32 + 16) + 2 * 48 * 4 * 32 * 2 + 2 * 4 * 32 * d
                          + 2 * 4 * (32 + 16 + 32) * CAUSAL + 3 * 2 * d * 320) + HEAD,
    # the router over 15 experts, 3 routed and 1 shared expert of 88: not the 12 it skips
    "moe_tiny": 4 * (gqa(2) + 2 * d * 15 + (3 + 1) * 3 * 2 * d * 88) + HEAD,
    # windows of 32 in layers 0 and 2 (alternate): query t sees min(t + 1, 32) keys, on average
    # (32 x 33 / 2 + 96 x 32) / 128 = 28.125; 4 of 16 experts of 88, no shared one, the sinks multiply nothing
    "gptoss_tiny": 2 * (gqa(2, 28.125) + gqa(2)) + 4 * (2 * d * 16 + 4 * 3 * 2 * d * 88) + HEAD,
}


def preset(name: str) -> Transformer:
    cfg = model_config(compose_config([f"model={name}"]))
    assert (cfg.context_length, cfg.vocab_size, cfg.d_model) == (T, V, d)
    torch.manual_seed(0)
    return Transformer(cfg)


@pytest.mark.parametrize("name", HAND_COUNTS)
def test_each_presets_count_is_the_hand_count(name):
    model = preset(name)
    assert model.flops_per_token(T, training=False) == HAND_COUNTS[name]
    assert model.flops_per_token(T) == 3 * HAND_COUNTS[name]  # training: the backward costs twice the forward


def test_a_moe_counts_its_active_experts_and_not_the_inactive_ones():
    """moe_tiny's 12 experts a token skips cost it nothing: twice the experts add only the router's scores; one more
    expert a token adds one expert's SwiGLU in each of the 4 blocks."""
    cfg = preset("moe_tiny").cfg
    count = preset("moe_tiny").flops_per_token(T, training=False)
    assert Transformer(replace(cfg, n_experts=30)).flops_per_token(T, training=False) == count + 4 * 2 * d * 15
    assert Transformer(replace(cfg, experts_per_token=4)).flops_per_token(T, training=False) == \
        count + 4 * 3 * 2 * d * 88


@pytest.mark.parametrize("seq_len, window", [(1, None), (7, None), (128, None), (128, 32), (40, 39), (40, 40),
                                             (40, 64), (5, 1)])
def test_the_span_is_the_mean_of_the_keys_the_mask_lets_each_query_see(seq_len, window):
    visible = visible_keys(0, seq_len, seq_len, torch.arange(seq_len), window, "cpu")
    assert mean_keys_seen(seq_len, window) == pytest.approx(visible.sum().item() / seq_len, rel=1e-15)


@pytest.mark.parametrize("name", ["llama_tiny", "modern_tiny", "transformer2017_tiny", "deepseek_tiny", "moe_tiny"])
def test_the_count_is_what_flop_counter_mode_counts_in_a_forward(name):
    """FlopCounterMode counts the matmuls torch runs (2 per multiply-add) on a forward of 2 sequences of T, in float64
    and with sdpa's math kernel: float64 sends an MoE through one matmul per expert on exactly the rows routed to it
    (the CPU's grouped GEMM is not counted), and the math kernel is the one whose matmuls are counted on a CPU. The
    tolerance is exact but for one convention: that kernel computes the whole T x T square of scores and masks it,
    where flops_per_token counts the keys each query sees, (T + 1) / 2 on average; the difference, 2 H (D_qk + D_v)
    (T - (T + 1) / 2) per layer and token, is added back, and the counts then agree to float64 rounding."""
    model = preset(name).double().eval()
    cfg = model.cfg
    tokens = torch.randint(V, (2, T), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model(tokens)
    key_dims = cfg.head_dim + (16 if name == "deepseek_tiny" else 0)  # MLA's scores: [q_C, q_R] . [k_C, k_R]
    square = cfg.n_layers * 2 * cfg.n_heads * (key_dims + cfg.value_dim) * (T - CAUSAL)
    counted = counter.get_total_flops() / tokens.numel()
    assert counted == pytest.approx(model.flops_per_token(T, training=False) + square, rel=1e-12)
