"""bench.py end to end at toy sizes (--quick): every figure is written, the FLOP and weight-byte counts
equal hand counts, and the printed verdicts are the JSON's; not the speeds, which only mean something
in a full run on a quiet machine."""
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import bench
from benchmarks import state_decode
from benchmarks.against import OtherTree, against_peers, against_tables, bench_against
from benchmarks.sizes import LONG_FACTOR, full_sizes, long_sizes, quick_sizes
from benchmarks.timing import Device, speed_rows, speed_table
from benchmarks.train_steps import COMPILED, Peer, ablation_peers, tokens_per_step, training_peers
from data_helpers import ROOT, run_script
from errors import UsageError
from model import Transformer
from model.mla import LatentAttention
from settings import ablation_variants
from training.config import model_config

THROUGHPUTS = ["decode_tokens_per_s", "hf_decode_tokens_per_s", "decode_b2_tokens_per_s", "hf_decode_b2_tokens_per_s",
               "nocache_decode_tokens_per_s", "prefill_tokens_per_s", "hf_prefill_tokens_per_s", "peak_gflops",
               "memory_bandwidth_gb_per_s"]
PEERS = ["llama_tiny", "llama_tiny, train.compile=true", "GPT-2 configuration", "transformers LlamaForCausalLM",
         "transformers GPT2LMHeadModel", "llama_tiny norm=layernorm", "llama_tiny position=learned",
         "llama_tiny attention=mha", "llama_tiny ffn=gelu"]
UNCOMPILED = [name for name in PEERS if name != COMPILED]


def test_quick_run_writes_every_figure(tmp_path):
    """Without its compiled rows: the suite's one torch.compile test is generate.py's (tests/test_generate.py), and
    compiling three graphs took longer than the rest of this test; a full bench.py run compiles them."""
    out, png = tmp_path / "bench.json", tmp_path / "decode.png"
    # One thread: on a shared 2-core machine two OpenMP threads per process stall each other for seconds.
    proc = run_script(ROOT / "bench.py", "--quick", "--no-compile", "--threads", "1", "--repeats", "1",
                      "--json", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())

    for key in THROUGHPUTS:
        assert math.isfinite(result[key]) and result[key] > 0, key
    training = result["training"]
    assert list(training) == UNCOMPILED
    assert not [key for key in result if "compile" in key] and "torch.compile" not in proc.stdout
    tps = {name: row["tokens_per_s"] for name, row in training.items()}
    assert all(math.isfinite(t) and t > 0 for t in tps.values())
    for name, row in training.items():
        low, high = row["tokens_per_s_range"]
        assert low <= row["tokens_per_s"] <= high, name
        assert 0 < row["mfu"] < 1, name  # a share of the measured peak
    # Quick dims: vocab 256, d 64, 4 layers, 4 heads of 16 dims, 2 K/V heads, SwiGLU d_ff 192, context 32;
    # the GPT-2 configuration: 4 K/V heads, GELU d_ff 256.
    llama = 4 * (64 * (4 + 2 * 2) * 16 + 64 * 64 + 3 * 64 * 192) + 256 * 64  # + the tied LM head
    gpt2 = 4 * (3 * 64 * 64 + 64 * 64 + 2 * 64 * 256) + 256 * 64
    attention = 3 * 4 * (2 * 2 * 64 * 33 / 2)  # x3, 4 layers, q k^T and att v over (T + 1) / 2 keys on average
    assert training["llama_tiny"]["flops_per_token"] == 6 * llama + attention
    assert training["transformers LlamaForCausalLM"]["flops_per_token"] == 6 * llama + attention
    assert training["GPT-2 configuration"]["flops_per_token"] == 6 * gpt2 + attention
    assert training["transformers GPT2LMHeadModel"]["flops_per_token"] == 6 * gpt2 + attention
    n_params = 256 * 64 + 4 * (2 * 64 + 64 * (4 + 2 * 2) * 16 + 64 * 64 + 3 * 64 * 192) + 64  # norms' gains too
    assert result["weight_bytes"] == 4 * n_params
    # every target in benchmarks.tables.TARGETS whose rows ran is judged, and the printed table says what the JSON says
    assert set(result["targets_met"]) == {"train_vs_gpt2", "train_vs_hf_llama", "decode_ratio", "decode_vs_limit",
                                          "cache_vs_nocache"}
    verdicts = [line.rsplit("|", 2)[1].strip() for line in proc.stdout.splitlines() if ": met |" in line
                or ": NOT met |" in line]
    assert [v.endswith(": met") for v in verdicts] == list(result["targets_met"].values())
    # Same weights on both sides, greedy: the two implementations must pick the same tokens.
    assert result["decode_same_tokens"] and result["decode_b2_same_tokens"]
    assert result["threads"] == 1 and result["dtype"] == "fp32" and result["quick"]
    for name in UNCOMPILED:
        assert f"| {name} | " in proc.stdout
    assert "| decode, batch 1, 8 new: " in proc.stdout and "/ the weight-streaming limit " in proc.stdout
    assert "| training: llama_tiny / GPT-2 configuration, eager | " in proc.stdout
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu"], "error: --device='tpu' must be cpu or cuda"),
    (["--threads", "0"], "error: --threads=0 must be >= 1"),
    (["--json", "no/such/dir/out.json"], "error: --json=no/such/dir/out.json: directory no/such/dir does not exist"),
    (["model.d_model=abc"], "error: Error merging override model.d_model=abc: Value 'abc' of type 'str' could not be "
                            "converted to Integer"),
    (["model.n_heads=3"], "error: model.n_heads=3 must divide model.d_model=128"),
    (["train.lr=-1"], "error: train.lr=-1.0 must be a positive number"),
    (["--ablation", "--caches"], "error: --ablation and --caches are separate benches: pass one of them"),
    (["--caches", "--streaming"], "error: --caches and --streaming are separate benches: pass one of them"),
    (["--long"], "error: --long is a setting of --caches: pass both"),
])
def test_bad_flags_stop_before_measuring(argv, message, capsys):
    assert bench.main(argv) == 2
    assert capsys.readouterr().err.strip() == message


