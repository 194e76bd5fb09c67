"""Hydra composition: presets pick every component, command-line groups override them both ways."""

import re
from dataclasses import fields
from types import SimpleNamespace

import pytest
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf

from errors import ConfigError
from model import ModelConfig, Transformer
from model.block import rope_dim
from settings import CONFIG_DIR, compose_config, sample_jobs
from training.config import model_config
from training.state import Progress
from training.tracking import end_of_run_line

MODERN = {"norm": "rmsnorm", "norm_position": "pre", "position": "rope", "attention": "gqa", "ffn": "swiglu"}
CLASSIC = {"norm": "layernorm", "norm_position": "post", "position": "sinusoidal", "attention": "mha", "ffn": "relu"}


def compose_model(*overrides: str):
    return compose_config(overrides).model


def choices(model_node) -> dict:
    return {key: model_node[key] for key in MODERN}


def test_llama_tiny_picks_every_modern_component():
    model = compose_model("model=llama_tiny")
    assert choices(model) == MODERN
    assert model.n_kv_heads < model.n_heads


def test_transformer2017_tiny_picks_every_2017_component():
    model = compose_model("model=transformer2017_tiny")
    assert choices(model) == CLASSIC
    assert model.n_kv_heads == model.n_heads


def test_default_is_llama_tiny():
    assert compose_model() == compose_model("model=llama_tiny")


def test_modern_tiny_is_llama_tiny_with_what_came_after_at_its_own_learning_rate():
    """QK-norm, ReLU² and Muon on llama_tiny's sizes, at twice llama_tiny's peak lr (the study's ratio): a preset's
    train.* wins over the root config's, and a command line or an experiment still wins over the preset."""
    llama, modern = (compose_config([f"model={preset}"]) for preset in ("llama_tiny", "modern_tiny"))
    differing = {key for key in llama.model if llama.model[key] != modern.model[key]}
    assert differing == {"name", "qk_norm", "ffn"} and (modern.model.qk_norm, modern.model.ffn) == ("rmsnorm", "relu2")
    assert (llama.train.optimizer, modern.train.optimizer) == ("adamw", "muon")
    assert (modern.train.lr, modern.train.min_lr, modern.train.muon_lr) == (2 * llama.train.lr, 2 * llama.train.min_lr,
                                                                           2 * llama.train.lr)
    assert compose_config(["model=modern_tiny", "train.lr=1e-3"]).train.muon_lr == 1e-3


def test_deepseek_tiny_is_llama_tiny_with_the_studys_mla_at_its_parameters_and_an_mqa_sized_cache():
    """MLA in the study's winning shape (a latent and RoPE key the size of MQA's cache, half a head of RoPE), d_ff
    giving back what MLA adds, at twice llama_tiny's peak lr (the study's ratio for MLA)."""
    llama, deepseek = (compose_config([f"model={preset}"]) for preset in ("llama_tiny", "deepseek_tiny"))
    differing = {key for key in llama.model if llama.model[key] != deepseek.model[key]}
    assert differing == {"name", "attention", "n_kv_heads", "kv_rank", "rope_head_dim", "d_ff"}
    models = {name: Transformer(model_config(cfg)) for name, cfg in (("llama", llama), ("deepseek", deepseek))}
    assert models["deepseek"].cfg.attention == "mla" and rope_dim(models["deepseek"].cfg) == 32 // 2
    assert abs(models["deepseek"].num_params() - models["llama"].num_params()) < 1e-3 * models["llama"].num_params()
    mqa = Transformer(model_config(compose_config(["attention=mqa"])))
    assert models["deepseek"].kv_cache_bytes_per_token() == mqa.kv_cache_bytes_per_token()  # 4 layers x 64 x fp32
    assert (deepseek.train.lr, deepseek.train.min_lr) == (2 * llama.train.lr, 2 * llama.train.min_lr)


