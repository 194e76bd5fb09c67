"""The speedrun's model switches (issue S): value embeddings (model/value_embeddings.py) and residual and x0 scalars
(model/residual_scalars.py), each against an independent computation in float64, through the KV cache, in the
optimizer's groups, and refused where a layer has no values to add to."""
import dataclasses

import pytest
import torch

from errors import ConfigError
from model import ModelConfig, Transformer
from model.value_embeddings import value_embedding_layers
from training.optim import make_optimizer
from test_generate import greedy
from test_train_parts import train_settings
from weights import far_from_init

TINY = dict(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, context_length=16)


@pytest.mark.parametrize("pattern,n_layers,chosen", [
    ("all", 3, [True, True, True]), ("alternate", 4, [False, True, False, True]),
    ("alternate", 3, [True, False, True]), (None, 2, [False, False])])
def test_the_pattern_chooses_the_layers_and_each_gets_a_table_of_its_value_width(pattern, n_layers, chosen):
    """alternate counts back from the last layer (nanochat's); a table is vocab x H_kv D."""
    cfg = ModelConfig(**TINY | dict(n_layers=n_layers), value_embeddings=pattern)
    assert value_embedding_layers(cfg) == chosen
    plain = Transformer(dataclasses.replace(cfg, value_embeddings=None)).num_params()
    assert Transformer(cfg).num_params() - plain == sum(chosen) * 64 * 2 * 8  # H_kv 2 x D 8 per token


def test_a_value_table_whose_rows_are_all_b_is_a_bias_b_on_the_values():
    """Every token's row b in layer 1's table adds b to each of its values: the same model as one whose Wv has the bias
    b there and every other bias 0 (model.bias=true), in float64."""
    torch.manual_seed(0)
    with_bias = far_from_init(Transformer(ModelConfig(**TINY, bias=True)).double())
    b = torch.randn(16, dtype=torch.float64)
    with torch.no_grad():
        for name, p in with_bias.named_parameters():
            if name.endswith("bias") and "norm" not in name:
                p.zero_()
        with_bias.blocks[1].attn.qkv.bias[-16:] = b  # the stacked [Wq; Wk; Wv]'s last H_kv D rows: V
    embedded = Transformer(ModelConfig(**TINY, value_embeddings="alternate")).double().eval()
    own = embedded.state_dict()
    own.update({k: v for k, v in with_bias.state_dict().items() if k in own})
    own["value_embeddings.tables.1.weight"] = b.expand(64, 16).clone()
    own["value_embeddings.tables.3.weight"] = torch.zeros(64, 16, dtype=torch.float64)
    embedded.load_state_dict(own)
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = with_bias(tokens), embedded(tokens)
    plain = Transformer(ModelConfig(**TINY)).double().eval()
    plain.load_state_dict({k: v for k, v in own.items() if k in plain.state_dict()})
    with torch.no_grad():
        assert (plain(tokens) - expected).abs().max() > 1e-3  # the bias changes the logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)  # float64 rounding of logits of size ~10


def test_residual_scalars_mix_the_embedding_stream_into_each_block_as_their_formula():
    """x_l <- lambda_r[l] x_l + lambda_0[l] x_0 before block l, by hand over the model's own blocks, in float64; at
    init (1 and 0) the plain model's logits exactly."""
    model = far_from_init(Transformer(ModelConfig(**TINY, residual_scalars=True)).double())
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(2))
    plain = Transformer(ModelConfig(**TINY)).double().eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k in plain.state_dict()})
    with torch.no_grad():
        model.residual_scalars.residual.fill_(1)
        model.residual_scalars.x0.zero_()
        assert torch.equal(model(tokens), plain(tokens))
        model.residual_scalars.residual.copy_(torch.tensor([0.5, 1.5, -0.75, 2.0]))
        model.residual_scalars.x0.copy_(torch.tensor([0.25, -1.0, 0.75, 0.125]))
        x0 = x = model.token_signal(tokens)
        for block, residual, skip in zip(model.blocks, [0.5, 1.5, -0.75, 2.0], [0.25, -1.0, 0.75, 0.125]):
            x = block(residual * x + skip * x0)
        expected = model.lm_head(model.final_norm(x))
        torch.testing.assert_close(model(tokens), expected, rtol=0, atol=1e-12)
        assert (expected - plain(tokens)).abs().max() > 1e-2


@pytest.mark.parametrize("pattern", ["all", "alternate"])
def test_the_cache_holds_the_value_embeddings_greedy_text_equals_recomputation(pattern):
    """Greedy decode with the cache, whose values include each layer's table, equals recomputation, in float64."""
    model = far_from_init(Transformer(ModelConfig(**TINY, value_embeddings=pattern, residual_scalars=True)).double())
    prompts = [[1, 5, 9, 13, 17], [2, 40, 3, 63, 7]]
    cached, with_cache = greedy(model, prompts, 8, use_cache=True)
    recomputed, without_cache = greedy(model, prompts, 8, use_cache=False)
    assert cached == recomputed
    # float64 rounding of a cached step against the whole prefix: ~1e-15 of logits of size ~10
    for (*_, a), (*_, b) in zip(with_cache.forwards, without_cache.forwards):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_adamw_decays_the_value_tables_and_not_the_scalars_and_muon_takes_neither():
    model = Transformer(ModelConfig(**TINY, value_embeddings="alternate", residual_scalars=True))
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = make_optimizer(model, train_settings(optimizer="muon", lr=0.004, muon_lr=0.02, weight_decay=0.1))
    [muon], (decayed, plain) = optimizer.muon.param_groups, optimizer.adamw.param_groups
    assert not any(n.startswith(("value_embeddings", "residual_scalars")) for n in map(names.get, map(id, muon["params"])))
    assert sorted(names[id(p)] for p in decayed["params"]) == [
        "tok_emb.weight", "value_embeddings.tables.1.weight", "value_embeddings.tables.3.weight"]
    plain_names = {names[id(p)] for p in plain["params"]}
    assert {"residual_scalars.residual", "residual_scalars.x0"} <= plain_names and plain["weight_decay"] == 0.0


@pytest.mark.parametrize("settings,message", [
    (dict(value_embeddings="every"), r"model.value_embeddings='every' must be one of all, alternate, or null for none"),
    (dict(value_embeddings="all", kv_rank=16, n_kv_heads=4), r"model.value_embeddings=all adds a table to layer 0's values, but "
                                                r"that layer is attention=mla's LatentAttention, which has none"),
    (dict(value_embeddings="alternate", linear_pattern="3:1"),
     r"layer 1's values, but that layer is attention=gated_deltanet's GatedDeltaNet"),
    (dict(residual_scalars="yes"), r"model.residual_scalars='yes' must be true or false")])
def test_a_switch_a_layer_cannot_take_is_refused_with_the_layer_named(settings, message):
    with pytest.raises(ConfigError, match=message):
        Transformer(ModelConfig(**TINY | settings))


def test_a_hybrid_takes_value_embeddings_in_its_attention_layers():
    """1:1 makes layer 1 of 2 attention, and alternate gives a table to it alone: not refused, and cached."""
    cfg = ModelConfig(**TINY | dict(n_layers=2), linear_pattern="1:1", value_embeddings="alternate")
    assert value_embedding_layers(cfg) == [False, True] and cfg.linear_layers == [True, False]
    model = far_from_init(Transformer(cfg).double())
    cached, _ = greedy(model, [[1, 2, 3]], 6, use_cache=True)
    assert cached == greedy(model, [[1, 2, 3]], 6, use_cache=False)[0]
