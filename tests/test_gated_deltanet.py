"""Gated DeltaNet (model/gated_deltanet.py), the state cache (model/kv_cache.py's StateCache) and the attention
switches of its hybrids (model/attention.py's output gate and partial RoPE): the chunked and recurrent forms against
a naive recurrence in float64, causality, cached generation against recomputation past the context, the cache's
bytes at any length, and the settings refused."""
import math

import pytest
import torch

from data_helpers import train_in_process
from errors import ConfigError
from generation.engine import Engine
from insight.attention import attention_inputs, attention_maps
from interop_helpers import one_error_line
from model import ModelConfig, Transformer
from model.attention import Attention
from model.gated_deltanet import GatedDeltaNet, chunked_delta_rule, recurrent_delta_rule
from settings import compose_config
from training.config import model_config
from weights import far_from_init

TINY = dict(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, context_length=16)


def linear_model(pattern: str, seed: int = 0, **settings) -> Transformer:
    """A 4-layer model with model.linear_pattern=pattern, far from init in float64, its gates fading slowly (A in
    [0.02, 0.2]) so that the state carries a prompt's first tokens to its last ones."""
    position = "none" if pattern == "all" else "rope"
    cfg = ModelConfig(**TINY | dict(linear_pattern=pattern, position=position, linear_key_heads=2,
                                    linear_value_heads=4, linear_head_dim=8, linear_chunk=4) | settings)
    model = far_from_init(Transformer(cfg), seed).double()
    with torch.no_grad():
        for block in model.blocks:
            if isinstance(block.attn, GatedDeltaNet):
                block.attn.A_log.copy_(torch.linspace(0.02, 0.2, block.attn.value_heads).log())
    return model


def naive_delta_rule(q, k, v, log_decay, beta, state):
    """The issue's recurrence as written, S [d_v, d_k]: S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t
    k_t^T, o_t = S_t q_t, one (batch, head) at a time with explicit matrices; beta None: S_t = alpha_t S_{t-1} + v_t
    k_t^T (gated linear attention). state: [B, H, d_k, d_v] (the layer's orientation), transposed in and out."""
    B, H, T, d_k = k.shape
    out = torch.zeros(*v.shape, dtype=v.dtype)
    final = torch.zeros_like(state)
    for b in range(B):
        for h in range(H):
            S = state[b, h].T.clone()
            for t in range(T):
                k_t, v_t = k[b, h, t][:, None], v[b, h, t][:, None]
                alpha = log_decay[b, h, t].exp()
                if beta is None:
                    S = alpha * S + v_t @ k_t.T
                else:
                    S = alpha * S @ (torch.eye(d_k, dtype=S.dtype) - beta[b, h, t] * k_t @ k_t.T) + \
                        beta[b, h, t] * v_t @ k_t.T
                out[b, h, t] = S @ q[b, h, t]
            final[b, h] = S.T
    return out, final


