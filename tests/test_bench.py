"""bench.py end to end at toy sizes (--quick): the JSON's keys and their arithmetic, not the speeds,
which only mean something in a full run on a quiet machine."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import bench

ROOT = Path(__file__).resolve().parents[1]
THROUGHPUTS = ["train_tokens_per_s", "hf_train_tokens_per_s", "compiled_train_tokens_per_s", "decode_tokens_per_s", "hf_decode_tokens_per_s",
               "decode_b2_tokens_per_s", "hf_decode_b2_tokens_per_s", "nocache_decode_tokens_per_s",
               "compiled_decode_tokens_per_s", "compiled_decode_b2_tokens_per_s",
               "prefill_tokens_per_s", "hf_prefill_tokens_per_s", "peak_gflops"]


def test_quick_run_writes_every_figure(tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "decode.png"
    # One thread: on a shared 2-core machine two OpenMP threads per process stall each other for seconds.
    proc = subprocess.run([sys.executable, "bench.py", "--quick", "--threads", "1", "--repeats", "1",
                           "--json", str(out), "--plot", str(png)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())

    for key in THROUGHPUTS:
        assert math.isfinite(result[key]) and result[key] > 0, key
    assert result["train_ratio"] == pytest.approx(result["train_tokens_per_s"] / result["hf_train_tokens_per_s"])
    assert result["compiled_train_ratio"] == pytest.approx(
        result["compiled_train_tokens_per_s"] / result["hf_train_tokens_per_s"])
    assert result["decode_ratio"] == pytest.approx(result["decode_tokens_per_s"] / result["hf_decode_tokens_per_s"])
    assert result["compiled_decode_ratio"] == pytest.approx(
        result["compiled_decode_tokens_per_s"] / result["hf_decode_tokens_per_s"])
    # the compiled engine's warm-up run compiles (seconds), its timed run reuses the graph
    assert result["compiled_decode_compile_s"] > 0.5 and result["compiled_decode_b2_compile_s"] > 0.5
    # likewise the compiled training step's warm-up: compiling forward and backward takes longer than any timed step
    assert result["compiled_train_compile_s"] > max(result["compiled_train_step_s"]) and len(
        result["compiled_train_step_s"]) == 1
    assert result["cache_vs_nocache"] == pytest.approx(
        result["decode_tokens_per_s"] / result["nocache_decode_tokens_per_s"])
    # Quick dims: vocab 256, d 64, 2 layers, 4 heads of 16 dims, 2 K/V heads, SwiGLU d_ff 192, context 32.
    qkv, out_proj, ffn = 64 * (4 + 2 * 2) * 16, 64 * 64, 3 * 64 * 192
    n_matmul = 2 * (qkv + out_proj + ffn) + 256 * 64  # + the tied LM head
    assert result["train_flops_per_token"] == 6 * n_matmul + 6 * 2 * 32 * 64
    assert result["mfu"] == pytest.approx(
        result["train_flops_per_token"] * result["train_tokens_per_s"] / (result["peak_gflops"] * 1e9))
    assert result["compiled_mfu"] == pytest.approx(
        result["train_flops_per_token"] * result["compiled_train_tokens_per_s"] / (result["peak_gflops"] * 1e9))
    assert 0 < result["mfu"] < 1 and 0 < result["hf_mfu"] < 1 and 0 < result["compiled_mfu"] < 1
    assert result["targets_met"] == {"train_ratio": result["train_ratio"] >= 1.0,
                                     "compiled_train_ratio": result["compiled_train_ratio"] >= 1.0,
                                     "mfu": result["mfu"] >= 0.6, "compiled_mfu": result["compiled_mfu"] >= 0.6,
                                     "decode_ratio": result["decode_ratio"] >= 2.0,
                                     "compiled_decode_ratio": result["compiled_decode_ratio"] >= 2.0,
                                     "cache_vs_nocache": result["cache_vs_nocache"] >= 5.0}
    # Same weights on both sides, greedy: the two implementations must pick the same tokens.
    assert result["decode_same_tokens"] and result["decode_b2_same_tokens"]
    assert result["compiled_decode_same_tokens"] and result["compiled_decode_b2_same_tokens"]
    assert result["threads"] == 1 and result["dtype"] == "fp32" and result["quick"]
    assert "| training tokens/s" in proc.stdout and "| decode tokens/s, batch 1" in proc.stdout
    assert "| decode tokens/s, batch 1, torch.compile (compiled in" in proc.stdout
    assert "| training tokens/s, train.compile=true (compiled in" in proc.stdout
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu"], "error: --device='tpu' must be cpu or cuda"),
    (["--threads", "0"], "error: --threads=0 must be >= 1"),
    (["--json", "no/such/dir/out.json"], "error: --json=no/such/dir/out.json: directory no/such/dir does not exist"),
])
def test_bad_flags_stop_before_measuring(argv, message, capsys):
    assert bench.main(argv) == 2
    assert capsys.readouterr().err.strip() == message


def test_ablation_mode_times_every_variant_against_the_baseline(tmp_path):
    out = tmp_path / "speed.json"
    proc = subprocess.run([sys.executable, "bench.py", "--ablation", "--threads", "1", "--repeats", "1",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    speeds = json.loads(out.read_text())
    assert list(speeds) == ["baseline", "layernorm", "postnorm", "sinusoidal", "mha", "relu", "transformer2017"]
    assert speeds["baseline"]["vs_baseline"] == 1.0
    for variant, r in speeds.items():
        low, high = r["tokens_per_s_range"]
        assert 0 < low <= r["tokens_per_s"] <= high, variant
        assert r["vs_baseline"] == pytest.approx(r["tokens_per_s"] / speeds["baseline"]["tokens_per_s"])
        assert f"| {variant} | {r['tokens_per_s']:,.0f} |" in proc.stdout
