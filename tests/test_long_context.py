"""Past the trained context: positions at any length, RoPE scaling (model/rope_scaling.py) against transformers'
own, evaluate.py's chunked and sliding scores, a run from another run's weights (train.init_from), generation
with a longer context, the GGUF keys, and the refusals."""
import hashlib
import json
import math
import resource
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import evaluate
import generate
from study import lengths as length_study
from data_helpers import metrics, run_train, summary, train_in_process
from errors import ConfigError
from insight.lengths import position_nats, run_val_split, score
from interop.hf import hf_config
from interop.load import load_model
from interop_helpers import VOCAB, llama_cfg, one_error_line, run_export
from model.config import ModelConfig
from model.positions import PositionsError, Rotary, sinusoidal_table
from model.rope_scaling import ntk_base
from model.transformer import Transformer
from scripts import window_lengths
from storage.checkpoint import save_checkpoint
from training.evaluate import next_token_loss
from weights import far_from_init

SCALED = ["linear", "ntk", "dynamic", "yarn"]
L0 = 16  # the trained context of the parity tests' models: their sequences run to 4 L0


def scaled_cfg(scaling: str, **changes) -> ModelConfig:
    return llama_cfg(context_length=L0, rope_scaling=scaling, rope_factor=1.0 if scaling == "none" else 4.0,
                     **changes)


