"""The model's components against the chapter's worked numbers, their reference
implementations (torch.nn.RMSNorm, transformers' LlamaForCausalLM) and their invariants."""
import dataclasses
import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from pytest import approx
from transformers import LlamaConfig, LlamaForCausalLM

from interop.hf import hf_config, hf_state_dict
from errors import ConfigError
from model import ModelConfig, Transformer
from model.attention import Attention
from model.config import FFNS, NORM_POSITIONS, NORMS, POSITIONS, QK_NORMS
from model.ffn import FeedForward
from model.norms import RMSNorm, RMSNormFunction, make_norm
from model.positions import Rotary
from training.evaluate import next_token_loss
from weights import far_from_init, ffn_settings

KV_HEADS = (4, 2, 1)  # of n_heads = 4: one K/V head per query head (MHA), two groups (GQA), one shared head (MQA)
COMBINATIONS = list(itertools.product(NORMS, NORM_POSITIONS, POSITIONS, KV_HEADS, FFNS, QK_NORMS))


def tiny_model(norm, norm_position, position, n_kv_heads, ffn, qk_norm="none") -> Transformer:
    return Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                                   context_length=16, norm=norm, norm_position=norm_position, position=position,
                                   ffn=ffn, qk_norm=qk_norm, **ffn_settings(ffn)))


# --- the chapter's worked numbers ---------------------------------------------------------