def test_moe_tiny_is_modern_tiny_with_the_studys_experts_at_llama_tinys_active_parameters():
    """modern_tiny's QK-norm and Muon, its ReLU² FFN replaced by moe_shared's experts (15 routed of 88, 3 a token, and
    one shared): the active FFN width is llama_tiny's d_ff, the total four times it, at modern_tiny's peak lr."""
    llama, modern, moe = (compose_config([f"model={preset}"]) for preset in ("llama_tiny", "modern_tiny", "moe_tiny"))
    differing = {key for key in modern.model if modern.model[key] != moe.model[key]}
    assert differing == {"name", "ffn", "n_experts", "experts_per_token", "expert_d_ff", "n_shared_experts",
                         "router_aux_coef", "router_z_coef"}
    models = {name: Transformer(model_config(cfg)) for name, cfg in (("llama", llama), ("moe", moe))}
    width = (moe.model.experts_per_token + moe.model.n_shared_experts) * moe.model.expert_d_ff
    assert width == models["llama"].cfg.ffn_width == 352
    routers = 4 * 15 * 128 + 4 * 2 * 32  # the routers and QK-norm's gains: all that is active beyond llama_tiny's
    assert models["moe"].active_params() == models["llama"].num_params() + routers
    assert (moe.train.optimizer, moe.train.lr, moe.train.min_lr) == ("muon", modern.train.lr, modern.train.min_lr)


def test_qwen35_tiny_is_the_3to1_hybrid_at_llama_tinys_parameters():
    """Three Gated DeltaNet layers, then one attention layer with the output gate, QK-norm and RoPE on a quarter of
    each head; a wider SwiGLU gives the parameters back: llama_tiny's less 3,448 (0.4%), at llama_tiny's peak lr."""
    llama, qwen = (compose_config([f"model={preset}"]) for preset in ("llama_tiny", "qwen35_tiny"))
    model = Transformer(model_config(qwen))
    assert [type(block.attn).__name__ for block in model.blocks] == 3 * ["GatedDeltaNet"] + ["Attention"]
    attention = model.blocks[3].attn
    assert attention.gate is not None and attention.qk_norm is not None and model.rotary.head_dim == 32 // 4
    assert Transformer(model_config(llama)).num_params() - model.num_params() == 3_448
    assert (qwen.train.optimizer, qwen.train.lr) == ("adamw", llama.train.lr)


def test_gptoss_tiny_is_llama_tiny_with_alternating_windows_sinks_and_experts():
    """gpt-oss's parts on llama_tiny's sizes: local layers of a quarter-context window first and in turn, a sink logit
    per head, top-4 of 16 experts whose active width is llama_tiny's d_ff, at llama_tiny's peak lr."""
    llama, oss = (compose_config([f"model={preset}"]) for preset in ("llama_tiny", "gptoss_tiny"))
    model = Transformer(model_config(oss))
    assert model.cfg.layer_windows == [32, None, 32, None] and model.cfg.sinks
    assert model.cfg.experts_per_token * model.cfg.expert_d_ff == Transformer(model_config(llama)).cfg.ffn_width
    assert (oss.model.router, oss.train.optimizer, oss.train.lr) == ("softmax", "adamw", llama.train.lr)
    routers_and_sinks = 4 * 16 * 128 + 4 * 4
    assert model.active_params() == Transformer(model_config(llama)).num_params() + routers_and_sinks


@pytest.mark.parametrize("preset, override, expected", [
    ("llama_tiny", "norm=layernorm", MODERN | {"norm": "layernorm"}),
    ("transformer2017_tiny", "position=rope", CLASSIC | {"position": "rope"}),
    ("llama_tiny", "ffn=relu", MODERN | {"ffn": "relu"}),
    ("transformer2017_tiny", "norm_position=pre", CLASSIC | {"norm_position": "pre"}),
])
def test_a_group_on_the_command_line_overrides_the_preset(preset, override, expected):
    assert choices(compose_model(f"model={preset}", override)) == expected


