"""The ablation sweep composes, point by point, without training: every (variant, seed) that
hydra.sweeper.params lists in configs/experiment/ablation.yaml builds a model and differs from the
baseline in exactly the switches it is named for and in its own learning rate, which is the one the
learning-rate study chose (docs/ablation_lr.json, written by compare.py from `python sweep.py`; the lines added
after LLaMA in docs/ablation_modern.json, MLA's in docs/ablation_mla.json, the mixture of experts' in
docs/ablation_moe.json and the windows' in docs/ablation_window.json, each study's own, beside its rerun of the
baseline)."""
import copy
import functools
import itertools
import json
from pathlib import Path

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from model import ModelConfig, Transformer
from settings import CONFIG_DIR, ablation_variants, compose_config
from study.runs import SEED, Run
from study.variants import variant_key
from training.multirun import carry_swept_keys, no_keys_outside_a_multirun

MODERN = {"qk_norm": "rmsnorm", "ffn": "relu2"}  # the winners of the study's new lines (docs/ablation.md)
# Each variant's definition: the model.* settings it changes from the baseline.
GDN = {"attention": "gated_deltanet", "linear_key_heads": 2, "linear_value_heads": 4, "linear_head_dim": 16}
SWITCHES = {
    "baseline": {},
    "layernorm": {"norm": "layernorm"},
    "postnorm": {"norm_position": "post"},
    "sinusoidal": {"position": "sinusoidal"},
    "mha": {"attention": "mha", "n_kv_heads": 8},
    "relu": {"ffn": "relu"},
    "transformer2017": {"norm": "layernorm", "norm_position": "post", "position": "sinusoidal",
                        "attention": "mha", "n_kv_heads": 8, "ffn": "relu", "embedding_scale": "transformer2017"},
    "learned": {"position": "learned"},
    "nope": {"position": "none"},
    "sinusoidal2017": {"position": "sinusoidal", "embedding_scale": "transformer2017"},
    "mqa": {"attention": "mqa", "n_kv_heads": 1},
    "qknorm": {"qk_norm": "rmsnorm"},
    "relu2": {"ffn": "relu2"},
    "muon": {},  # the optimizer's: TRAIN_SWITCHES
    "modern": MODERN,
    # MLA at the baseline's parameters (d_ff gives back what the latent's up-projections add), by its cache's size
    "mla": {"attention": "mla", "n_kv_heads": 8, "kv_rank": 56, "rope_head_dim": 8, "d_ff": 293},  # GQA's cache
    "mla_small": {"attention": "mla", "n_kv_heads": 8, "kv_rank": 24, "rope_head_dim": 8, "d_ff": 325},  # MQA's
    # experts at the baseline's active FFN (8 of d_e 176, 2 a token), with the router and balance each line names
    "moe": {"ffn": "moe", "n_experts": 8, "experts_per_token": 2, "router_aux_coef": 0.01, "router_z_coef": 0.001},
    "moe_sigmoid": {"ffn": "moe", "n_experts": 8, "experts_per_token": 2, "router": "sigmoid",
                    "router_bias_rate": 0.001},
    "moe_shared": {"ffn": "moe", "n_experts": 15, "experts_per_token": 3, "expert_d_ff": 88, "n_shared_experts": 1,
                   "router_aux_coef": 0.01, "router_z_coef": 0.001},
    "dense_wide": {"d_ff": 1408},  # the MoE's total FFN width, dense
    # a window of a quarter of the context (32 of 128) in the layers each pattern makes local, with gpt-oss's sinks
    "window": {"window": 32},
    "window_3to1": {"window": 32, "window_pattern": "3:1"},
    "window_alternate": {"window": 32, "window_pattern": "alternate"},
    "window_sinks": {"window": 32, "sinks": True},
    "window_alternate_sinks": {"window": 32, "window_pattern": "alternate", "sinks": True},
    "sinks": {"sinks": True},
    # Gated DeltaNet (2 key and 4 value heads of 16 dims): Qwen3.5's 3:1 hybrid with its output gate, without it,
    # without the delta rule, and every layer linear (no positions)
    "gdn_hybrid": {**GDN, "linear_pattern": "3:1", "attention_gate": True},
    "gdn_hybrid_nogate": {**GDN, "linear_pattern": "3:1"},
    "gdn_hybrid_nodelta": {**GDN, "linear_pattern": "3:1", "attention_gate": True, "linear_delta_rule": False},
    "gdn_all": {**GDN, "linear_pattern": "all", "position": "none"},
}
TRAIN_SWITCHES = {"muon": {"optimizer": "muon"}, "modern": {"optimizer": "muon"},  # train.* a variant changes
                  "wsd": {"decay_fraction": 0.4}}