def test_rmsnorm_worked_example():
    y = make_norm("rmsnorm", 4, eps=1e-5)(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    # rms = sqrt((1 + 4 + 9 + 16) / 4) = sqrt(7.5) = 2.739
    assert y.tolist() == approx([0.365, 0.730, 1.095, 1.460], abs=1e-3)


def test_layernorm_worked_example():
    y = make_norm("layernorm", 4, eps=1e-5)(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    # mean 2.5, variance 1.25, std 1.118
    assert y.tolist() == approx([-1.34, -0.45, 0.45, 1.34], abs=5e-3)


def test_rope_worked_example_at_45_degrees():
    # With head_dim 2 the only frequency is base^0 = 1 radian per position, whatever the base.
    # With head_dim 4 the half-split layout pairs dims (0, 2) at 1 rad and dims (1, 3) at
    # base^(-1/2) rad per position; base = (4/pi)^2 makes the latter pi/4 = 45 degrees.
    # The chapter's q = k = [1, 0] is put in that pair, so the module's own tables do the turning.
    rotary = Rotary(head_dim=4, max_len=3, base=(4 / math.pi) ** 2)
    x = torch.tensor([0.0, 1.0, 0.0, 0.0]).expand(1, 1, 3, 4)  # the same vector at positions 0, 1, 2
    rotated = rotary(x, start=0)[0, 0]
    assert rotated[1].tolist() == approx([0, math.cos(math.pi / 4), 0, math.sin(math.pi / 4)], abs=1e-6)

    def score(m, n):
        return (rotated[m] @ rotated[n]).item()

    assert score(1, 0) == approx(0.707, abs=1e-3)
    assert score(2, 1) == approx(0.707, abs=1e-3)
    assert score(2, 0) == approx(0.0, abs=1e-6)


def test_swiglu_worked_example():
    ffn = FeedForward(d_model=1, d_ff=1, kind="swiglu", bias=False)
    with torch.no_grad():
        ffn.w_in.weight.copy_(torch.tensor([[1.5], [0.8]]))  # rows [W1; W3]
        ffn.w_out.weight.copy_(torch.tensor([[1.2]]))  # W2
    # SiLU(1.5) = 1.5 * sigmoid(1.5) = 1.226;  1.226 * 0.8 * 1.2 = 1.178
    assert ffn(torch.tensor([[1.0]])).item() == approx(1.178, abs=1e-3)


def test_relu2_worked_example():
    ffn = FeedForward(d_model=1, d_ff=2, kind="relu2", bias=False)
    with torch.no_grad():
        ffn.w_in.weight.copy_(torch.tensor([[1.5], [-0.5]]))  # W1: two hidden units
        ffn.w_out.weight.copy_(torch.tensor([[1.2, 3.0]]))  # W2
    # ReLU(1.5)^2 = 2.25 and ReLU(-0.5)^2 = 0;  2.25 * 1.2 + 0 * 3.0 = 2.7; at x = -1 the other unit: 0.25 * 3 = 0.75
    assert ffn(torch.tensor([[1.0], [-1.0]])).flatten().tolist() == approx([2.7, 0.75], abs=1e-6)
    assert ModelConfig(vocab_size=8, ffn="relu2").ffn_width == 4 * 128  # ungated, as ReLU


def test_rmsnorm_backward_equals_finite_differences_and_autograd():
    """RMSNorm's hand-written backward: gradcheck in float64 (against finite differences), and at llama_tiny's
    width the gradients of torch's own RMSNorm through autograd, in float64 (the sums run in another order,
    ~1e-16 relative apart, so no CPU's kernels decide the outcome)."""
    generator = torch.Generator().manual_seed(0)

    def draw(*shape, dtype=torch.float64):
        return torch.randn(*shape, dtype=dtype, generator=generator).requires_grad_()

    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-5), (draw(2, 3, 16), draw(16)))
    # QK-norm's input: heads [B, H, T, D], a transposed, non-contiguous view of the projection's [B, T, H, D]
    heads = draw(2, 5, 3, 8).transpose(1, 2)
    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-5), (heads, draw(8)))

    x, grad = draw(4, 32, 128), torch.randn(4, 32, 128, generator=generator, dtype=torch.float64)
    ours, reference = far_from_init(RMSNorm(128)).double(), torch.nn.RMSNorm(128, eps=1e-5).double()
    with torch.no_grad():
        reference.weight.copy_(ours.weight)
    expected = torch.autograd.grad(reference(x), (x, reference.weight), grad)
    y = ours(x)
    assert type(y.grad_fn).__name__ == "RMSNormFunctionBackward"  # training takes the written-out backward
    for got, want in zip(torch.autograd.grad(y, (x, ours.weight), grad), expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # inference takes F.rms_norm: the same values (rounding apart)
        torch.testing.assert_close(ours(x), y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d_model", [96, 256, 384])
def test_swiglu_at_8_3_d_has_the_parameters_of_relu_at_4_d(d_model):
    def ffn_params(kind):
        cfg = ModelConfig(vocab_size=8, d_model=d_model, n_heads=8, ffn=kind, ffn_multiple_of=32)
        return sum(p.numel() for p in FeedForward(d_model, cfg.ffn_width, kind, bias=False).parameters())

    relu, swiglu = ffn_params("relu"), ffn_params("swiglu")
    assert relu == 8 * d_model ** 2
    # d_ff = 8/3 d rounded up to a multiple of 32 adds under 32 hidden units, each d_model * 3 weights
    assert 0 <= swiglu - relu < 3 * d_model * 32
    if 8 * d_model % (3 * 32) == 0:  # 8/3 d is already a multiple: no rounding at all
        assert swiglu == relu


def test_model_d_ff_sets_the_width_of_every_ffn_and_null_keeps_the_rule():
    for ffn, rule in (("swiglu", 352), ("relu", 512), ("relu2", 512)):
        assert ModelConfig(vocab_size=8, ffn=ffn).ffn_width == rule
        cfg = ModelConfig(vocab_size=8, ffn=ffn, d_ff=293)
        w_in, w_out = Transformer(cfg).blocks[0].ffn.w_in, Transformer(cfg).blocks[0].ffn.w_out
        assert w_in.weight.shape == ((2 if ffn == "swiglu" else 1) * 293, 128) and w_out.weight.shape == (128, 293)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(ConfigError, match=rf"^model.d_ff={bad!r} must be a positive integer, or null"):
            ModelConfig(vocab_size=8, d_ff=bad)


# --- components against references and invariants -----------------------------------------

def test_rmsnorm_equals_torch_rmsnorm():
    torch.manual_seed(0)
    ours, reference = far_from_init(RMSNorm(48, eps=1e-5)).double(), torch.nn.RMSNorm(48, eps=1e-5).double()
    with torch.no_grad():
        reference.weight.copy_(ours.weight)
    x = 3 * torch.randn(2, 5, 48, dtype=torch.float64)
    # the same arithmetic through other kernels, in float64: ~1e-16 relative apart on any CPU
    torch.testing.assert_close(ours(x), reference(x), rtol=1e-12, atol=1e-12)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rotary = Rotary(head_dim=16, max_len=64)
    q, k = torch.randn(2, 1, 1, 1, 16).unbind(0)  # one token each: [batch, heads, seq, D]

    def score(m, n):
        return (rotary(q, start=m) * rotary(k, start=n)).sum().item()

    for m, n in [(5, 2), (2, 5), (9, 9)]:
        for shift in (1, 7, 40):
            assert score(m + shift, n + shift) == approx(score(m, n), abs=1e-5), (m, n, shift)
    # ...and do depend on it: distances 0 and 1 differ by a full unit here
    assert abs(score(3, 3) - score(4, 3)) > 1.0


@pytest.mark.parametrize("n_kv_heads", [1, 2])
@pytest.mark.parametrize("rope", [True, False])
def test_gqa_equals_mha_with_repeated_kv_heads(n_kv_heads, rope):
    torch.manual_seed(0)
    d_model, n_heads, seq = 32, 4, 7
    head_dim, group = d_model // n_heads, n_heads // n_kv_heads
    rotary = Rotary(head_dim, max_len=seq) if rope else None
    gqa = Attention(d_model, n_heads, n_kv_heads, bias=False, dropout=0.0, rotary=rotary, qk_norm=None)
    mha = Attention(d_model, n_heads, n_heads, bias=False, dropout=0.0, rotary=rotary, qk_norm=None)
    wq, wk, wv = gqa.qkv.weight.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim])

    def repeat_heads(w):  # K/V head j serves query heads j * group ... (j + 1) * group - 1
        return w.view(n_kv_heads, head_dim, d_model).repeat_interleave(group, dim=0).reshape(-1, d_model)

    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, repeat_heads(wk), repeat_heads(wv)]))
        mha.out.weight.copy_(gqa.out.weight)
    x = torch.randn(2, seq, d_model, dtype=torch.float64)
    # float64: the two sum in other orders, ~1e-16 relative, so no CPU's kernels decide the outcome
    torch.testing.assert_close(gqa.double()(x), mha.double()(x), rtol=1e-12, atol=1e-12)


