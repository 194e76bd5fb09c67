"""generation/engine.py and generate.py: the KV cache against recomputation for every switch combination,
sampling, the context limits, EOS, the CLI's output and its bad-input errors."""
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from data.tokenizer import Tokenizer, train_tokenizer
import generate
from generation.engine import Engine, SamplingError, compiled_decoder, top_k_filter, top_p_filter
from generation.kv_memory import kv_projections
from generation.memory import available_memory, memory_shortfall
from model import ModelConfig, Transformer
from model.config import FFNS, NORM_POSITIONS, NORMS, POSITIONS, QK_NORMS
from storage.checkpoint import save_checkpoint
from cache_formula import kv_cache_bytes
from data_helpers import ROOT, run_script
from weights import far_from_init, ffn_settings

KV_HEADS = (4, 2, 1)  # of n_heads = 4: one K/V head per query head, two groups, one shared head
COMBINATIONS = list(itertools.product(NORMS, NORM_POSITIONS, POSITIONS, KV_HEADS, FFNS, QK_NORMS))


def random_model(seed=0, norm="rmsnorm", norm_position="pre", position="rope", n_kv_heads=2, ffn="swiglu",
                 qk_norm="none", vocab_size=64, context_length=32) -> Transformer:
    """A tiny model of these switches, its weights far from init (greedy picks decided by clear margins)."""
    return far_from_init(Transformer(ModelConfig(
        vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
        context_length=context_length, norm=norm, norm_position=norm_position, position=position, ffn=ffn,
        qk_norm=qk_norm, **ffn_settings(ffn))), seed)


class RecordingEngine(Engine):
    """Keeps every forward's (start, number of tokens, last-position logits)."""

    def __init__(self, model):
        super().__init__(model)
        self.forwards = []

    def _forward(self, tokens, start, cache, model=None):
        logits = super()._forward(tokens, start, cache, model)
        self.forwards.append((start, tokens.shape[1], logits.clone()))
        return logits


def greedy(model, prompts, max_new_tokens, use_cache, **kwargs):
    engine = RecordingEngine(model)
    steps = engine.generate(prompts, max_new_tokens, temperature=0, use_cache=use_cache, **kwargs)
    return torch.stack(list(steps), dim=1).tolist(), engine


@pytest.mark.parametrize("norm,norm_position,position,n_kv_heads,ffn,qk_norm", COMBINATIONS)
def test_cache_equals_recomputation(norm, norm_position, position, n_kv_heads, ffn, qk_norm):
    model = random_model(COMBINATIONS.index((norm, norm_position, position, n_kv_heads, ffn, qk_norm)),
                         norm, norm_position, position, n_kv_heads, ffn, qk_norm).double()
    prompts = [[1, 5, 9, 13, 17], [2, 40, 3, 63, 7]]
    cached, with_cache = greedy(model, prompts, 6, use_cache=True)
    recomputed, without_cache = greedy(model, prompts, 6, use_cache=False)
    assert cached == recomputed
    # one prefill of the whole prompt, then one token per step at its position; without: the whole prefix
    assert [f[:2] for f in with_cache.forwards] == [(0, 5), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)]
    assert [f[:2] for f in without_cache.forwards] == [(0, 5), (0, 6), (0, 7), (0, 8), (0, 9), (0, 10)]
    # A cached step multiplies one row where recomputation multiplies the whole prefix, so the kernels sum
    # in another order. In float32 how far apart that leaves the two depends on the CPU's kernels, hence
    # float64 here: its rounding is ~1e-15 of logits of up to ~10, far below 1e-10 on any CPU.
    for (*_, a), (*_, b) in zip(with_cache.forwards, without_cache.forwards):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_cache_bytes_and_projection_counts():
    model = random_model(n_kv_heads=2)  # 2 K/V heads of 8 dims, 2 layers
    engine = RecordingEngine(model)
    list(engine.generate([[1, 2, 3]] * 4, 5, temperature=0))
    # max_len = prompt + new tokens - 1 = 7 positions; fp32
    assert engine.stats.cache_bytes == kv_cache_bytes(2, 2, 8, 7, batch=4, bytes_per_element=4) == 2 * 2 * 2 * 8 * 7 * 4 * 4
    assert (engine.stats.prompt_tokens, engine.stats.generated_tokens) == (12, 20)
    assert engine.stats.prefill_tokens_per_s > 0 and engine.stats.decode_tokens_per_s > 0
    # tokens whose K/V each layer projects, as counted by the estimator: 3 + 1 * 4 with the cache
    cached = sum(n for _, n, _ in engine.forwards)
    _, uncached_engine = greedy(model, [[1, 2, 3]], 5, use_cache=False)
    uncached = sum(n for _, n, _ in uncached_engine.forwards)
    assert (uncached, cached) == kv_projections(5, prompt_tokens=3) == (25, 7)
    assert uncached_engine.stats.cache_bytes == 0


