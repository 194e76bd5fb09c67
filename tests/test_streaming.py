"""Generation past the context without re-prefilling (generation/engine.py, model/kv_cache.py): a windowed model in
its own rolling cache, and StreamingLLM's sink tokens plus a rolling window for a model of full layers, each held
to a forward that computes the same attention from scratch, in float64; the settings refused."""
import pytest
import torch

from generation.engine import Cached, Engine, SamplingError, Sliding, Streaming, Uncached
from model import ModelConfig, Transformer
from weights import far_from_init


def model64(**settings) -> Transformer:
    cfg = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context_length=16) | settings
    return far_from_init(Transformer(ModelConfig(**cfg)), seed=0).double()


def counting_forwards(model: Transformer) -> list[int]:
    """The number of new tokens of each forward the model runs from now on."""
    lengths = []
    model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    return lengths


@pytest.mark.parametrize("pattern", ["all", "alternate"])
def test_a_windowed_model_streams_in_its_rolling_cache(pattern):
    """Every layer local (window 4 of a context of 16): 45 greedy tokens after a prompt of 5, three times the
    context, one forward per token after the prefill and no re-prefill; each token is the argmax of one forward
    over the whole sequence (the band gives each position the same keys). With a global layer (alternate) the
    engine slides at the context as before."""
    model = model64(window=4, window_pattern=pattern)
    prompt = [[3, 1, 4, 1, 5]]
    engine = Engine(model)
    forwards = counting_forwards(model)
    ids = [int(step[0]) for step in engine.generate(prompt, 45, temperature=0)]
    if pattern == "all":
        assert forwards == [5] + 44 * [1] and engine.stats.cache_bytes == model.kv_cache_bytes(16, dtype=torch.float64)
        with torch.no_grad():
            logits = model(torch.tensor([prompt[0] + ids[:-1]]))[0, 4:]
        assert logits.argmax(-1).tolist() == ids
    else:  # the prompt, then a re-prefill of context // 2 = 8 tokens at each slide: one every 8 new tokens past 16
        assert [n for n in forwards if n > 1] == [5] + 4 * [8] and len(forwards) == 45


@pytest.mark.parametrize("sink_tokens", [0, 2])
@pytest.mark.parametrize("position", ["rope", "none"])
def test_sink_tokens_keep_the_first_positions_and_a_rolling_window(position, sink_tokens):
    """StreamingLLM on a one-layer model of full attention, a cache of 8: each token past the cache is the argmax
    of a forward over the S sink tokens and the last 8 - S tokens at positions 0 .. 7 (the positions within the
    cache; S = 0 is the window alone), and its logits are that forward's in float64. Without positions to 1e-10;
    with RoPE to 1e-6, as its tables are float32 (transformers' rounding): angles p theta_i rounded at positions up
    to 45 in one and up to 7 in the other differ by up to 45 x 6e-8 = 2.7e-6 rad, on scores of order 1 (measured:
    4.8e-8)."""
    model = model64(n_layers=1, position=position)
    engine = Engine(model, context=8, sink_tokens=sink_tokens)
    prompt = [3, 1, 4, 1, 5]
    forwards = counting_forwards(model)
    logits_seen = []
    model.register_forward_hook(lambda module, args, out: logits_seen.append(out[0, -1]))
    ids = [int(step[0]) for step in engine.generate([prompt], 40, temperature=0)]
    assert forwards == [5] + 39 * [1]
    sequence, recent = prompt + ids, 8 - sink_tokens
    tolerance = 1e-6 if position == "rope" else 1e-10
    with torch.no_grad():
        for p in range(8, len(prompt) + 39):  # the forward whose query is the token at position p
            seen = torch.tensor([sequence[:sink_tokens] + sequence[p - recent + 1:p + 1]])
            expected = model(seen)[0, -1]
            torch.testing.assert_close(logits_seen[p - len(prompt) + 1], expected, rtol=tolerance, atol=tolerance)
            assert expected.argmax().item() == ids[p - len(prompt) + 1]


@pytest.mark.parametrize("settings, sink_tokens", [(dict(window=4, window_pattern="alternate"), 2),
                                                   (dict(), 0), (dict(window=4), None)])
def test_streaming_samples_of_one_prompt_are_each_the_single_samples_generation(settings, sink_tokens):
    """num_samples = 3 prefills the prompt once and copies its cache rows (the streaming layers' sink keys too): each
    sample's greedy tokens, three contexts long, are those of a generation of one sample, in a 2-layer model."""
    model = model64(**settings)
    engine = Engine(model, sink_tokens=sink_tokens)
    one = [int(step[0]) for step in engine.generate([[3, 1, 4, 1, 5]], 45, temperature=0)]
    three = torch.stack(list(engine.generate([[3, 1, 4, 1, 5]], 45, temperature=0, num_samples=3)), dim=1)
    assert len(set(one)) > 3 and all(row == one for row in three.tolist())