def test_causal_for_every_combination():
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 12))
    later = tokens.clone()
    later[:, 6:] = (later[:, 6:] + 1) % 64  # change every token from position 6 on
    for combination in COMBINATIONS:
        model = tiny_model(*combination).double().eval()
        with torch.no_grad():
            before, after = model(tokens), model(later)
        # float64: two sequence lengths run through other kernels, ~1e-16 relative apart
        torch.testing.assert_close(after[:, :6], before[:, :6], rtol=1e-12, atol=1e-12,
                                   msg=lambda m: f"{combination}: {m}")
        assert not torch.allclose(after[:, 6], before[:, 6]), combination


def test_every_combination_runs_forward_and_backward():
    assert len(COMBINATIONS) == 2 * 2 * 4 * 3 * 5 * 2
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 9))
    for combination in COMBINATIONS:
        model = tiny_model(*combination)
        logits = model(tokens[:, :-1])
        assert logits.shape == (2, 8, 64), combination
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        for name, p in model.named_parameters():
            # every parameter is used, and its gradient is finite
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, \
                f"{combination}: {name}"


def test_compiled_training_step_equals_eager():
    """train.compile=true compiles train.py's loss (next_token_loss: the forward and the cross-entropy) in
    one graph (fullgraph: anything it cannot trace, such as an out= into a view in a written-out backward,
    fails here instead of falling back to eager unseen); the loss and every gradient stay the eager ones
    (LLaMA's switches; the 2017 ones were compiled by hand). In float64, where the fused kernels' other
    order of summation moves results by ~1e-16 relative, so no CPU's vector width decides the outcome."""
    torch.manual_seed(0)
    eager = tiny_model("rmsnorm", "pre", "rope", 2, "swiglu").double()
    twin = tiny_model("rmsnorm", "pre", "rope", 2, "swiglu").double()
    twin.load_state_dict(eager.state_dict())
    tokens = torch.randint(0, 64, (4, 17))
    x, y = tokens[:, :-1], tokens[:, 1:]
    losses = [next_token_loss(eager, x, y), torch.compile(next_token_loss, fullgraph=True)(twin, x, y)]
    assert losses[1].dtype == torch.float64
    for loss in losses:
        loss.backward()
    assert losses[1].item() == approx(losses[0].item(), rel=1e-12)
    for (name, p), q in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("sizes, message", [
    (dict(d_model=30, n_heads=4), "model.n_heads=4 must divide model.d_model=30"),
    (dict(n_heads=4, n_kv_heads=3), "model.n_kv_heads=3 must divide model.n_heads=4"),
    (dict(d_model=12, n_heads=4, n_kv_heads=2, position="rope"),
     "model.position=rope needs an even head dim, but model.d_model=12 / model.n_heads=4 = 3"),
    (dict(d_model=0), "model.d_model=0 must be a positive integer"),
    (dict(n_layers=-1), "model.n_layers=-1 must be a positive integer"),
    (dict(n_heads=0), "model.n_heads=0 must be a positive integer"),
    (dict(n_kv_heads=0), "model.n_kv_heads=0 must be a positive integer"),
    (dict(context_length=0), "model.context_length=0 must be a positive integer"),
    (dict(vocab_size=0), "model.vocab_size=0 must be a positive integer"),
])
def test_invalid_config_raises_one_line_naming_keys_and_values(sizes, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        ModelConfig(**(dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2) | sizes))
    assert "\n" not in str(error.value)


