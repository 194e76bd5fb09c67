"""Sliding-window attention and sinks (model/attention.py) and the rolling cache (model/kv_cache.py): the band and
the sink against their direct formulas in float64, cached decoding against recomputation well past the window for
every pattern, with and without sinks, the cache's bytes against the formula, and the settings refused."""
import math

import pytest
import torch

from errors import ConfigError
from model import ModelConfig, Transformer
from insight.attention import cache_by_kv_heads
from model.attention import Attention, attention_weights
from weights import far_from_init

PATTERNS = [("all", False), ("all", True), ("alternate", False), ("alternate", True), ("2:1", False),
            (None, True)]  # (None: full attention) with sinks alone


def windowed_model(pattern: str | None, sinks: bool, seed: int = 0, **settings) -> Transformer:
    """A 3-layer model of window 5, its weights (sinks included) far from init, in float64."""
    cfg = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, context_length=32, sinks=sinks)
    if pattern is not None:
        cfg |= dict(window=5, window_pattern=pattern)
    model = far_from_init(Transformer(ModelConfig(**cfg | settings)), seed).double()
    with torch.no_grad():  # sinks of both signs and a few units: ones that take a visible share of the weight
        for block in model.blocks:
            if block.attn.sinks is not None:
                block.attn.sinks.copy_(torch.linspace(-2, 3, block.attn.n_heads))
    return model


def direct_attention(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """The formula of model/attention.py written out: scores, the band (or causal) mask, the sink's column, the
    softmax, the weights on the values alone, the output projection. float64."""
    q, k, v = attn.heads(x)
    T, group = x.shape[1], attn.n_heads // attn.n_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = (s <= t) & ((s > t - attn.window) if attn.window is not None else True)
    scores = scores.masked_fill(~visible, -math.inf)
    if attn.sinks is not None:
        scores = torch.cat([scores, attn.sinks.view(1, -1, 1, 1).expand(*scores.shape[:3], 1)], dim=-1)
    weights = scores.softmax(dim=-1)[..., :T]
    return attn.out((weights @ v).transpose(1, 2).reshape(x.shape))


@pytest.mark.parametrize("pattern, sinks", PATTERNS)
def test_each_layer_is_its_direct_formula(pattern, sinks):
    """Each layer's attention over 14 positions (nearly 3 windows), as forward's sdpa computes it (a bool band, the
    sink as one more key) and as the formula reads, in float64: the same to 1e-12 (sums in another order, ~1e-16
    of outputs of order 1). The local layers are the pattern's."""
    model = windowed_model(pattern, sinks)
    torch.manual_seed(1)
    x = torch.randn(2, 14, 32, dtype=torch.float64)
    windows = [block.attn.window for block in model.blocks]
    assert windows == {"all": [5, 5, 5], "alternate": [5, None, 5], "2:1": [5, 5, None], None: [None] * 3}[pattern]
    for block in model.blocks:
        torch.testing.assert_close(block.attn(x), direct_attention(block.attn, x), rtol=1e-12, atol=1e-12)


def test_a_sink_takes_weight_and_gives_nothing():
    """A sink logit far above every score takes nearly all the weight: the output is the output projection of
    nearly 0 (its bias-free projection of 0 is 0). Far below every score the sink is gone: plain attention."""
    model = windowed_model("all", sinks=True)
    attn = model.blocks[0].attn
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    with torch.no_grad():
        attn.sinks.fill_(60.0)
        assert attn(x).abs().max() < 1e-15
        attn.sinks.fill_(-60.0)  # e^-60 ~ 1e-26 of the weight
        reference = windowed_model("all", sinks=False).blocks[0].attn
        reference.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "sinks"})
        torch.testing.assert_close(attn(x), reference(x), rtol=1e-12, atol=1e-12)