@pytest.mark.parametrize("settings, sink_tokens", [(dict(window=16), None),
                                                   (dict(window=16, window_pattern="alternate"), 2)])
def test_a_context_no_longer_than_the_window_holds_the_local_layers_whole(settings, sink_tokens):
    """An engine context of 12 under a window of 16: the local layers hold the 12 positions as full ones do, so the
    all-local model slides as a full one would (its window never cuts inside 12), and with sink tokens they stream
    as the full layers do: 30 new tokens, no overflow, and the same tokens as one sample in a batch of 2."""
    model = model64(context_length=32, **settings)
    engine = Engine(model, context=12, sink_tokens=sink_tokens)
    forwards = counting_forwards(model)
    ids = torch.stack(list(engine.generate([[1, 2, 3]], 30, temperature=0, num_samples=2)), dim=1)
    assert ids.shape == (2, 30) and torch.equal(ids[0], ids[1])
    slides = [n for n in forwards[1:] if n > 1]
    # 3 + 29 positions: a re-prefill of 12 // 2 = 6 tokens when the 13th comes, then every 7 new tokens
    assert slides == ([] if sink_tokens is not None else 3 * [6])


def test_dynamic_ntk_slides_rather_than_streaming():
    """Dynamic NTK's frequencies depend on the sequence's length, which a stream does not have: an all-local model
    under it slides at the context, re-prefilling, instead of streaming."""
    model = model64(window=4, rope_scaling="dynamic", rope_factor=2.0)
    engine = Engine(model)
    forwards = counting_forwards(model)
    list(engine.generate([[3, 1, 4]], 30, temperature=0))
    assert engine.context_policy(True, 3, 30) is Sliding and [n for n in forwards if n > 1] == [3, 8, 8]


def test_a_long_prompt_keeps_its_sink_tokens(capsys):
    """A prompt of 20 tokens for a cache of 8 with 2 sink tokens: the prefill gets its first 2 and its last 6, with
    a warning that says so."""
    model = model64(n_layers=1)
    forwards = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(args[0][0].tolist()))
    list(Engine(model, context=8, sink_tokens=2).generate([list(range(1, 21))], 1, temperature=0))
    assert forwards[0] == [1, 2] + list(range(15, 21))
    assert "keeping its first 2 (the sink tokens) and last 6" in capsys.readouterr().err