# Study lines only, not in the ablation's multirun: the warm-up probe's, and the speedrun's switches (swept on
# modern_tiny by `sweep.py --experiment speedrun`, docs/speedrun.md)
PROBES = {"postnorm2017": {"norm_position": "post", "embedding_scale": "transformer2017"},
          "value_embeddings": {"value_embeddings": "alternate"}, "residual_scalars": {"residual_scalars": True},
          "untied": {"tie_embeddings": False}, "softcap": {"logit_softcap": 15.0}, "wsd": {}}


@functools.cache
def multirun_config() -> DictConfig:
    """`python train.py -m +experiment=ablation`'s own config, resolved as the multirun's start resolves it."""
    cfg = compose_config(["+experiment=ablation"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    carry_swept_keys(cfg)  # the keys are now in cfg's resolver cache, which compose_run copies into each point's
    # and the resolver is again what a new interpreter has: a multirun in a fork of this process (test_multirun's,
    # data_helpers.run_script) resolves its own keys, not these
    OmegaConf.register_new_resolver("swept_keys", no_keys_outside_a_multirun, use_cache=True, replace=True)
    return cfg


@functools.cache  # each point is composed once per session, however many tests read it
def compose_run(*overrides: str) -> tuple[dict, dict]:
    """(the resolved job config, the resolved hydra.sweep and hydra.sweeper.params) of one sweep
    point, as train.py and Hydra's sweeper see them."""
    cfg = compose_config(overrides, return_hydra_config=True)
    OmegaConf.copy_cache(from_config=multirun_config(), to_config=cfg)  # as Hydra makes a job's config
    HydraConfig.instance().set_config(cfg)  # what Hydra does before a job: ${hydra:...} resolves
    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    sweep = {**cfg.hydra.sweep, "params": dict(cfg.hydra.sweeper.params)}  # resolved while this job's choices hold
    return OmegaConf.to_container(job, resolve=True), sweep


def sweep_points(experiment: str) -> list[list[str]]:
    """Every job of `python train.py -m +experiment=<experiment>`: the cartesian product of its
    hydra.sweeper.params, parsed with Hydra's own override parser."""
    _, sweep = compose_run(f"+experiment={experiment}")
    parser = OverridesParser.create()
    axes = []
    for key, values in sweep["params"].items():
        override = parser.parse_override(f"{key}={values}")
        values = override.sweep_string_iterator() if override.is_sweep_override() else [override.value()]
        axes.append([f"{key}={value}" for value in values])
    return [list(point) for point in itertools.product(*axes)]


def without_name(config: dict) -> dict:
    """The config minus what names a run (variant, wandb.name), to compare what it trains."""
    config = copy.deepcopy(config)
    del config["variant"], config["wandb"]["name"]
    return config


ABLATION = sweep_points("ablation")
# Each variant at seed 0, and the baseline at every seed: a variant's switches do not depend on its seed, and what the
# seed changes (train.seed, the run's name, its dir) is the same for every variant
CHECKED = [point for point in ABLATION if point[1] == "train.seed=0" or point[0] == "ablation=baseline"]
STUDY = json.loads((CONFIG_DIR.parent / "docs" / "ablation_lr.json").read_text())["variants"]
AFTER_LLAMA = json.loads((CONFIG_DIR.parent / "docs" / "ablation_modern.json").read_text())["variants"]
AFTER_GQA = json.loads((CONFIG_DIR.parent / "docs" / "ablation_mla.json").read_text())["variants"]  # MLA's study
AFTER_DENSE = json.loads((CONFIG_DIR.parent / "docs" / "ablation_moe.json").read_text())["variants"]  # MoE's study
WINDOWS = json.loads((CONFIG_DIR.parent / "docs" / "ablation_window.json").read_text())["variants"]  # windows' study
LINEAR = json.loads((CONFIG_DIR.parent / "docs" / "ablation_gdn.json").read_text())["variants"]  # Gated DeltaNet's
SPEEDRUN = json.loads((CONFIG_DIR.parent / "docs" / "speedrun_lr.json").read_text())["variants"]  # on modern_tiny
for later in (AFTER_LLAMA, AFTER_GQA, AFTER_DENSE, WINDOWS, LINEAR, SPEEDRUN):  # the recorded baseline stays; each later study adds its own lines
    STUDY |= {name: line for name, line in later.items() if name not in STUDY}


def test_the_ablation_sweeps_every_variant_over_three_seeds():
    assert sorted({point[0] for point in ABLATION}) == sorted(f"ablation={v}" for v in SWITCHES)
    assert sorted({point[1] for point in ABLATION}) == ["train.seed=0", "train.seed=1", "train.seed=2"]
    assert len(ABLATION) == 3 * len(SWITCHES)


@pytest.mark.parametrize("point", CHECKED, ids=lambda point: "-".join(point))
def test_each_sweep_point_differs_from_the_baseline_in_its_switch_only(point):
    variant, seed = point[0].split("=")[1], int(point[1].split("=")[1])
    if variant not in SWITCHES:
        pytest.fail(f"ablation={variant} is swept but has no expected switches in SWITCHES")
    config, sweep = compose_run("+experiment=ablation", *point)
    baseline, _ = compose_run("+experiment=ablation", "ablation=baseline", "train.seed=0")

    changed = {k: v for k, v in config["model"].items() if v != baseline["model"][k]}
    assert changed == SWITCHES[variant]
    expected = without_name(baseline)
    expected["model"] |= SWITCHES[variant]
    expected["train"] |= {"seed": seed, "lr": config["train"]["lr"], "min_lr": config["train"]["lr"] / 10,
                          **TRAIN_SWITCHES.get(variant, {})}
    if expected["train"]["optimizer"] == "muon":  # Muon's lr follows train.lr (configs/optim/muon.yaml)
        expected["train"]["muon_lr"] = config["train"]["lr"]
    assert without_name(config) == expected  # same data, budget, schedule, width, wandb group

    assert config["variant"] == variant
    assert config["wandb"]["name"] == f"ablation-{variant}-seed{seed}"
    assert config["wandb"]["group"] == "ablation"
    assert sweep["subdir"] == f"{variant}/train.seed={seed}"  # one dir per job, named by its overrides
    model = Transformer(ModelConfig.from_dict(config["model"] | {"vocab_size": config["data"]["vocab_size"]}))
    assert model.cfg.attention == config["model"]["attention"]


def test_seeds_of_a_variant_are_one_group_for_compare_and_variants_are_not():
    keys = {}
    for point in CHECKED:
        config, _ = compose_run("+experiment=ablation", *point)
        run = Run(Path("/".join(point)), config, [], {}, None)
        keys.setdefault(variant_key(run, SEED), set()).add(config["variant"])
    assert sorted(len(variants) for variants in keys.values()) == [1] * len(SWITCHES)


def test_every_ablation_config_is_a_variant_or_a_probe_line():
    assert sorted(p.stem for p in (CONFIG_DIR / "ablation").glob("*.yaml")) == sorted({**SWITCHES, **PROBES})
    # what sweep.py and bench.py --ablation run: the files, the baseline first
    assert ablation_variants() == ["baseline", *sorted({**SWITCHES, **PROBES}.keys() - {"baseline"})]


@pytest.mark.parametrize("variant", PROBES)
def test_a_probe_line_differs_from_the_baseline_in_its_switches_only(variant):
    config, _ = compose_run("+experiment=ablation", f"ablation={variant}")
    baseline, _ = compose_run("+experiment=ablation", "ablation=baseline", "train.seed=0")
    assert {k: v for k, v in config["model"].items() if v != baseline["model"][k]} == PROBES[variant]
    assert {k: v for k, v in config["train"].items() if v != baseline["train"][k] and k not in ("lr", "min_lr",
                                                                                                   "muon_lr")} \
        == TRAIN_SWITCHES.get(variant, {})


@pytest.mark.parametrize("variant", {**SWITCHES, **PROBES})
def test_each_variant_trains_at_the_learning_rate_the_study_chose_for_it(variant):
    config, _ = compose_run("+experiment=ablation", f"ablation={variant}")
    assert config["train"]["lr"] == pytest.approx(STUDY[variant]["best_lr"])
    assert config["train"]["min_lr"] == pytest.approx(STUDY[variant]["best_lr"] / 10)
    finals = STUDY[variant]["final_bpb_seed0"]
    assert finals[f"{config['train']['lr']:g}"] == min(finals.values())


def test_post_norm_trains_at_its_own_learning_rate_not_the_baselines():
    """Post-Norm's unigram plateau is a learning-rate effect: at the baseline's (4e-3) the study's Post-Norm
    run ends on the unigram level; at its own it leaves it."""
    config, _ = compose_run("+experiment=ablation", "ablation=postnorm")
    finals, level = STUDY["postnorm"]["final_bpb_seed0"], json.loads(
        (CONFIG_DIR.parent / "docs" / "ablation_lr.json").read_text())["unigram_val_bpb"]
    assert finals[f"{config['train']['lr']:g}"] < level - 0.1
    assert finals[f"{STUDY['baseline']['best_lr']:g}"] > level - 0.01


def test_the_baseline_is_the_model_the_study_ran():
    """The recorded study (docs/ablation.md) trained this model: pinned in full, so that a change of ModelConfig's
    defaults (llama_tiny's sizes) or of a group file cannot move the ablation's baseline unseen."""
    config, _ = compose_run("+experiment=ablation", "ablation=baseline", "train.seed=0")
    assert config["model"] == {
        "name": "llama_ablation", "attention": "gqa", "d_model": 128, "n_layers": 4, "n_heads": 8, "n_kv_heads": 2,
        "context_length": 128, "norm": "rmsnorm", "norm_position": "pre", "position": "rope", "qk_norm": "none", "ffn": "swiglu",
        "ffn_multiple_of": 32, "rope_base": 10000.0, "rope_scaling": "none", "rope_factor": 1.0,
        "rope_original_context": None, "norm_eps": 1e-5, "dropout": 0.0, "bias": False,
        "tie_embeddings": True, "embedding_scale": "gpt2", "kv_rank": None, "q_rank": None, "rope_head_dim": None,
        "v_head_dim": None, "d_ff": None, "n_experts": None, "experts_per_token": None, "expert_d_ff": None,
        "n_shared_experts": 0, "dense_layers": 0, "router": "softmax", "router_aux_coef": 0.0, "router_z_coef": 0.0,
        "router_bias_rate": 0.0, "window": None, "window_pattern": "all", "sinks": False, "attention_gate": False,
        "rotary_fraction": 1.0, "linear_pattern": None, "linear_key_heads": None, "linear_value_heads": None,
        "linear_head_dim": None, "linear_conv": 4, "linear_chunk": 64, "linear_delta_rule": True,
        "logit_softcap": None, "value_embeddings": None, "residual_scalars": False}
    assert config["data"]["vocab_size"] == 4096
    model = Transformer(ModelConfig.from_dict(config["model"] | {"vocab_size": 4096}))
    block = 2 * 128 + 128 * (8 + 2 * 2) * 16 + 128 * 128 + 3 * 128 * 352  # norms, qkv, out, SwiGLU's d_ff 352
    assert model.num_params() == 4 * block + 4096 * 128 + 128 == 1_229_952  # docs/ablation.md: 1.23 M parameters


@pytest.mark.parametrize("variant, peer", [("mla", "baseline"), ("mla_small", "mqa")])
def test_each_mla_line_has_the_baselines_parameters_and_a_cache_no_larger_than_its_peers(variant, peer):
    """docs/ablation.md's MLA table: `mla` caches no more than GQA (the baseline), `mla_small` no more than MQA,
    each within 0.05% of the baseline's parameters."""
    def model(name):
        config, _ = compose_run("+experiment=ablation", f"ablation={name}")
        return Transformer(ModelConfig.from_dict(config["model"] | {"vocab_size": config["data"]["vocab_size"]}))

    line, baseline, peer_model = model(variant), model("baseline"), model(peer)
    assert abs(line.num_params() - baseline.num_params()) < 5e-4 * baseline.num_params()
    assert line.kv_cache_bytes_per_token(torch.float32) == peer_model.kv_cache_bytes_per_token(torch.float32)