OVERRIDES = ["model.norm_eps=1e-3", "train.lr=0.0123", "train.betas=[0.8,0.9]"]


def norm_eps_of(model: nn.Module) -> set[float]:
    """The eps of every norm layer that model.norm_eps sets, ours (model/norms.py), transformers' LLaMA's and GPT-2's
    (QKNorm holds two RMSNorms, each counted, and has no eps of its own). MLA's latent norms keep DeepSeek's 1e-6
    whatever model.norm_eps (model/mla.py): not counted."""
    latent = {id(m) for attn in model.modules() if isinstance(attn, LatentAttention)
              for m in (attn.kv_norm, attn.q_norm) if m is not None}
    return {getattr(m, "eps", getattr(m, "variance_epsilon", None)) for m in model.modules()
            if "Norm" in type(m).__name__ and type(m).__name__ != "QKNorm" and id(m) not in latent}


def assert_settings_reached(peer: Peer) -> None:
    assert norm_eps_of(peer.model) == {1e-3}
    adamw = [g for g in peer.optimizer.param_groups if "betas" in g]
    assert [(g["lr"], g["betas"]) for g in adamw] == [(0.0123, (0.8, 0.9))] * 2
    # optim=muon's group (the muon and modern variants) follows train.lr too
    assert [g["lr"] for g in peer.optimizer.param_groups if "betas" not in g] in ([], [0.0123])


def test_training_peers_are_built_from_every_override():
    peers = training_peers(quick_sizes(OVERRIDES), Device("cpu"))
    assert list(peers) == PEERS
    for name, peer in peers.items():
        assert_settings_reached(peer)
        assert peer.tokens.shape == (2, 33), name  # the quick train.batch_size, its context + 1
    assert peers["llama_tiny"].model.cfg.norm_eps == 1e-3
    # the GPT-2 configuration's K/V heads come from configs/attention/mha.yaml: one per query head
    assert (peers["llama_tiny"].model.cfg.n_kv_heads, peers["GPT-2 configuration"].model.cfg.n_kv_heads) == (2, 4)
    assert peers["llama_tiny attention=mha"].model.cfg.n_kv_heads == 4
    assert training_peers(quick_sizes([]), Device("cpu"))["llama_tiny"].optimizer.param_groups[0][
        "lr"] == 2.5e-3  # without the override: configs/config.yaml's


def test_ablation_peers_are_built_from_every_override():
    peers = ablation_peers(quick_sizes(OVERRIDES), Device("cpu"))
    assert list(peers) == ablation_variants()
    for peer in peers.values():
        assert_settings_reached(peer)  # train.lr beats each variant's own learning rate
    assert peers["transformer2017"].model.cfg.embedding_scale == "transformer2017"