def test_n_samples_prefill_once_and_equal_n_prefilled_rows():
    """num_samples=4 prefills the prompt at batch 1 and copies it; 4 identical rows prefilled together are the
    reference. Same seed: the same tokens, and every forward's logits equal. float64: the batch-1 and the
    batch-4 prefill multiply in other orders, which rounds at ~1e-15 of logits of up to ~10, far below 1e-10."""
    model = random_model(n_kv_heads=2).double()
    prompt, settings = [1, 5, 9, 13, 17], dict(temperature=1.0, top_k=20, seed=3)
    once, rows = RecordingEngine(model), RecordingEngine(model)
    shared = torch.stack(list(once.generate([prompt], 12, num_samples=4, **settings)), dim=1)
    separate = torch.stack(list(rows.generate([prompt] * 4, 12, **settings)), dim=1)
    assert shared.tolist() == separate.tolist()
    assert len({tuple(row) for row in shared.tolist()}) == 4  # four different samples, not one copied
    prefill, (_, _, reference) = once.forwards[0], rows.forwards[0]
    assert prefill[:2] == (0, 5) and prefill[2].shape == (1, model.cfg.vocab_size)  # one row prefilled
    torch.testing.assert_close(prefill[2].expand(4, -1), reference, rtol=1e-10, atol=1e-10)
    for (*_, a), (*_, b) in zip(once.forwards[1:], rows.forwards[1:]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert (once.stats.prompt_tokens, rows.stats.prompt_tokens) == (5, 20)
    assert once.stats.cache_bytes == rows.stats.cache_bytes


def test_one_prefill_fills_the_cache_rows_of_every_sample():
    """Two prompts x 3 samples: rows 0-2 hold prompt 0's K/V, rows 3-5 prompt 1's, as a batch-6 prefill of the
    repeated rows writes them; the positions after the prompt stay empty. float64, as above."""
    model = random_model(n_kv_heads=1).double()
    prompts = torch.tensor([[1, 5, 9, 13, 17], [2, 40, 3, 63, 7]])
    shared, reference = model.new_kv_cache(6, 8), model.new_kv_cache(6, 8)
    with torch.inference_mode():
        logits = Engine(model)._prefill(prompts, 3, shared)
        expected = model(prompts.repeat_interleave(3, dim=0), 0, reference, last_only=True)[:, -1]
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-10)
    for (k, v), (k_ref, v_ref) in (((mine.keys, mine.values), (theirs.keys, theirs.values))
                                   for mine, theirs in zip(shared.layers, reference.layers)):
        torch.testing.assert_close(k, k_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(v, v_ref, rtol=1e-10, atol=1e-10)
        assert k[:, :, 5:].abs().sum() == 0
        assert not torch.equal(k[0], k[3])  # the two prompts' rows differ


def test_window_slides_when_the_context_is_full():
    # learned positions: a position past the table would crash, so this also shows none is used
    model = random_model(position="learned", context_length=8).double()
    prompt = [[3, 1, 4, 1, 5]]
    cached, with_cache = greedy(model, prompt, 20, use_cache=True)
    recomputed, without_cache = greedy(model, prompt, 20, use_cache=False)
    assert cached == recomputed and len(cached[0]) == 20
    sequence = prompt[0] + cached[0]
    # tokens 0..4 are the prompt, 5..7 fill the window, token 8 overflows it: the last 4 (tokens 5..8) are
    # re-prefilled at positions 0..3; the window refills to 8 and overflows again every 5 tokens.
    slides = [i for i, (start, n, _) in enumerate(with_cache.forwards) if i and n > 1]
    assert slides == [4, 9, 14, 19]
    assert [with_cache.forwards[i][:2] for i in slides] == [(0, 4)] * 4
    for i in slides:
        last = 5 + i  # tokens 0 .. last - 1 exist before this forward
        window = torch.tensor([sequence[last - 4:last]])
        expected = model(window)[:, -1]
        torch.testing.assert_close(with_cache.forwards[i][2], expected, rtol=1e-10, atol=1e-10)
    # A cached step multiplies one row where recomputation multiplies the whole prefix, so the kernels sum
    # in another order. In float32 how far apart that leaves the two depends on the CPU's kernels, hence
    # float64 here: its rounding is ~1e-15 of logits of up to ~10, far below 1e-10 on any CPU.
    for (*_, a), (*_, b) in zip(with_cache.forwards, without_cache.forwards):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_long_prompt_is_cut_from_the_left_with_a_warning(capsys):
    model = random_model(context_length=16)
    long_prompt = list(range(1, 41))  # 40 tokens
    out, _ = greedy(model, [long_prompt], 4, use_cache=True)
    assert capsys.readouterr().err.strip() == ("warning: the prompt has 40 tokens, more than model.context_length=16; "
                                               "keeping its last 16")
    assert out == greedy(model, [long_prompt[-16:]], 4, use_cache=True)[0]


def test_eos_ends_a_sample_and_the_batch_ends_when_all_have():
    model = random_model()
    prompts = [[1, 5, 9], [2, 6, 10]]

    def run(eos_id):
        engine = Engine(model)
        steps = engine.generate(prompts, 16, temperature=1.0, seed=0, eos_id=eos_id)
        return torch.stack(list(steps), dim=1).tolist(), engine.stats

    free, _ = run(None)
    # as EOS, a token both samples emit, first at different steps
    eos = next(t for t in free[1] if t in free[0] and free[0].index(t) != free[1].index(t))
    ends = [row.index(eos) for row in free]
    stopped, stats = run(eos)
    assert len(stopped[0]) == max(ends) + 1 < 16
    for row, free_row, end in zip(stopped, free, ends):
        assert row[:end + 1] == free_row[:end + 1]
        assert row[end + 1:] == [eos] * (len(row) - end - 1)  # an ended sample keeps yielding EOS
    assert stats.generated_tokens == sum(end + 1 for end in ends)


def test_top_k_1_is_greedy():
    model = random_model()
    greedy_ids, _ = greedy(model, [[1, 2, 3]], 10, use_cache=True)
    sampled = torch.stack(list(Engine(model).generate([[1, 2, 3]], 10, temperature=1.5, top_k=1, seed=0)), 1)
    assert sampled.tolist() == greedy_ids


def test_top_k_keeps_the_k_largest_and_their_ties():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[True, False, True, True, False]]
    assert torch.isfinite(top_k_filter(logits, 1)).tolist() == [[True, False, False, False, False]]
    assert torch.isfinite(top_k_filter(logits, 99)).all()