def random_inputs(T: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    B, H, d_k, d_v = 2, 3, 5, 4
    normal = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    q, k = (torch.nn.functional.normalize(normal(B, H, T, d_k), dim=-1) for _ in range(2))
    log_decay = -torch.rand(B, H, T, generator=generator, dtype=torch.float64)  # alpha in [e^-1, 1]
    beta = torch.rand(B, H, T, generator=generator, dtype=torch.float64)
    return q / math.sqrt(d_k), k, normal(B, H, T, d_v), log_decay, beta, normal(B, H, d_k, d_v)


@pytest.mark.parametrize("delta_rule", [True, False], ids=["delta_rule", "gated_linear"])
@pytest.mark.parametrize("T, chunk", [(1, 4), (7, 4), (8, 4), (13, 16), (12, 1)])
def test_the_chunked_and_recurrent_forms_are_the_naive_recurrence(T, chunk, delta_rule):
    """From a state of its own (a prefill after earlier tokens), at chunk sizes that do and do not divide T; with the
    delta rule and without it (model.linear_delta_rule=false)."""
    q, k, v, log_decay, beta, state = random_inputs(T, seed=T)
    beta = beta if delta_rule else None
    expected, expected_state = naive_delta_rule(q, k, v, log_decay, beta, state)
    for out, final in (recurrent_delta_rule(q, k, v, log_decay, beta, state),
                       chunked_delta_rule(q, k, v, log_decay, beta, state, chunk)):
        assert (out - expected).abs().max() < 1e-10 and (final - expected_state).abs().max() < 1e-10
    assert expected.abs().max() > 0.1  # the outputs are not all near zero


@pytest.mark.parametrize("pattern", ["all", "3:1"])
def test_a_change_at_position_t_changes_nothing_before_t(pattern):
    model = linear_model(pattern)
    tokens = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 64
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert (before[:, :6] - after[:, :6]).abs().max() < 1e-12
    assert (before[:, 6:] - after[:, 6:]).abs().max() > 1e-3


def recomputed_greedy(model: Transformer, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy tokens from a forward over the whole sequence at every step: no cache, no window."""
    tokens = prompts
    with torch.no_grad():
        for _ in range(new_tokens):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prompts.shape[1]:]


def test_an_all_linear_model_generates_past_its_context_from_its_state_alone():
    """Three prompts, 30 new tokens past a context of 16: each step one token into the state, nothing re-prefilled,
    the same tokens as a forward over the whole sequence."""
    model = linear_model("all")
    prompts = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(2))
    engine = Engine(model)
    cached = torch.stack(list(engine.generate(prompts.tolist(), 30, temperature=0)), dim=1)
    assert engine.stats.policy == "rolling" and engine.stats.prompt_tokens == 15
    assert torch.equal(cached, recomputed_greedy(model, prompts, 30))
    assert len(set(cached[0].tolist())) > 3  # not one token over and over


def test_a_hybrid_generates_from_its_cache_as_recomputation_does_within_and_past_its_context():
    """The 3:1 hybrid: cached greedy tokens equal the uncached engine's within the context, and past it, where both
    slide the same window (the re-prefill starts each linear layer's state anew, at position 0)."""
    model = linear_model("3:1", seed=3)
    prompts = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(4)).tolist()
    engine = Engine(model)
    cached = torch.stack(list(engine.generate(prompts, 25, temperature=0)), dim=1)
    assert engine.stats.policy == "sliding"
    uncached = torch.stack(list(engine.generate(prompts, 25, temperature=0, use_cache=False)), dim=1)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :10], recomputed_greedy(model, torch.tensor(prompts), 10))


def test_samples_of_one_prompt_share_its_prefilled_state():
    model = linear_model("all", seed=5)
    engine = Engine(model)
    twice = torch.stack(list(engine.generate([[1, 2, 3]], 6, temperature=0, num_samples=2)), dim=1)
    once = torch.stack(list(engine.generate([[1, 2, 3]], 6, temperature=0)), dim=1)
    assert torch.equal(twice, once.expand(2, -1))


def test_the_state_cache_is_the_same_size_at_any_length():
    """All-linear: the same bytes at 128 and 8,192 positions, as allocated; the 3:1 hybrid's grow a quarter as fast
    as full attention's, its one attention layer in four."""
    linear, hybrid = linear_model("all"), linear_model("3:1")
    full = Transformer(ModelConfig(**TINY)).double()
    assert linear.kv_cache_bytes(128) == linear.kv_cache_bytes(8192)
    assert linear.kv_cache_bytes(8192, dtype=torch.float64) == linear.new_kv_cache(1, 8192).nbytes  # a float64 model
    # per linear layer: the state 4 x 8 x 8 and the conv's last 3 inputs of (2 x 2 + 4) x 8 channels, float32
    assert linear.kv_cache_bytes(128) == 4 * (4 * 8 * 8 + 64 * 3) * 4
    growth = {name: m.kv_cache_bytes(8192) - m.kv_cache_bytes(128) for name, m in (("hybrid", hybrid), ("full", full))}
    assert growth["hybrid"] * 4 == growth["full"]
    assert hybrid.kv_cache_bytes(100, batch=2, dtype=torch.float64) == hybrid.new_kv_cache(2, 100).nbytes