def test_speed_rows_run_one_way():
    peers = {name: Peer(None, None, None, None, torch.zeros(2, 11)) for name in ("base", "fast", "slow")}
    assert tokens_per_step(peers) == {"base": 20, "fast": 20, "slow": 20}
    rows = speed_rows({"base": [1.0, 2.0, 3.0], "fast": [1.0], "slow": [4.0, 4.0]}, tokens_per_step(peers),
                            "base")
    assert rows["base"]["tokens_per_s"] == 10.0 and rows["base"]["tokens_per_s_range"] == [20 / 3, 20.0]
    assert [rows[name]["vs_baseline"] for name in peers] == [1.0, 2.0, 0.5]  # faster than the baseline: above 1
    table = speed_table(rows, "model", "base", {"step s": lambda row: f"{row['step_s'][0]:.1f}"})
    assert table.splitlines() == ["| model | training tokens/s (median) | min - max | step s | vs base |",
                                  "|---|---:|---:|---:|---:|",
                                  "| base | 10 | 7 - 20 | 1.0 | 1.000x |",
                                  "| fast | 20 | 20 - 20 | 1.0 | 2.000x |",
                                  "| slow | 5 | 5 - 5 | 4.0 | 0.500x |"]


def test_ablation_mode_times_every_variant_against_the_baseline(tmp_path):
    out = tmp_path / "speed.json"
    proc = run_script(ROOT / "bench.py", "--ablation", "--quick", "--threads", "1", "--repeats", "1",
                      "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    speeds = json.loads(out.read_text())
    assert list(speeds) == ablation_variants()
    assert speeds["baseline"]["vs_baseline"] == 1.0
    for variant, r in speeds.items():
        low, high = r["tokens_per_s_range"]
        assert 0 < low <= r["tokens_per_s"] <= high, variant
        assert f"| {variant} | {r['tokens_per_s']:,.0f} |" in proc.stdout


@pytest.mark.parametrize("long", [False, True])
def test_caches_mode_decodes_with_each_kind_of_cache_against_gqa(long, tmp_path, capsys):
    out = tmp_path / "caches.json"
    assert bench.main(["--caches", *["--long"] * long, "--quick", "--threads", "1", "--repeats", "1", "--json",
                       str(out)]) == 0
    printed, results = capsys.readouterr().out, json.loads(out.read_text())
    assert list(results) == ["batch 1", "batch 2"] and all(list(rows) == ["gqa", "mqa", "mla"]
                                                           for rows in results.values())
    # --quick's 4 layers of 4 heads of 16 dims, fp32: GQA's 2 K/V heads, MQA's 1, MLA's 64 + 8 (kv_rank, d_R)
    sizes = {"gqa": 4 * 2 * 2 * 16 * 4, "mqa": 4 * 2 * 1 * 16 * 4, "mla": 4 * (64 + 8) * 4}
    # the prompt and the new tokens: 4 + 8, or with --long the quick context of 32 stretched 4x, filled
    positions = 4 * 32 if long else 4 + 8
    for batch, rows in results.items():
        assert rows["gqa"]["vs_baseline"] == 1.0
        for kind, row in rows.items():
            low, high = row["tokens_per_s_range"]
            assert 0 < low <= row["tokens_per_s"] <= high and row["cache_bytes_per_token"] == sizes[kind]
            assert row["cache_bytes"] == sizes[kind] * positions * int(batch.split()[1])
            assert row["weight_bytes"] == 4 * row["num_params"]
            assert f"| {kind} | {row['tokens_per_s']:,.0f} | {low:,.0f} - {high:,.0f} | {sizes[kind]:,} |" in printed


def test_streaming_mode_generates_past_the_context_three_ways(tmp_path, capsys):
    """--streaming --quick: 3 contexts of new tokens at batch 1 and 2, sliding, with sink tokens and in a windowed
    model's cache; the windowed model's cache holds a quarter of the positions in every layer (its window, 8 of the
    quick context's 32), the other two the whole context."""
    out = tmp_path / "streaming.json"
    assert bench.main(["--streaming", "--quick", "--threads", "1", "--repeats", "1", "--json", str(out)]) == 0
    printed, results = capsys.readouterr().out, json.loads(out.read_text())
    assert list(results) == ["batch 1", "batch 2"] and all(list(rows) == ["slide", "sinks", "window"]
                                                           for rows in results.values())
    for batch, rows in results.items():
        full = 2 * 4 * 2 * 16 * 32 * int(batch.split()[1]) * 4  # K and V, 4 layers, 2 K/V heads of 16, 32 positions
        assert [row["cache_bytes"] for row in rows.values()] == [full, full, full // 4]
        assert rows["slide"]["vs_baseline"] == 1.0
        for way, row in rows.items():
            low, high = row["tokens_per_s_range"]
            assert 0 < low <= row["tokens_per_s"] <= high
            assert f"| {way} | {row['tokens_per_s']:,.0f} | {low:,.0f} - {high:,.0f} | {row['cache_bytes']:,} |" \
                in printed


def test_long_stretches_the_presets_context_with_yarn_and_fills_it():
    sizes = long_sizes(full_sizes([]), LONG_FACTOR)
    model = model_config(sizes.compose())
    assert (model.context_length, model.original_context, model.rope_scaling, model.rope_factor) == (
        4096, 128, "yarn", 32)
    assert (sizes.decode_context, sizes.prompt_tokens + sizes.new_tokens) == (4096, 4096)


def checkout_copy(tmp_path: Path) -> Path:
    """Another checkout, as --against reads it: a copy of the packages its rows import."""
    root = tmp_path / "other"
    for name in ("model", "tasks", "training", "generation"):  # tasks/: training/evaluate.py's IGNORE
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("errors.py", "parsing.py"):  # the base modules model/ imports
        shutil.copy(ROOT / name, root)
    return root


def test_against_times_this_tree_beside_another_checkout_on_the_same_weights(tmp_path):
    root = checkout_copy(tmp_path)
    other = OtherTree.load(root)
    assert Path(other.transformer.forward.__code__.co_filename).is_relative_to(root)  # from the other tree's files
    assert sys.modules["model"].Transformer is Transformer  # and this tree's modules are back
    sizes, cpu = quick_sizes([]), Device("cpu")
    peers = against_peers(other, sizes.compose(), cpu)  # checks that both give the same logits
    assert peers[str(root)].tokens is peers["this tree"].tokens
    assert torch.equal(peers[str(root)].model.lm_head.weight, peers["this tree"].model.lm_head.weight)
    r = bench_against(other, peers, sizes, 1, cpu)
    for key in ("training", "decode_b1", "decode_b2"):
        assert list(r[key]) == ["this tree", str(root)] and r[key][str(root)]["vs_baseline"] == 1.0
    assert r["decode_b1_same_tokens"] and r["decode_b2_same_tokens"]
    table = against_tables(r, sizes)
    assert f"| this tree | {r['decode_b2']['this tree']['tokens_per_s']:,.0f} |" in table


def test_against_refuses_a_tree_that_cannot_build_the_same_model(tmp_path, capsys):
    root = checkout_copy(tmp_path)
    config = root / "model" / "config.py"
    config.write_text(re.sub(r"\n    embedding_scale: .*", "", config.read_text()))  # a tree from before the setting
    assert bench.main(["--quick", "--against", str(root), "model.embedding_scale=transformer2017"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --against={root}: its ModelConfig has no model.embedding_scale=transformer2017")
    assert bench.main(["--quick", "--against", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --against={tmp_path} is no checkout of this repo: it has no model/__init__.py")


def test_against_refuses_a_tree_whose_model_computes_other_logits(tmp_path):
    root = checkout_copy(tmp_path)
    transformer = root / "model" / "transformer.py"
    source = transformer.read_text()
    assert "        x = self.tok_emb(tokens)\n" in source
    transformer.write_text(source.replace("        x = self.tok_emb(tokens)\n", "        x = 2 * self.tok_emb(tokens)\n"))
    with pytest.raises(UsageError, match=r"its model's logits differ from this tree's by .* it is another model"):
        against_peers(OtherTree.load(root), quick_sizes([]).compose(), Device("cpu"))


def test_the_state_decode_bench_times_each_model_at_each_context(tmp_path, capsys):
    """benchmarks/state_decode.py at two short contexts: every model's row, its cache bytes as the model counts them
    (an all-linear model's the same at both), each one's growth over the rounds within its range, llama_tiny's growth
    the unit of the others'."""
    out = tmp_path / "state.json"
    assert state_decode.main(["--contexts", "8", "32", "--steps", "2", "--repeats", "2", "--threads", "1",
                              "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert list(results) == ["llama_tiny", "llama_tiny, 1 layer", "qwen35_tiny (3:1)", "all linear"]
    linear = results["all linear"]["contexts"]
    assert linear["8"]["cache_bytes"] == linear["32"]["cache_bytes"] > 0
    llama = results["llama_tiny"]["contexts"]
    assert llama["32"]["cache_bytes"] == 4 * llama["8"]["cache_bytes"]
    assert results["llama_tiny, 1 layer"]["contexts"]["32"]["cache_bytes"] == llama["32"]["cache_bytes"] // 4
    assert results["llama_tiny"]["growth_vs_llama_tiny"] == 1.0
    printed = capsys.readouterr().out
    for name, row in results.items():
        for at in row["contexts"].values():
            assert 0 < at["ms_range"][0] <= at["ms_per_token"] <= at["ms_range"][1]
        low, high = row["growth_range_ms"]
        assert low <= row["growth_ms"] <= high
        assert f"| {name} | " in printed
    assert state_decode.main(["--contexts", "8"]) == 2
    assert capsys.readouterr().err.strip() == "error: --contexts 8: at least two different positive lengths"