def test_top_p_keeps_the_smallest_set_whose_probability_exceeds_p():
    probs = torch.tensor([[0.15, 0.5, 0.1, 0.25]])
    logits = probs.log()
    kept = {p: torch.isfinite(top_p_filter(logits, p))[0].tolist() for p in (0.4, 0.7, 0.76, 0.95, 1.0)}
    assert kept[0.4] == [False, True, False, False]  # 0.5 > 0.4
    assert kept[0.7] == [False, True, False, True]  # 0.5 + 0.25 > 0.7
    assert kept[0.76] == [True, True, False, True]  # 0.75 <= 0.76 < 0.9
    assert kept[0.95] == [True, True, True, True]
    assert kept[1.0] == [True, True, True, True]
    # the defining property, on random distributions
    torch.manual_seed(0)
    logits = torch.randn(50, 30) * 2
    for p in (0.1, 0.5, 0.9):
        keep = torch.isfinite(top_p_filter(logits, p))
        probs = logits.softmax(-1)
        for row, mask in zip(probs, keep):
            kept_probs, dropped = row[mask], row[~mask]
            assert kept_probs.sum() > p
            assert kept_probs.sum() - kept_probs.min() <= p + 1e-6  # without its least likely token it would not
            assert dropped.numel() == 0 or kept_probs.min() >= dropped.max()