@pytest.mark.parametrize("settings, sink_tokens, message", [
    ({}, -1, "sink_tokens=-1 must be an integer in [0, the cache's 16 positions)"),
    ({}, 16, "sink_tokens=16 must be an integer in [0, the cache's 16 positions)"),
    (dict(position="learned"), 2, "with model.position=learned: StreamingLLM gives the cached tokens positions"),
    (dict(rope_scaling="yarn", rope_factor=2.0), 2, "with model.rope_scaling=yarn: the sinks are rotated on"),
    (dict(rope_scaling="dynamic", rope_factor=2.0), 0, "with model.rope_scaling=dynamic: its frequencies change"),
    (dict(window=4), 0, "with every layer local (model.window=4)"),
    (dict(n_kv_heads=4, kv_rank=8), 2, "with attention=mla"),
])
def test_bad_sink_tokens_are_refused(settings, sink_tokens, message):
    with pytest.raises(SamplingError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        Engine(model64(**settings), sink_tokens=sink_tokens)


@pytest.mark.parametrize("settings, sink_tokens, use_cache, new_tokens, policy, name", [
    (dict(), None, True, 10, Cached, "cached"),  # 5 + 10 - 1 positions fit in 16
    (dict(), 2, True, 10, Cached, "cached"),  # sink tokens only matter past the context
    (dict(), None, True, 30, Sliding, "sliding"),
    (dict(), 2, True, 30, Streaming, "streaming (2 sink tokens)"),
    (dict(window=4), None, True, 30, Streaming, "rolling"),
    (dict(window=4, window_pattern="alternate"), None, True, 30, Sliding, "sliding"),  # a full layer: no rolling
    (dict(window=4, rope_scaling="dynamic", rope_factor=2.0), None, True, 30, Sliding, "sliding"),
    (dict(window=4, position="learned"), None, True, 30, Sliding, "sliding"),  # its table ends at the context
    (dict(), None, False, 30, Uncached, "uncached"),
])
def test_the_context_policy_is_chosen_once_and_named_in_the_stats(settings, sink_tokens, use_cache, new_tokens,
                                                                   policy, name):
    """Engine.context_policy for a prompt of 5 and a context of 16, and the stats line that names what ran and the
    positions its cache held; while the generation fits in the context (its first 12 new tokens), every step's logits
    are those of recomputing the prefix without a cache, in float64 (the kernels sum in another order: ~1e-15)."""
    model = model64(**settings)
    engine = LogitsEngine(model, sink_tokens=sink_tokens)
    assert engine.context_policy(use_cache, 5, new_tokens) is policy
    ids = [int(step[0]) for step in engine.generate([[3, 1, 4, 1, 5]], new_tokens, temperature=0, use_cache=use_cache)]
    cached = use_cache and policy is not Uncached
    held = min(16, 5 + new_tokens - 1) if cached else 0
    assert (engine.stats.policy, engine.stats.cache_positions) == (name, held)
    assert f"context {name}, {held} positions cached | KV cache {engine.stats.cache_bytes:,} bytes" in str(engine.stats)
    assert engine.stats.cache_bytes == (model.kv_cache_bytes(held, dtype=torch.float64) if cached else 0)
    uncached = LogitsEngine(model)
    recomputed = [int(step[0]) for step in uncached.generate([[3, 1, 4, 1, 5]], 12, temperature=0, use_cache=False)]
    fits = min(12, new_tokens)
    assert ids[:fits] == recomputed[:fits] and len(set(recomputed)) > 3
    torch.testing.assert_close(torch.stack(engine.logits[:fits]), torch.stack(uncached.logits[:fits]),
                               rtol=1e-10, atol=1e-10)


class LogitsEngine(Engine):
    """Keeps the logits each step samples from."""

    def __init__(self, model: Transformer, **settings):
        super().__init__(model, **settings)
        self.logits = []

    def _forward(self, tokens, start, cache, model=None):
        logits = super()._forward(tokens, start, cache, model)
        self.logits.append(logits[0].clone())
        return logits


def test_stream_refusals_come_from_the_kinds():
    """Transformer.stream_refusal asks the positions (a table, a RoPE scaling), the attentions (MLA) and the layers
    (every one local) in that order; with no sink tokens only what the positions refuse for the rolling caches:
    dynamic NTK's changing frequencies, not YaRN's factor nor a learned table (whose end PositionsError says)."""
    assert model64().stream_refusal(2) is None and model64().stream_refusal(None) is None
    assert model64(position="none").stream_refusal(2) is None
    assert model64(position="sinusoidal").stream_refusal(2).startswith("with model.position=sinusoidal: ")
    assert model64(position="learned").stream_refusal(None) is None
    assert model64(rope_scaling="yarn", rope_factor=2.0).stream_refusal(0) is None  # no sinks to turn on
    assert model64(rope_scaling="yarn", rope_factor=2.0).stream_refusal(None) is None
    assert model64(rope_scaling="dynamic", rope_factor=2.0).stream_refusal(None).startswith(
        "with model.rope_scaling=dynamic: ")
    assert model64(n_kv_heads=4, kv_rank=8).stream_refusal(2) == ("with attention=mla: its latent cache has no "
                                                                  "streaming form here")
    assert model64(n_kv_heads=4, kv_rank=8).stream_refusal(None) is None
    assert model64(window=4, position="learned").stream_refusal(2).startswith("with model.position=learned")
    assert model64(window=4).rolls(16) and not model64(window=4).rolls(4) and not model64().rolls(16)


def test_evaluates_streaming_mode_asks_the_model_too():
    """evaluate.py --mode streaming: a model with full layers needs sink tokens; an all-local one streams in its own
    caches unless its positions refuse to run on (dynamic NTK), in one line each."""
    from errors import UsageError
    from insight.evaluation import check_streaming
    check_streaming(model64(window=4), None)
    check_streaming(model64(), 2)
    with pytest.raises(UsageError, match=r"^--mode streaming needs --sink-tokens \(0: the window alone\)"):
        check_streaming(model64(), None)
    with pytest.raises(UsageError, match="^--mode streaming with model.rope_scaling=dynamic: its frequencies change "
                                         "with the sequence's length, which a stream does not have$"):
        check_streaming(model64(window=4, rope_scaling="dynamic", rope_factor=2.0), None)
    with pytest.raises(UsageError, match="^--sink-tokens=2 with attention=mla: its latent cache has no streaming form"):
        check_streaming(model64(n_kv_heads=4, kv_rank=8), 2)