def test_odd_head_dim_is_fine_without_rope():
    cfg = ModelConfig(vocab_size=64, d_model=12, n_heads=4, n_kv_heads=2, position="sinusoidal")
    assert cfg.head_dim == 3


# --- parity with transformers' LLaMA ----------------------------------------------------------

@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("tie_embeddings", [True, False])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_logits_equal_transformers_llama(n_kv_heads, tie_embeddings, attn_implementation):
    torch.manual_seed(0)
    # a non-default rope base and eps, so a mapping that drops either one fails
    cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, context_length=24,
                      rope_base=500.0, norm_eps=1e-4, tie_embeddings=tie_embeddings)
    ours = far_from_init(Transformer(cfg))
    theirs = LlamaForCausalLM(LlamaConfig(**hf_config(cfg), attn_implementation=attn_implementation)).eval()
    missing, unexpected = theirs.load_state_dict(hf_state_dict(ours), strict=False)
    assert (missing, unexpected) == (["lm_head.weight"] if tie_embeddings else [], [])  # a tied head is re-tied
    assert (theirs.lm_head.weight is theirs.model.embed_tokens.weight) == tie_embeddings

    for seq in (1, 7, cfg.context_length):
        tokens = torch.randint(0, cfg.vocab_size, (2, seq))
        with torch.no_grad():
            logits, expected = ours(tokens), theirs(tokens).logits
        assert expected.std() > 0.5  # the tolerance below is small relative to the logits
        assert (logits - expected).abs().max().item() <= 1e-5, seq


@pytest.mark.parametrize("cap", [0.1, 0.2])  # below the largest logit of this model at init, ~0.3
def test_the_logit_softcap_bounds_the_logits_keeps_their_order_and_leaves_small_ones_alone(cap):
    """model.logit_softcap=c on the same weights, in float64: every logit inside (-c, c); the order of each position's
    logits (so greedy text) kept; and a logit z within |z|^3 / (3 c^2) of its uncapped value (tanh's series)."""
    torch.manual_seed(0)
    plain = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                    context_length=16)).double()
    capped = Transformer(dataclasses.replace(plain.cfg, logit_softcap=cap)).double()
    capped.load_state_dict(plain.state_dict())
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        z, bounded = plain(tokens), capped(tokens)
    assert z.abs().max() > cap > bounded.abs().max()  # some logit was past the cap
    assert torch.equal(z.argsort(dim=-1), bounded.argsort(dim=-1))
    assert ((bounded - z).abs() <= z.abs() ** 3 / (3 * cap ** 2) + 1e-15).all()


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), True])
def test_a_logit_softcap_that_is_not_a_positive_number_is_refused(cap):
    with pytest.raises(ConfigError, match=rf"model.logit_softcap={cap!r} must be a positive number, or null for none"):
        ModelConfig(logit_softcap=cap)


def test_a_logit_softcap_too_small_to_learn_with_is_refused():
    """The best logits a cap c allows (+c on the answer, -c elsewhere) leave the loss within 2c of ln V: 0.00197 nats
    below ln 64 at the floor, 1e-3; at 1e-30 float32's softmax is exactly uniform. 1e-30 and 1e-50 are refused."""
    def best_loss(cap: float) -> float:
        logits = torch.full((1, 64), -cap)
        logits[0, 0] = cap
        return F.cross_entropy(logits, torch.tensor([0])).item()
    assert math.log(64) - 2e-3 < best_loss(1e-3) == approx(math.log(64) - 0.00197, abs=1e-5)
    assert best_loss(1e-30) == torch.tensor(math.log(64)).item()
    for cap in (1e-30, 1e-50, 9e-4):
        with pytest.raises(ConfigError) as refused:
            ModelConfig(logit_softcap=cap)
        assert str(refused.value) == (f"model.logit_softcap={cap} must be at least 0.001: the capped logits lie within "
                                      f"+-{cap}, so the loss can fall at most {2 * cap:g} nats below its untrained ln "
                                      f"vocab_size and the model learns nothing (Gemma 2 caps at 30, modded-nanogpt's "
                                      f"records at 15 to 30)")
    assert ModelConfig(logit_softcap=1e-3).logit_softcap == 1e-3