def test_sinks_learn():
    """The sink logits get a gradient (through sdpa's extra query dimension) equal to the direct formula's."""
    model = windowed_model("alternate", sinks=True)
    attn = model.blocks[1].attn
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    (attn(x) ** 2).sum().backward()
    through_sdpa = attn.sinks.grad.clone()
    attn.sinks.grad = None
    (direct_attention(attn, x) ** 2).sum().backward()
    assert through_sdpa.abs().min() > 1e-6  # every head's sink moves
    torch.testing.assert_close(through_sdpa, attn.sinks.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("prompt", [3, 12])
@pytest.mark.parametrize("pattern, sinks", PATTERNS)
def test_cached_decoding_equals_recomputation_past_the_window(pattern, sinks, prompt):
    """A prompt (shorter than the window of 5, or more than two windows), then one token at a time to 30
    positions: every step's logits equal those of one forward over the whole sequence, in float64, to 1e-10.
    The local layers hold 5 slots, written at position mod 5, and the prefill of 12 wraps them."""
    model = windowed_model(pattern, sinks)
    tokens = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_kv_cache(2, 30)
        steps = [model(tokens[:, :prompt], 0, cache)]
        steps += [model(tokens[:, t:t + 1], t, cache) for t in range(prompt, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    local = [block.attn.window is not None for block in model.blocks]
    assert [layer.keys.shape[2] for layer in cache.layers] == [5 if is_local else 30 for is_local in local]


def test_a_chunk_after_a_wrapped_window_sees_the_right_keys():
    """Chunks of 4 after a prompt of 7 (each chunk gathers the buffer's last positions and its own): the same
    logits as one forward, in float64."""
    model = windowed_model("all", sinks=True)
    tokens = torch.randint(0, 64, (1, 27), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_kv_cache(1, 27)
        steps = [model(tokens[:, :7], 0, cache)] + [model(tokens[:, t:t + 4], t, cache) for t in range(7, 27, 4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pattern, local", [("all", 3), ("alternate", 2), ("2:1", 2), ("5:1", 3)])
def test_the_cache_holds_the_window_in_local_layers(pattern, local):
    """The bytes allocated are the formula's: local layers min(window, positions), the others every position."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                                    context_length=32, window=5, window_pattern=pattern))
    for positions in (4, 20):
        cache = model.new_kv_cache(2, positions)
        full_layer = 2 * 2 * 8 * positions * 2 * 4  # K and V, 2 heads of 8, batch 2, fp32
        expected = (3 - local) * full_layer + local * full_layer * min(5, positions) // positions
        assert cache.nbytes == model.kv_cache_bytes(positions, batch=2) == expected


@pytest.mark.parametrize("settings, message", [
    (dict(window=0), "model.window=0 must be an integer in [1, model.context_length=32)"),
    (dict(window=32), "model.window=32 must be an integer in [1, model.context_length=32)"),
    (dict(window=4.5), "model.window=4.5 must be an integer"),
    (dict(window=4, window_pattern="5:2"), "model.window_pattern='5:2' must be all, alternate or N:1"),
    (dict(window=4, window_pattern="0:1"), "model.window_pattern='0:1' must be all, alternate or N:1"),
    (dict(window=4, window_pattern="every"), "model.window_pattern='every' must be"),
    (dict(window_pattern="alternate"), "model.window_pattern=alternate says which layers are local, but "
                                       "model.window=null makes none"),
    (dict(sinks="yes"), "model.sinks='yes' must be true or false"),
    (dict(window=4, n_kv_heads=4, kv_rank=8), "model.window=4 with attention=mla"),
    (dict(sinks=True, n_kv_heads=4, kv_rank=8), "model.sinks=true with attention=mla"),
])
def test_bad_windows_are_refused(settings, message):
    cfg = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, context_length=32) | settings
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        Transformer(ModelConfig(**cfg))


@pytest.mark.parametrize("sinks", [False, True])
def test_training_with_a_band_keeps_sdpa_from_materialising_weights(sinks):
    """A windowed layer's training forward hands sdpa a T x T mask and never makes the weights: no tensor the forward
    saves for backward is as large as [B, H, T, T] (65,536 numbers at T = 128; with sinks, 66,048, which a value
    narrower than the key once made sdpa's math kernel save). sdpa's fused CPU kernel keeps the mask, [T, S]."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                    context_length=128, window=8, sinks=sinks))
    tokens = torch.randint(0, 64, (1, 128))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(tokens).sum()
    assert max(t.numel() for t in saved) < 4 * 128 * 128
    assert any(t.shape == (128, 128 + sinks) for t in saved)


@pytest.mark.parametrize("pattern, sinks", PATTERNS)
def test_the_reports_weights_are_the_ones_forward_applies(pattern, sinks):
    """attention_weights (the report's maps, the diagnostics' entropy) with a layer's window and sinks, applied to
    its values and projected, is that layer's forward, in float64 to 1e-12."""
    model = windowed_model(pattern, sinks)
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    for block in model.blocks:
        attn = block.attn
        q, k, v = attn.heads(x)
        weights = attention_weights(q, k, attn.window, attn.sinks)
        y = weights @ v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
        torch.testing.assert_close(attn.out(y.transpose(1, 2).reshape(x.shape)), attn(x), rtol=1e-12, atol=1e-12)
        if attn.window is not None:  # nothing outside the band
            assert weights[..., 12, :8].abs().max() == 0 and weights[..., 12, 8:].min() > 0


def test_the_reports_cache_table_holds_the_windows():
    """The report's cache-by-K/V-heads table (insight/attention.py) counts a local layer's window, not the context:
    alternate at window 5 of 32 over 3 layers holds 5 + 32 + 5 positions, and this model's row is what it allocates."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, context_length=32, window=5,
                      window_pattern="alternate")
    rows = cache_by_kv_heads(cfg)
    assert [row["bytes"] for row in rows] == [2 * n * 8 * (5 + 32 + 5) * 4 for n in (4, 2, 1)]
    assert [row["bytes"] for row in rows if row["this_model"]] == [Transformer(cfg).new_kv_cache(1).nbytes]