def halves_as_transformers(rotary: Rotary, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Our tables in transformers' form: cos as it is, sin without rotate_half's sign (positions.py)."""
    half = rotary.head_dim // 2
    return rotary.cos[:length], torch.cat([-rotary.sin[:length, :half], rotary.sin[:length, half:]], dim=-1)


@pytest.mark.parametrize("head_dim", [8, 32])
@pytest.mark.parametrize("scaling", ["none", *SCALED])
def test_rope_tables_equal_transformers_past_the_original_context(scaling, head_dim):
    cfg = scaled_cfg(scaling, d_model=4 * head_dim)
    hf = LlamaConfig(**{k: v for k, v in hf_config(cfg).items() if k != "architectures"})
    length = 4 * L0
    theirs = LlamaRotaryEmbedding(hf)(torch.zeros(1, length, head_dim), torch.arange(length)[None])
    rotary = Rotary(head_dim, L0, cfg.rope_base, scaling, cfg.rope_factor, cfg.original_context)
    rotary.fit(length)
    for ours, expected in zip(halves_as_transformers(rotary, length), theirs):
        assert (ours.double() - expected[0].double()).abs().max().item() <= 1e-10
    # and the scaling changes the angles past L0 (a scaling that did nothing would pass the line above too)
    plain = Rotary(head_dim, length, cfg.rope_base)
    assert torch.equal(rotary.cos, plain.cos) == (scaling == "none")


@pytest.mark.parametrize("scaling", SCALED)
def test_logits_equal_transformers_at_4x_the_original_context(tmp_path, tokenizer_file, scaling):
    model = far_from_init(Transformer(scaled_cfg(scaling)))
    save_checkpoint(tmp_path / "ckpt", model, tokenizer_file)
    assert run_export("--ckpt", tmp_path / "ckpt", "--out", tmp_path / "hf") == 0
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(VOCAB, (2, 4 * L0), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, expected = model(tokens), theirs(tokens).logits
    # float32 both sides, the same ops in the same order (tests/test_interop.py): 1e-5 is ~10 float32 steps of
    # the largest logits (~10); a wrong frequency at one pair moves logits of std > 1 by O(1)
    assert expected.std() > 1
    assert (logits - expected).abs().max().item() <= 1e-5
    # and back: the exported directory loads here under the same scaling
    reloaded, _ = load_model(tmp_path / "hf")
    with torch.no_grad():
        assert torch.equal(reloaded(tokens), logits)


def test_a_yarn_fine_tune_exports_its_original_context():
    cfg = llama_cfg(context_length=64, rope_scaling="yarn", rope_factor=4.0, rope_original_context=16)
    config = hf_config(cfg)
    assert config["max_position_embeddings"] == 64
    assert config["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                         "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "truncate": True}
    assert config["rope_scaling"]["original_max_position_embeddings"] == 16  # transformers 4.x's key
    ntk = hf_config(llama_cfg(rope_scaling="ntk", rope_factor=4.0))["rope_parameters"]
    assert ntk == {"rope_type": "default", "rope_theta": 500.0 * 4.0 ** (8 / 6)}  # head dim 8: s^(D/(D-2))


@pytest.mark.parametrize("scaling", ["none", *SCALED])
def test_the_kv_cache_equals_recomputation_past_the_context_in_float64(scaling):
    model = far_from_init(Transformer(scaled_cfg(scaling))).double()
    length, prompt = 4 * L0, 5
    tokens = torch.randint(VOCAB, (2, length), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_kv_cache(2, length)  # dynamic NTK scales a cached sequence at the cache's length
        steps = [model(tokens[:, :prompt], 0, cache)]
        steps += [model(tokens[:, t:t + 1], t, cache) for t in range(prompt, length)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-10


def test_growing_the_tables_leaves_the_default_model_bit_identical():
    model = far_from_init(Transformer(llama_cfg()))  # context 64
    tokens = torch.randint(VOCAB, (1, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = model(tokens)
        longer = model(torch.cat([tokens, tokens], dim=1))  # 128 positions: the tables grow
        assert model.rotary.length == 128
        assert torch.equal(model(tokens), before)
    assert torch.equal(Rotary(8, 128, 500.0).cos[:64], Rotary(8, 64, 500.0).cos)
    assert longer.shape == (1, 128, VOCAB)


@pytest.mark.parametrize("position", ["sinusoidal", "none"])
def test_absolute_and_no_positions_run_past_the_context(position):
    model = Transformer(llama_cfg(position=position, context_length=16)).eval()
    with torch.no_grad():
        logits = model(torch.randint(VOCAB, (1, 40), generator=torch.Generator().manual_seed(5)))
    assert logits.isfinite().all()
    if position == "sinusoidal":
        assert torch.equal(model.abs_pos.table, sinusoidal_table(40, 32))


def test_a_learned_table_refuses_positions_past_its_rows():
    model = Transformer(llama_cfg(position="learned", context_length=16))
    with pytest.raises(PositionsError, match="model.position=learned has a table of 16 positions"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("changes, message", [
    ({"rope_scaling": "xpos"}, "model.rope_scaling='xpos' must be one of none, linear, ntk, dynamic, yarn"),
    ({"rope_scaling": "yarn", "rope_factor": 1.0}, "model.rope_factor=1.0 must be > 1 with model.rope_scaling=yarn"),
    ({"rope_scaling": "linear", "rope_factor": 0.5}, "model.rope_factor=0.5 must be > 1"),
    ({"rope_factor": 2.0}, "model.rope_factor=2.0 does nothing with model.rope_scaling=none"),
    ({"rope_scaling": "ntk", "rope_factor": 2.0, "position": "sinusoidal"},
     "model.rope_scaling=ntk scales RoPE's frequencies, but model.position=sinusoidal"),
    ({"rope_original_context": 65}, "model.rope_original_context=65 must be an integer in [2, model.context_length=64]"),
])
def test_bad_scaling_settings_are_refused_by_name(changes, message):
    with pytest.raises(ConfigError) as raised:
        llama_cfg(**changes)
    assert message in str(raised.value)


# --- evaluate.py: chunked and sliding ---------------------------------------------------------------

def test_chunked_and_sliding_score_each_token_once():
    model = far_from_init(Transformer(llama_cfg(context_length=64))).double()
    stream = np.random.default_rng(0).integers(0, VOCAB, 1000)
    chunked = score(model, stream, 64, "chunked", 0, bucket=16, bytes_per_token=1.0)
    sliding = score(model, stream, 64, "sliding", 16, bucket=16, bytes_per_token=1.0)
    # 1000 tokens hold 15 windows of 64 + 1 at stride 64 (the last starts at 896), 59 at stride 16 (at 928)
    assert (chunked["windows"], chunked["tokens"]) == (15, 15 * 64)
    assert (sliding["windows"], sliding["tokens"]) == (59, 64 + 58 * 16)
    assert [b["tokens"] for b in chunked["buckets"]] == [15 * 16] * 4
    assert [b["tokens"] for b in sliding["buckets"]] == [16, 16, 16, 59 * 16]  # later windows score their last 16
    # chunked is the mean of training's own loss over the same windows
    windows = torch.from_numpy(np.stack([stream[a:a + 65] for a in range(0, 897, 64)]))
    with torch.no_grad():
        expected = next_token_loss(model, windows[:, :-1], windows[:, 1:]).item() / math.log(2)
    assert abs(chunked["val_bpb"] - expected) <= 1e-12
    # a stride of the whole length is the chunked cut
    nats, counts = position_nats(model, stream, 64, "sliding", 64)
    assert counts.sum() == chunked["tokens"] and abs(nats.sum() / counts.sum() / math.log(2) - expected) <= 1e-12


def test_streaming_scores_a_windowed_model_as_one_forward_and_a_full_one_past_its_cache():
    """The streaming mode at 4x the context: a model whose layers are all local reads each position in its rolling
    cache as one forward over the window reads it (the band), so its per-position nats are chunked's to 1e-10 in
    float64; a model of full layers with 2 sink tokens matches chunked up to its cache of 32 positions and departs
    after (it sees fewer tokens), the first positions scored as many times either way."""
    stream = np.random.default_rng(1).integers(0, VOCAB, 700)
    windowed = far_from_init(Transformer(llama_cfg(context_length=32, window=8))).double()
    windowed.fit_positions(128)
    chunked = position_nats(windowed, stream, 128, "chunked", 0)
    streamed = position_nats(windowed, stream, 128, "streaming", 0)
    np.testing.assert_allclose(streamed[0], chunked[0], rtol=1e-10, atol=1e-10)
    assert (streamed[1] == chunked[1]).all() and chunked[1].sum() == 5 * 128
    full = far_from_init(Transformer(llama_cfg(context_length=32))).double()
    full.fit_positions(128)
    chunked = position_nats(full, stream, 128, "chunked", 0)
    streamed = position_nats(full, stream, 128, "streaming", 0, sink_tokens=2)
    np.testing.assert_allclose(streamed[0][:32], chunked[0][:32], rtol=1e-10, atol=1e-10)  # nothing evicted yet
    assert np.abs(streamed[0][32:] - chunked[0][32:]).min() > 1e-6  # position 32 replaces position 2


@pytest.fixture(scope="module")
def source_run(workdir, tiny):
    run_dir = workdir / "source"
    assert run_train(run_dir, *tiny).returncode == 0
    return run_dir


def test_evaluate_writes_both_modes_per_length_and_a_figure(source_run, tmp_path):
    out = tmp_path / "lengths.json"
    assert evaluate.main(["--ckpt", str(source_run), "--lengths", "32,64", "--stride", "16", "--json", str(out),
                          "--max-tokens", "400"]) == 0
    result = json.loads(out.read_text())
    assert [(r["length"], r["mode"], r["stride"]) for r in result["results"]] == [
        (32, "chunked", None), (32, "sliding", 16), (64, "chunked", None), (64, "sliding", 16)]
    assert result["context_length"] == 32 and result["rope_scaling"] == "none"
    for r in result["results"]:
        assert r["buckets"][0]["start"] == 0 and r["buckets"][-1]["end"] == r["length"]
        assert sum(b["tokens"] for b in r["buckets"]) == r["tokens"]
        assert 0 < r["val_bpb"] < 20
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # under YaRN the same windows score differently past the context, and the JSON says which scaling
    assert evaluate.main(["--ckpt", str(source_run), "--lengths", "64", "--mode", "chunked", "--rope-scaling",
                          "yarn", "--rope-factor", "2", "--json", str(out), "--max-tokens", "400"]) == 0
    yarn = json.loads(out.read_text())
    assert (yarn["rope_scaling"], yarn["rope_factor"]) == ("yarn", 2.0)
    assert yarn["results"][0]["val_bpb"] != result["results"][2]["val_bpb"]


def test_evaluate_streams_past_the_context_with_sink_tokens(source_run, tmp_path):
    """--mode streaming at 4x the context, with 4 sink tokens and with the window alone: each scores every token of
    its windows, the JSON names the sinks, and past the cache the two differ."""
    scores = {}
    for sinks in ("4", "0"):
        out = tmp_path / f"streaming{sinks}.json"
        assert evaluate.main(["--ckpt", str(source_run), "--lengths", "128", "--mode", "streaming", "--sink-tokens",
                              sinks, "--json", str(out), "--max-tokens", "400"]) == 0
        [result] = json.loads(out.read_text())["results"]
        assert (result["mode"], result["sink_tokens"], result["tokens"]) == ("streaming", int(sinks), 3 * 128)
        scores[sinks] = result
    assert scores["4"]["buckets"][0] == scores["0"]["buckets"][0]  # the prefilled context, the same in both
    assert scores["4"]["buckets"][-1]["val_bpb"] != scores["0"]["buckets"][-1]["val_bpb"]


def test_the_window_studys_lengths_pair_each_run_with_itself_and_resume(source_run, workdir, tiny, tmp_path,
                                                                        monkeypatch):
    """scripts/window_lengths.py on a study of two lines (the full source run; a twin whose one layer is local)
    at their best lr, seeds 0-2: 1x-8x chunked and sliding for both, streamed at 8x with 0 and 4 sink tokens for
    the full line and in its own rolling cache for the local one; each cost is the row's bpb less its run's chunked
    bpb at 1x. A second call reads the kept JSONs and scores nothing."""
    windowed = workdir / "windowed"
    if not (windowed / "summary.json").exists():
        assert run_train(windowed, *tiny, "model.window=8").returncode == 0
    study = tmp_path / "study"
    (study / "best_lr.json").parent.mkdir()
    (study / "best_lr.json").write_text(json.dumps({"full": 0.004, "local": 0.002}))
    for line, lr, run in (("full", "0.004", source_run), ("local", "0.002", windowed)):
        for seed in range(3):
            (study / line / f"lr{lr}").mkdir(parents=True, exist_ok=True)
            (study / line / f"lr{lr}" / f"seed{seed}").symlink_to(run)
    out = tmp_path / "lengths.json"
    window_lengths.main([str(study), "--json", str(out), "--max-tokens", "600"])
    result = json.loads(out.read_text())
    kinds = {(r["row"], r["length"], r["mode"], r["sink_tokens"]) for r in result["rows"]}
    assert kinds == {(line, n, mode, None) for line in ("full", "local") for n in (32, 64, 128, 256)
                     for mode in ("chunked", "sliding")} | {("full+stream0", 256, "streaming", 0),
                                                            ("full+stream4", 256, "streaming", 4),
                                                            ("local+stream", 256, "streaming", None)}
    assert len(result["rows"]) == 3 * len(kinds)
    bpb = {(r["row"], r["length"], r["mode"], r["seed"]): r["val_bpb"] for r in result["rows"]}
    cost = {(c["row"], c["length"], c["mode"]): c for c in result["cost"]}
    assert cost["full+stream4", 256, "streaming"]["mean"] == pytest.approx(
        bpb["full+stream4", 256, "streaming", 0] - bpb["full", 32, "chunked", 0], abs=1e-12)
    assert cost["local", 256, "sliding"]["mean"] == pytest.approx(
        bpb["local", 256, "sliding", 1] - bpb["local", 32, "chunked", 1], abs=1e-12)
    assert cost["full", 32, "chunked"] == {"row": "full", "length": 32, "mode": "chunked", "mean": 0.0, "std": 0.0}
    assert bpb["local", 256, "chunked", 0] != bpb["full", 256, "chunked", 0]  # the window is read from the run
    monkeypatch.setattr(length_study, "evaluate_and_write", lambda flags: pytest.fail(f"scored again: {flags}"))
    again = tmp_path / "again.json"
    window_lengths.main([str(study), "--json", str(again), "--max-tokens", "600"])
    assert json.loads(again.read_text()) == result


def test_window_lengths_pairs_each_row_with_its_own_seed_at_the_trained_context():
    """costs(): a row's bpb less the same line's and seed's chunked bpb at the context, then mean and sample std over
    the seeds: hand-computed on two seeds whose bpb differ."""
    def row(name, seed, length, mode, bpb):
        return {"row": name, "line": name.split("+")[0], "seed": seed, "length": length, "mode": mode, "context": 32,
                "val_bpb": bpb}
    rows = [row("a", 0, 32, "chunked", 2.0), row("a", 1, 32, "chunked", 3.0),
            row("a", 0, 64, "chunked", 2.5), row("a", 1, 64, "chunked", 3.1),
            row("a+stream0", 0, 64, "streaming", 2.25), row("a+stream0", 1, 64, "streaming", 2.75)]
    cost = {(c["row"], c["length"], c["mode"]): (c["mean"], c["std"]) for c in window_lengths.costs(rows)}
    assert cost["a", 32, "chunked"] == (0.0, 0.0)
    # two seeds' sample std is |x_0 - x_1| / sqrt(2)
    assert cost["a", 64, "chunked"] == pytest.approx((0.3, 0.4 / 2 ** 0.5))  # 0.5 and 0.1
    assert cost["a+stream0", 64, "streaming"] == pytest.approx((0.0, 0.5 / 2 ** 0.5))  # 0.25 and -0.25


@pytest.mark.parametrize("args, message", [
    (["--lengths", "64", "--sink-tokens", "4"], "--sink-tokens=4 is a setting of --mode streaming, not --mode both"),
    (["--lengths", "64", "--mode", "streaming"], "--mode streaming needs --sink-tokens (0: the window alone) for a "
                                                 "model with full layers"),
    (["--lengths", "64", "--mode", "streaming", "--sink-tokens", "32"], "--sink-tokens=32 must be an integer in "
                                                                        "[0, the cache's 32 positions)"),
    (["--lengths", "1"], "--lengths=1 must be >= 2"),
    (["--lengths", "32,x"], "--lengths=32,x must be integers"),
    (["--lengths", "32,٣"], "--lengths=32,٣ must be integers"),
    (["--lengths", "32,,64"], "--lengths=32,,64 must be integers"),
    (["--lengths", "32", "--rope-scaling", "yarn"], "--rope-scaling and --rope-factor go together"),
    (["--lengths", "32", "--rope-scaling", "yarn", "--rope-factor", "1"], "model.rope_factor=1.0 must be > 1"),
    (["--lengths", "32", "--stride", "40"], "--stride=40 is longer than the length 32"),
    (["--lengths", "300", "--mode", "training"], "--lengths=300 --mode training: training's eval set, "
                                                 "train.eval_tokens=256 tokens of a val split of"),
])
def test_evaluate_refuses_bad_flags_with_one_line(source_run, capsys, args, message):
    assert evaluate.main(["--ckpt", str(source_run), *args]) == 2
    assert message in one_error_line(capsys)


def test_evaluate_at_the_trained_length_equals_trainings_last_val_bpb(source_run, tmp_path, capsys):
    latest = tmp_path / "latest"  # as outputs/latest: evaluate.py names the run dir the link points at
    latest.symlink_to(source_run)
    out = tmp_path / "training.json"
    assert evaluate.main(["--ckpt", str(latest), "--lengths", "32", "--mode", "training", "--json", str(out)]) == 0
    assert f"checkpoint: {source_run.resolve()}" in capsys.readouterr().out.splitlines()
    ours = json.loads(out.read_text())["results"][0]
    logged = [m["val_bpb"] for m in metrics(source_run) if "val_bpb" in m][-1]
    assert summary(source_run)["val_bpb"] == logged
    assert (ours["windows"], ours["tokens"]) == (256 // 32, 256)  # train.eval_tokens=256 at the context of 32
    # Training sums each micro-batch's float32 mean loss (4 windows x 32 tokens), evaluate.py each token's float32
    # loss in float64: a float32 sum of n positive terms is within (n - 1) * 2^-24 of the exact one, relatively
    tolerance = (4 * 32 - 1) * 2**-24 * logged
    assert abs(ours["val_bpb"] - logged) <= tolerance
    # the default cut scores the split's first tokens in consecutive windows, not training's spread-out ones:
    # more tokens and another number (docs/long_context.md)
    assert evaluate.main(["--ckpt", str(source_run), "--lengths", "32", "--mode", "chunked", "--json", str(out)]) == 0
    chunked = json.loads(out.read_text())["results"][0]
    assert chunked["tokens"] > 256 and abs(chunked["val_bpb"] - logged) > 100 * tolerance


def test_evaluate_refuses_a_length_past_the_split_before_allocating(source_run, capsys):
    clock = time.perf_counter()  # growing RoPE's tables to 10^9 positions first took minutes, or the machine
    assert evaluate.main(["--ckpt", str(source_run), "--lengths", "1000000000", "--max-tokens", "2000000000"]) == 2
    assert time.perf_counter() - clock < 5
    n_val = len(run_val_split(source_run / "ckpt")[0])
    assert one_error_line(capsys) == (f"error: --lengths=1000000000: the val split's first --max-tokens=2000000000 "
                                      f"hold {n_val:,} tokens, fewer than a window of 1,000,000,000 + 1\n")


@pytest.mark.parametrize("flag", ["--json", "--plot"])
@pytest.mark.parametrize("where, reason", [("dir", "Is a directory"), ("missing/x", "No such file or directory"),
                                           ("file/x", "Not a directory")])
def test_evaluate_refuses_an_output_no_write_can_succeed_at_before_scoring(source_run, tmp_path, capsys, flag, where,
                                                                          reason):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    path = tmp_path / where
    assert evaluate.main(["--ckpt", str(source_run), "--lengths", "32", flag, str(path)]) == 2
    assert capsys.readouterr() == ("", f"error: cannot write {path}: {reason}\n")  # nothing loaded nor scored


@contextmanager
def small_files(limit: int):
    """Files may not grow past `limit` bytes inside the block, as on a full disk: a write past it fails with EFBIG
    (SIGXFSZ, which would kill the writer, ignored meanwhile)."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


def test_a_write_that_fails_keeps_the_files_as_they_were_and_the_results(source_run, tmp_path, capsys):
    out, png = tmp_path / "lengths.json", tmp_path / "lengths.png"
    args = ["--ckpt", str(source_run), "--lengths", "32", "--mode", "chunked", "--json", str(out)]
    assert evaluate.main(args) == 0
    before = {path: path.read_bytes() for path in (out, png)}
    capsys.readouterr()
    # no room for the JSON: it and the figure stay as they were, and the results come to stdout
    with small_files(64):
        code = evaluate.main([*args, "--bucket", "8"])
    printed, err = capsys.readouterr()
    assert (code, err) == (2, f"error: cannot write {out}: File too large\n")
    results = json.loads(printed[printed.index("{"):])
    assert [b["end"] for b in results["results"][0]["buckets"]] == [8, 16, 24, 32]
    assert {path: path.read_bytes() for path in (out, png)} == before
    # room for the JSON, not the figure: the new JSON, and the previous PNG whole (not truncated in place)
    with small_files(len(before[png]) // 2):
        code = evaluate.main([*args, "--bucket", "8"])
    assert (code, capsys.readouterr().err) == (2, f"error: cannot write {png}: File too large\n")
    assert json.loads(out.read_text()) == results and png.read_bytes() == before[png]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lengths.json", "lengths.png"]  # no temporary left


def test_evaluate_and_generate_refuse_a_learned_table_past_its_length(source_run, tokenizer_file, capsys, tmp_path):
    run_dir = tmp_path / "learned"  # refused before any scoring: the source run's data will do
    save_checkpoint(run_dir / "ckpt", Transformer(llama_cfg(position="learned", context_length=32)), tokenizer_file)
    (run_dir / "config.yaml").write_bytes((source_run / "config.yaml").read_bytes())
    assert evaluate.main(["--ckpt", str(run_dir), "--lengths", "64", "--json", str(tmp_path / "x.json")]) == 2
    assert "model.position=learned has a table of 32 positions" in one_error_line(capsys)
    assert not (tmp_path / "x.json").exists()
    assert generate.main(["--ckpt", str(run_dir), "--context", "64", "--device", "cpu"]) == 2
    assert "model.position=learned has a table of 32 positions" in one_error_line(capsys)


def test_generate_goes_past_the_trained_context_under_a_scaling(source_run, capsys):
    assert generate.main(["--ckpt", str(source_run), "--context", "96", "--rope-scaling", "yarn", "--rope-factor",
                          "3", "--max-new-tokens", "80", "--ignore-eos", "--seed", "0", "--device", "cpu"]) == 0
    # one cache of 81 positions (BOS + 80, the last token never fed back), no slide: 2 x 1 layer x 1 K/V head x
    # 16 dims x 80 positions x 4 bytes
    assert "KV cache 10,240 bytes" in capsys.readouterr().err


# --- train.init_from: PI's recipe -----------------------------------------------------------------

def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_a_run_from_another_runs_weights_trains_at_a_longer_context(source_run, workdir, tiny):
    before = tree_digest(source_run)
    run_dir = workdir / "longer"
    done = run_train(run_dir, *tiny, f"train.init_from={source_run}", "model.context_length=64",
                     "model.rope_scaling=linear", "model.rope_factor=2", "train.max_steps=2")
    assert done.returncode == 0, done.stderr
    assert tree_digest(source_run) == before  # the source run is left as it was
    model, _ = load_model(run_dir)
    assert (model.cfg.context_length, model.cfg.original_context, model.cfg.rope_scaling) == (64, 32, "linear")
    assert summary(run_dir)["steps"] == 2  # its own schedule, from step 0
    state = torch.load(run_dir / "ckpt" / "train_state.pt", weights_only=True)
    assert {s["step"].item() for s in state["optimizer"]["state"].values()} == {2.0}  # a fresh AdamW
    # the source's weights moved by 2 steps, not drawn again: every matrix is still close to the source's
    source, _ = load_model(source_run)
    for name, weight in model.state_dict().items():
        assert (weight - source.state_dict()[name]).abs().max().item() < 0.05, name


@pytest.mark.parametrize("override, message", [
    ("model.d_model=64", "model.d_model=64: train.init_from="),
    ("data.vocab_size=400", "data.vocab_size=400: train.init_from="),
])
def test_a_run_from_another_runs_weights_keeps_what_they_depend_on(source_run, workdir, tiny, override, message,
                                                                  monkeypatch, capsys):
    run_dir = workdir / f"refused-{override.split('=')[0]}"
    capsys.readouterr()
    assert train_in_process(run_dir, [*tiny, f"train.init_from={source_run}", override], monkeypatch) == 2
    assert message in one_error_line(capsys)
    assert not (run_dir / "ckpt").exists()


# --- GGUF ---------------------------------------------------------------------------------------------

def test_gguf_carries_linear_and_yarn_and_refuses_dynamic(tmp_path, tokenizer_file, capsys):
    for scaling in ("yarn", "ntk", "dynamic"):
        cfg = llama_cfg(context_length=64, rope_scaling=scaling, rope_factor=4.0, rope_original_context=16)
        save_checkpoint(tmp_path / scaling, far_from_init(Transformer(cfg)), tokenizer_file)
    assert run_export("--ckpt", tmp_path / "yarn", "--format", "gguf", "--out", tmp_path / "yarn.gguf") == 0
    fields = {k: f.contents() for k, f in GGUFReader(tmp_path / "yarn.gguf").fields.items()
              if k.startswith("llama.rope")}
    assert fields == {"llama.rope.dimension_count": 8, "llama.rope.freq_base": 500.0,
                      "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                      "llama.rope.scaling.original_context_length": 16, "llama.rope.scaling.finetuned": True,
                      "llama.rope.scaling.yarn_beta_fast": 32.0, "llama.rope.scaling.yarn_beta_slow": 1.0}
    # transformers' GGUF loader reads a LLaMA file's rope.freq_base (and drops rope.scaling.*: it rebuilds those for
    # gpt-oss files only), so NTK-aware, a base change, reaches it whole
    assert run_export("--ckpt", tmp_path / "ntk", "--format", "gguf", "--out", tmp_path / "ntk.gguf") == 0
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="ntk.gguf")
    assert theirs.config.rope_parameters["rope_theta"] == pytest.approx(ntk_base(500.0, 4.0, 8), rel=1e-6)
    capsys.readouterr()
    assert run_export("--ckpt", tmp_path / "dynamic", "--format", "gguf", "--out", tmp_path / "dynamic.gguf") == 2
    assert "model.rope_scaling=dynamic has no GGUF counterpart" in one_error_line(capsys)
    assert not (tmp_path / "dynamic.gguf").exists()