@pytest.mark.parametrize("preset", ["llama_tiny", "transformer2017_tiny"])
def test_attention_group_sets_n_kv_heads(preset):
    mha, gqa, mqa = (compose_config([f"model={preset}", f"attention={name}"]) for name in ("mha", "gqa", "mqa"))
    assert mha.model.n_kv_heads == mha.model.n_heads == 4
    assert mqa.model.n_kv_heads == 1
    assert gqa.model.n_kv_heads == ModelConfig().n_kv_heads == 2  # gqa keeps the default number
    assert compose_model(f"model={preset}", "model.n_kv_heads=4").n_kv_heads == 4
    # the model names its attention after its K/V heads; the group's name stays in the config and agrees
    for cfg in (mha, gqa, mqa):
        assert model_config(cfg).attention == cfg.model.attention
    assert model_config(compose_config([f"model={preset}", "model.n_kv_heads=4"])).attention == "mha"  # gqa: any
    for overrides, message in ((["attention=mha", "model.n_kv_heads=2"], "model.attention=mha has 4 K/V heads, "
                                "not model.n_kv_heads=2; use attention=gqa for another number"),
                               (["attention=mqa", "model.n_kv_heads=2"], "model.attention=mqa has 1 K/V heads"),
                               (["model.attention=mla"], "model.attention=mla needs the latent's width, but "
                                                         "model.kv_rank=null"),
                               (["model.attention=foo"], "model.attention='foo' must be one of gqa, mha, mqa, mla")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            model_config(compose_config([f"model={preset}", *overrides]))


def test_model_config_defaults_are_the_composed_llama_tiny():
    """ModelConfig's defaults are the one place llama_tiny's sizes are written: the schema takes them."""
    cfg = compose_config(["model=llama_tiny"])
    assert model_config(cfg) == ModelConfig()
    assert set(cfg.model) == {f.name for f in fields(ModelConfig)} - {"vocab_size"} | {"name", "attention"}
    assert (cfg.data.vocab_size, cfg.model.attention) == (ModelConfig().vocab_size, ModelConfig().attention)


def test_a_checkpoint_that_stores_the_attention_name_still_loads():
    """Checkpoints written while ModelConfig had an attention field store its name beside n_kv_heads."""
    stored = ModelConfig(n_kv_heads=4).to_dict() | {"attention": "mha"}
    assert "attention" not in ModelConfig().to_dict()
    assert ModelConfig.from_dict(stored) == ModelConfig(n_kv_heads=4)


def test_presets_differ_only_in_their_choices():
    llama, classic = (OmegaConf.to_container(compose_model(f"model={preset}"), resolve=True)
                      for preset in ("llama_tiny", "transformer2017_tiny"))
    differing = {key for key in llama.keys() | classic.keys() if llama.get(key) != classic.get(key)}
    # n_kv_heads follows the attention choice; every width and depth key is shared
    assert differing == set(MODERN) | {"name", "n_kv_heads"}
    for key in ("d_model", "n_layers", "n_heads", "context_length"):
        assert llama[key] == classic[key]


def test_unknown_option_gets_hydras_own_error():
    with pytest.raises(ConfigError, match="norm/foo") as error:
        compose_model("model=llama_tiny", "norm=foo")
    assert isinstance(error.value.__cause__, MissingConfigException)
    assert "layernorm" in str(error.value) and "rmsnorm" in str(error.value)  # it lists the options


@pytest.mark.parametrize("preset", ["llama_tiny", "transformer2017_tiny"])
def test_model_config_builds_from_the_composed_node(preset):
    node = compose_model(f"model={preset}")
    cfg = ModelConfig.from_dict(OmegaConf.to_container(node, resolve=True) | {"vocab_size": 1024})
    expected = MODERN if preset == "llama_tiny" else CLASSIC
    assert (cfg.norm, cfg.norm_position, cfg.position, cfg.attention, cfg.ffn) == tuple(expected.values())
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == \
        (node.d_model, node.n_layers, node.n_heads, node.n_kv_heads)
    if preset == "llama_tiny":  # docs/model.md: 869,504 parameters on the default corpus's 1024 pieces
        blocks = 4 * (2 * 128 + 128 * (4 + 2 * 2) * 32 + 128 * 128 + 3 * 128 * 352)
        assert Transformer(cfg).num_params() == blocks + 1024 * 128 + 128 == 869_504


def test_every_shipped_option_fits_the_schema():
    """Each YAML in configs/ is merged into settings.py's dataclasses: a key the schema lacks
    or a value of the wrong type in any of them fails here rather than in a user's run."""
    from settings import CONFIG_DIR
    for group in sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in ("experiment", "ablation")):
        for option in sorted(group.glob("*.yaml")):
            cfg = compose_config([f"{group.name}={option.stem}"])
            OmegaConf.to_container(cfg.model, resolve=True, throw_on_missing=True)
            assert (cfg.data.vocab_size is None or cfg.data.vocab_size > 0) and cfg.train.lr > 0  # null: the rule