def test_the_gate_and_partial_rope_are_their_formulas():
    """model.attention_gate: the attention's output times sigmoid(x W_g) before W_o; model.rotary_fraction=0.25: the
    first quarter of each q and k head turns with the position, the rest does not."""
    cfg = ModelConfig(**TINY | dict(n_heads=2, n_kv_heads=1, attention_gate=True, rotary_fraction=0.25))
    attn = far_from_init(Transformer(cfg)).double().blocks[0].attn
    x = torch.randn(1, 5, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    q, k, v = attn.heads(x)
    y = torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), is_causal=True)
    expected = attn.out(y.transpose(1, 2).flatten(2) * torch.sigmoid(x @ attn.gate.weight.T))
    assert (attn(x) - expected).abs().max() < 1e-12
    (q0, k0, _), (q9, k9, _) = attn.heads(x, 0), attn.heads(x, 9)
    assert attn.rotary.head_dim == 4
    assert torch.equal(q0[..., 4:], q9[..., 4:]) and torch.equal(k0[..., 4:], k9[..., 4:])
    assert (q0[..., :4] - q9[..., :4]).abs().max() > 0.1


@pytest.mark.parametrize("settings, message", [
    (dict(linear_pattern="2:2"), "model.linear_pattern='2:2' must be all, alternate or N:1 (N linear layers"),
    (dict(linear_pattern="all"), "model.position=rope with model.linear_pattern=all: no layer is attention"),
    # the advice undoes the setting named, not position=none, which is in place
    (dict(linear_pattern="all", position="none", attention_gate=True), "model.attention_gate=True with model."
     "linear_pattern=all: no layer is attention, so it would change nothing (the linear layers read order from their "
     "conv and gate, and L2-normalise q and k themselves); use model.attention_gate=false, or a hybrid pattern such as "
     "model.linear_pattern=3:1"),
    (dict(linear_pattern="all", position="none", qk_norm="rmsnorm"), "; use qk_norm=none, or a hybrid pattern"),
    # N:1 or alternate on fewer layers than reach its first attention layer: every layer linear, which only all says
    (dict(n_layers=3, linear_pattern="3:1", attention_gate=True), "model.n_layers=3 with model.linear_pattern=3:1 "
     "makes every layer linear (its first attention layer is layer 3, counting from 0); use model.n_layers>=4, or "
     "model.linear_pattern=all for an all-linear model"),
    (dict(n_layers=1, linear_pattern="alternate"), "model.n_layers=1 with model.linear_pattern=alternate makes every "
                                                   "layer linear (its first attention layer is layer 1, counting from "
                                                   "0); use model.n_layers>=2"),
    (dict(linear_pattern="3:1", linear_key_heads=2, linear_value_heads=3), "model.linear_value_heads=3 must be a "
                                                                          "multiple of model.linear_key_heads=2"),
    (dict(linear_pattern="3:1", window=4), "model.window=4 with model.linear_pattern=3:1: the hybrid's attention"),
    (dict(linear_pattern="3:1", linear_conv=1), "model.linear_conv=1 must be at least 2"),
    (dict(linear_head_dim=8), "model.linear_head_dim=8 is a setting of attention=gated_deltanet"),
    (dict(linear_delta_rule=False), "model.linear_delta_rule=False is a setting of attention=gated_deltanet"),
    (dict(rotary_fraction=0.3), "model.rotary_fraction=0.3 turns 2.4 of each head's 8 dims"),
    (dict(rotary_fraction=0.5, position="none"), "model.rotary_fraction=0.5 is RoPE's share of each head, but"),
    (dict(kv_rank=8, n_kv_heads=4, attention_gate=True), "model.attention_gate=true with attention=mla")])
def test_settings_that_cannot_be_are_refused_with_their_reason(settings, message):
    with pytest.raises(ConfigError) as error:
        Transformer(ModelConfig(**TINY | settings))
    assert message in str(error.value)