def test_same_seed_same_text(tokenizer):
    model = random_model(vocab_size=tokenizer.vocab_size)
    model.train()
    engine = Engine(model, tokenizer)
    first = engine.complete("the king", 30, temperature=1.0, top_k=50, seed=7)
    assert first == engine.complete("the king", 30, temperature=1.0, top_k=50, seed=7)
    assert first != engine.complete("the king", 30, temperature=1.0, top_k=50, seed=8)
    assert first.startswith("the king") and len(first) > len("the king")
    assert model.training  # generation switched to eval and back


def test_bad_engine_arguments_raise_at_the_call():
    engine = Engine(random_model())
    with pytest.raises(SamplingError, match=r"temperature=-0.5 must be"):
        engine.generate([[1]], 5, temperature=-0.5)
    with pytest.raises(ValueError, match="one length"):
        engine.generate([[1, 2], [3]], 5)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], 5)


# --- generate.py -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    words = "the king queen lord speak good night my heart love death sword crown thou art".split()
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(300)]
    return train_tokenizer(lines, 300, tmp_path_factory.mktemp("tok") / "tokenizer.model")


@pytest.fixture(scope="module")
def run_dir(tokenizer, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run")
    save_checkpoint(run / "ckpt", random_model(vocab_size=tokenizer.vocab_size, context_length=64),
                    tokenizer.model_file)
    return run


def run_main(capsys, *argv):
    code = generate.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_prints_the_greedy_text_and_stats(run_dir, tokenizer, capsys, tmp_path):
    latest = tmp_path / "latest"  # as outputs/latest: stderr names the run dir the link points at
    latest.symlink_to(run_dir.resolve())
    code, out, err = run_main(capsys, "--ckpt", latest, "--prompt", "the king", "--max-new-tokens", 12,
                              "--temperature", 0)
    assert code == 0
    checkpoint, err = err.split("\n", 1)
    assert checkpoint == f"checkpoint: {run_dir.resolve()}"
    model = random_model(vocab_size=tokenizer.vocab_size, context_length=64)
    prompt = [tokenizer.bos_id] + tokenizer.encode("the king")
    new, _ = greedy(model, [prompt], 12, use_cache=True, eos_id=tokenizer.eos_id)
    assert out == tokenizer.decode(prompt + new[0]) + "\n"
    assert err.startswith(f"prompt tokens {len(prompt)} | generated tokens {len(new[0])} | prefill ")
    assert err.rstrip().endswith(f"KV cache {kv_cache_bytes(2, 2, 8, len(prompt) + 11, 1, 4):,} bytes")
    code, uncached_out, uncached_err = run_main(capsys, "--ckpt", run_dir / "ckpt", "--prompt", "the king",
                                                "--max-new-tokens", 12, "--temperature", 0, "--no-kv-cache")
    assert (code, uncached_out) == (0, out) and "KV cache 0 bytes" in uncached_err
    assert f"| context cached, {len(prompt) + 11} positions cached | " in err
    assert "| context uncached, 0 positions cached | " in uncached_err


@pytest.mark.parametrize("flags, policy", [([], "sliding"), (["--sink-tokens", "2"], "streaming (2 sink tokens)"),
                                           (["--sink-tokens", "0"], "streaming (0 sink tokens)")])
def test_the_stats_line_names_the_context_policy_past_the_context(run_dir, capsys, flags, policy):
    """30 new tokens in a context of 16: the stats line says whether the window slid or the cache streamed with sink
    tokens, and that the cache held 16 positions."""
    code, _, err = run_main(capsys, "--ckpt", run_dir, "--prompt", "the king", "--max-new-tokens", 30,
                            "--temperature", 0, "--ignore-eos", "--context", 16, *flags)
    assert code == 0 and f"| context {policy}, 16 positions cached | KV cache " in err


def test_compiled_decode_prints_the_eager_text_and_compiles_only_in_its_warm_up(run_dir, capsys, monkeypatch):
    """The one torch.compile test of generation: --compile gives the eager text, says what compiling cost,
    and the warm-up (compiled_decoder) leaves no graph for the real run to compile."""
    from torch._dynamo.utils import counters
    argv = ["--ckpt", run_dir, "--prompt", "the king", "--max-new-tokens", 12, "--temperature", 0, "--ignore-eos"]
    code, out, err = run_main(capsys, *argv)
    before, graphs = counters["stats"]["unique_graphs"], []  # the process may have compiled graphs already

    def warm_up_and_count(engine, batch):
        seconds = compiled_decoder(engine, batch)
        graphs.append(counters["stats"]["unique_graphs"])
        return seconds
    monkeypatch.setattr(generate, "compiled_decoder", warm_up_and_count)
    code_compiled, out_compiled, err_compiled = run_main(capsys, *argv, "--compile")
    assert (code, code_compiled) == (0, 0) and out_compiled == out
    assert re.match(r"checkpoint: .*\ntorch\.compile of the decode step: \d+\.\d s\n", err_compiled), err_compiled
    assert len(graphs) == 1 and graphs[0] > before and counters["stats"]["unique_graphs"] == graphs[0]
    assert "torch.compile" not in err


def test_generate_samples_a_batch(run_dir, capsys):
    argv = ["--ckpt", run_dir, "--num-samples", 3, "--max-new-tokens", 20, "--seed", 5, "--top-p", 0.9,
            "--ignore-eos"]
    code, out, err = run_main(capsys, *argv)
    assert code == 0 and "generated tokens 60 |" in err
    assert [line for line in out.splitlines() if line.startswith("--- sample")] == [
        "--- sample 1 ---", "--- sample 2 ---", "--- sample 3 ---"]
    assert run_main(capsys, *argv)[1] == out


def test_stream_prints_multibyte_characters_whole(tokenizer, capsys):
    text = "héllo ♥ the king"
    ids = tokenizer.encode(text)
    # é and ♥ are byte-fallback pieces: a prefix that cuts one decodes with U+FFFD
    assert any("\ufffd" in tokenizer.decode(ids[:i]) for i in range(len(ids)))
    stream = generate.TextStream(tokenizer)
    printed = []
    for i in range(1, len(ids) + 1):
        stream.show(ids[:i])
        printed.append(capsys.readouterr().out)
    stream.show(ids, final=True)
    assert "".join(printed) + capsys.readouterr().out == text
    assert not any("\ufffd" in piece for piece in printed)


@pytest.mark.parametrize("flags,message", [
    (["--max-new-tokens", "0"], "--max-new-tokens=0 must be in [1, 1,000,000]"),
    (["--max-new-tokens", "-3"], "--max-new-tokens=-3 must be in [1, 1,000,000]"),
    (["--max-new-tokens", "2000000"], "--max-new-tokens=2000000 must be in [1, 1,000,000]"),
    (["--max-new-tokens", "ten"], "argument --max-new-tokens: 'ten' is not an integer written in ASCII digits"),
    (["--num-samples", "0"], "--num-samples=0 must be in [1, 1024]"),
    (["--num-samples", "100000"], "--num-samples=100000 must be in [1, 1024]"),
    (["--temperature", "-1"], "--temperature=-1.0 must be a finite number >= 0 (0 = greedy)"),
    (["--temperature", "nan"], "--temperature=nan must be a finite number >= 0 (0 = greedy)"),
    (["--top-p", "0"], "--top-p=0.0 must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p=1.5 must be in (0, 1]"),
    (["--top-k", "0"], "--top-k=0 must be >= 1"),
    (["--device", "nodevice"], "--device=nodevice is not usable here"),
    (["--compile", "--no-kv-cache"], "--compile compiles the cached decode step; it does nothing with --no-kv-cache"),
    (["--sink-tokens", "2", "--no-kv-cache"], "--sink-tokens=2 keeps tokens in the KV cache; it does nothing with "
                                              "--no-kv-cache"),
    (["--sink-tokens", "-1"], "--sink-tokens=-1 must be an integer in [0, the cache's"),
])
def test_bad_flags_get_one_line_and_exit_2(run_dir, capsys, flags, message):
    code, out, err = run_main(capsys, "--ckpt", run_dir, *flags)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def corrupt(run_dir: Path, tmp_path: Path, file: str, content: bytes) -> Path:
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    (broken / "ckpt" / file).write_bytes(content)
    return broken


@pytest.mark.parametrize("file,content,message", [
    (None, None, "error: no checkpoint at"),
    ("config.json", b"{not json", "error: corrupt checkpoint config"),
    ("config.json", json.dumps({"format_version": 99, "model": {}}).encode(),
     "has format_version=99; this nanollama reads format_version=2"),
    ("model.safetensors", b"\x00" * 20, "model.safetensors does not match the sha256 in its config.json"),
    ("tokenizer.model", b"garbage", "tokenizer.model does not match the sha256 in its config.json"),
])
def test_bad_checkpoints_get_one_line_and_exit_2(run_dir, tmp_path, capsys, file, content, message):
    path = tmp_path / "missing" if file is None else corrupt(run_dir, tmp_path, file, content)
    code, out, err = run_main(capsys, "--ckpt", path)
    assert code == 2 and out == ""
    assert message in err and err.startswith("error: ") and err.count("\n") == 1


def test_memory_shortfall_holds_the_needs_to_the_free_memory():
    free, source = available_memory("cpu")
    assert 0 < free <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert source in ("MemAvailable in /proc/meminfo", "left under the cgroup's memory.max", "free pages (sysconf)")
    assert memory_shortfall({"a": free // 4, "b": 0}, "cpu") is None
    message = memory_shortfall({"a": 2 * free, "b": 0}, "cpu")  # a part of 0 bytes is left out of the list
    numbers = re.fullmatch(r"needs at least ([\d.]+) GB \(a ([\d.]+) GB\) more than the ([\d.]+) GB .+",
                           message.replace(",", ""))  # thousands' commas out, the one after the list too
    needed, part, available = map(float, numbers.groups())
    assert needed == part == pytest.approx(2 * free / 1e9, abs=0.05)
    assert available == pytest.approx(free / 1e9, rel=0.1)  # read again: other processes move it a little


def test_sizes_past_the_memory_are_one_line_before_anything_is_allocated(run_dir, capsys):
    # 10^12 positions: RoPE's fp32 cos and sin tables alone, 2 x 10^12 x 8 dims x 4 bytes, are 64 TB
    code, out, err = run_main(capsys, "--ckpt", run_dir, "--context", 10**12, "--device", "cpu")
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("error: --context=1000000000000 needs at least 64,000.0 GB (the position tables "
                          "64,000.0 GB), more than the ")
    # the token window and the cache, at the call: 10^6 samples x (10^6 + 1) int64 ids = 8 TB, and
    # 2 x 2 layers x 2 KV heads x 8 dims x 10^6 positions x 10^6 samples x 4 bytes = 256 TB
    engine = Engine(random_model(context_length=64), context=10**6)  # its tables, 64 MB, fit
    with pytest.raises(SamplingError) as refused:
        engine.generate([[0]], 10**6, num_samples=10**6)
    assert str(refused.value).startswith(
        "max_new_tokens=1000000 for 1000000 samples of up to 1,000,000 positions needs at least 264,000.0 GB "
        "(the token window 8,000.0 GB, the KV cache 256,000.0 GB), more than the ")


def test_generate_as_a_script(run_dir, tokenizer):
    result = run_script(ROOT / "generate.py", "--ckpt", str(run_dir), "--temperature", "0", "--max-new-tokens", "8",
                        "--ignore-eos")
    assert result.returncode == 0, result.stderr
    assert "generated tokens 8 |" in result.stderr
    model = random_model(vocab_size=tokenizer.vocab_size, context_length=64)
    new, _ = greedy(model, [[tokenizer.bos_id]], 8, use_cache=True)
    assert result.stdout == tokenizer.decode(new[0]) + "\n"