def test_a_value_of_the_wrong_type_is_refused_at_composition_with_its_key():
    from hydra.errors import ConfigCompositionException
    for override, key in (("train.lr=abc", "train.lr"), ("model.n_layers=2.5", "model.n_layers"),
                          ("train.compile=maybe", "train.compile"), ("data.vocab_size=big", "data.vocab_size")):
        with pytest.raises(ConfigError) as error:
            compose_config([override])
        assert isinstance(error.value.__cause__, ConfigCompositionException)
        assert f"full_key: {key}" in str(error.value.__cause__.__cause__)
    assert compose_config(["train.lr=1"]).train.lr == 1.0 and isinstance(compose_config(["train.lr=1"]).train.lr, float)


def test_llama_quick_is_the_two_minute_grids_winner():
    """docs/training.md: d 128, 2 layers, context 128, 1024 pieces, batch 16, lr 5e-3, for 2 minutes."""
    cfg = compose_config(["model=llama_quick", "+experiment=quick"])
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads, cfg.model.context_length) == (128, 2, 4, 128)
    assert (cfg.data.vocab_size, cfg.train.batch_size, cfg.train.lr, cfg.train.min_lr) == (1024, 16, 5e-3, 5e-4)
    assert cfg.train.time_budget == "2m" and cfg.train.max_steps is None
    assert compose_config([]).train.time_budget == "5m"


@pytest.mark.parametrize("preset", sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml")))
def test_quick_shortens_every_preset_and_changes_nothing_else(preset):
    """+experiment=quick is 2 minutes of the preset itself: its model, its layer pattern, its learning rate and its
    reference rate, so that a qwen35_tiny run keeps its attention layer and its speed is judged against its own."""
    own, quick = compose_config([f"model={preset}"]), compose_config([f"model={preset}", "+experiment=quick"])
    assert quick.model == own.model and quick.data == own.data
    assert {key for key in own.train if own.train[key] != quick.train[key]} <= {"time_budget"}  # speedrun's is 2m
    assert quick.train.time_budget == "2m"


def test_a_multiruns_check_composes_every_value_of_every_swept_key_once():
    jobs = sample_jobs(["train.lr=1e-3,abc", "+point=a/b,c", "train.seed=0", "x=range(1,3)"])
    assert jobs == [["train.lr=0.001", "+point=a/b", "train.seed=0", "x=1"],
                    ["train.lr=abc", "+point=c", "train.seed=0", "x=2"]]
    assert sample_jobs([]) == [[]]


PRESETS = sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_compares_its_speed_against_its_own_measured_rate(preset):
    """The closing line's reference (train.reference_tokens_per_s) is set in the preset's own file, from its run on
    an idle 2-core machine (docs/training.md), and the line names the model it was measured for."""
    own = OmegaConf.load(CONFIG_DIR / "model" / f"{preset}.yaml").train.reference_tokens_per_s
    cfg = compose_config([f"model={preset}"])
    assert own > 0 and cfg.train.reference_tokens_per_s == own and cfg.model.name == preset
    meter = SimpleNamespace(session_rate=own / 2)
    line = end_of_run_line(preset, Progress(step=10, tokens=20480, elapsed_s=1.0), meter, own, cfg.model.name)
    assert line.endswith(f", {own / 2:,.0f} tokens/s (50% of train.reference_tokens_per_s={own:,.0f}, {preset}'s "
                         f"rate on an idle 2-core CPU machine)")