def test_qwen35_tiny_shrunk_below_its_first_attention_layer_is_refused(workdir, tiny, monkeypatch, capsys):
    """model=qwen35_tiny at 2 layers: 3:1 makes both linear, where its attention layer's gate, QK-norm and RoPE would
    change nothing. Composed, one line naming the depth; through train.py, one line, exit 2, nothing written."""
    with pytest.raises(ConfigError) as refused:
        model_config(compose_config(["model=qwen35_tiny", "model.n_layers=2"]))
    assert str(refused.value) == ("model.n_layers=2 with model.linear_pattern=3:1 makes every layer linear (its first "
                                  "attention layer is layer 3, counting from 0); use model.n_layers>=4, or "
                                  "model.linear_pattern=all for an all-linear model")
    assert model_config(compose_config(["model=qwen35_tiny", "model.n_layers=4"])).linear_layers == [
        True, True, True, False]
    run_dir = workdir / "refused-shrunk"
    capsys.readouterr()
    assert train_in_process(run_dir, [*tiny, "model=qwen35_tiny"], monkeypatch) == 2  # tiny's 1 layer
    assert one_error_line(capsys).startswith("error: model.n_layers=1 with model.linear_pattern=3:1 makes every layer "
                                             "linear")
    assert not any(run_dir.rglob("*"))


def test_without_the_delta_rule_a_layer_has_no_beta_and_still_caches_its_state():
    """model.linear_delta_rule=false: no W_b; cached greedy text equals recomputation past the context, as with it."""
    model = linear_model("all", linear_delta_rule=False)
    assert all(block.attn.beta_proj is None for block in model.blocks)
    prompts = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(7))
    cached = torch.stack(list(Engine(model).generate(prompts.tolist(), 20, temperature=0)), dim=1)
    assert torch.equal(cached, recomputed_greedy(model, prompts, 20))


def test_each_layer_counts_its_own_flops():
    """A linear layer's forward FLOPs do not grow with the length; the hybrid's attention layer's do."""
    hybrid = linear_model("3:1", attention_gate=True)
    cfg = hybrid.cfg
    assert GatedDeltaNet.flops_per_token(cfg, 0, 16) == GatedDeltaNet.flops_per_token(cfg, 0, 4096)
    # W_qkv 32 x 64, W_a and W_b 32 x 4 each, W_z 32 x 32, W_o 32 x 32, the conv 4 taps x 64, the state 3 x 4 x 8 x 8
    assert GatedDeltaNet.flops_per_token(cfg, 0, 16) == 2 * (32 * 64 + 32 * 8 + 32 * 32 + 32 * 32 + 4 * 64 + 3 * 256)
    assert Attention.flops_per_token(cfg, 3, 4096) > Attention.flops_per_token(cfg, 3, 16)
    assert hybrid.flops_per_token(16, training=False) == sum(
        type(b.attn).flops_per_token(cfg, i, 16) + b.ffn.flops_per_token(cfg, i, 16)
        for i, b in enumerate(hybrid.blocks)) + 2 * 32 * 64


def test_the_reports_map_of_a_linear_layer_is_what_its_state_reads_without_the_delta_rule():
    """insight's attention maps (Mixer.weights) of a hybrid: a linear layer's is its gate-faded q . k, so that without
    the delta rule's correction (gated linear attention) the map times v is the recurrence's own output o; it has no
    softmax (no entropy), and the attention layer's rows are a softmax's."""
    cfg = ModelConfig(**TINY | dict(linear_pattern="3:1", linear_delta_rule=False, position="none"))
    torch.manual_seed(0)
    model = far_from_init(Transformer(cfg)).double().eval()
    tokens = torch.randint(64, (1, 12), generator=torch.Generator().manual_seed(1))
    maps = attention_maps(model, tokens)
    assert maps["softmax"] == [False, False, False, True]
    assert maps["entropy"][0] == [None] * 4 and all(e is not None for e in maps["entropy"][3])
    x, _ = attention_inputs(model, tokens)[0]
    attn = model.blocks[0].attn
    with torch.no_grad():
        q, k, v, log_decay, beta, _ = attn.projections(x)
        o, _ = recurrent_delta_rule(q, k, v, log_decay, beta, q.new_zeros(1, 4, 8, 8))
    assert beta is None
    assert (torch.tensor(maps["weights"][0], dtype=torch.float64) @ v[0] - o[0]).abs().max() < 1e-12
    assert torch.tensor(maps["weights"][3]).sum(-1).sub(1).abs().max() < 1e-6  # the attention layer's rows
