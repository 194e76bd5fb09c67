"""The KV cache (model/kv_cache.py): its layers' caches, their allocation against the formula, their in-place writes
and prefix copies; the memory estimator (generation/kv_memory.py) against the chapter's LLaMA-2-7B table."""
import json

import pytest
import torch

from data.tokenizer import train_tokenizer
from errors import UsageError
from generation.kv_memory import estimate, kv_projections, main
from model import KVCache, ModelConfig, Transformer
from model.attention import Attention
from model.kv_cache import FullCache, RollingCache, StreamingCache
from model.mla import LatentAttention
from storage.checkpoint import save_checkpoint
from cache_formula import kv_cache_bytes

LLAMA2_7B = ["--layers", "32", "--head-dim", "128", "--seq", "4096", "--dtype", "fp16"]


@pytest.mark.parametrize("dtype,size", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)])
def test_allocated_bytes_equal_the_formula(dtype, size):
    cache = KVCache([FullCache(batch=2, heads=2, max_len=10, key_dim=8, value_dim=8, dtype=dtype) for _ in range(3)])
    assert all(layer.keys.shape == layer.values.shape == (2, 2, 10, 8) for layer in cache.layers)
    assert cache.nbytes == kv_cache_bytes(3, 2, 8, 10, batch=2, bytes_per_element=size) == 2 * 3 * 2 * 8 * 10 * 2 * size


def test_fewer_kv_heads_shrink_the_cache_by_n_heads_over_n_kv_heads():
    sizes = {kv: Transformer(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=kv,
                                         context_length=16)).new_kv_cache(batch=1).nbytes for kv in (4, 2, 1)}
    assert sizes == {4: 2 * 2 * 4 * 8 * 16 * 4, 2: 2 * 2 * 2 * 8 * 16 * 4, 1: 2 * 2 * 1 * 8 * 16 * 4}


def test_update_writes_in_place_and_returns_the_prefix():
    cache = KVCache([FullCache(batch=1, heads=2, max_len=6, key_dim=4, value_dim=4) for _ in range(2)])
    storage = cache.layers[1].keys.data_ptr()
    first = torch.randn(1, 2, 4, 4)
    cache.layers[1].update(0, first, -first)
    step = torch.randn(1, 2, 1, 4)
    k, v, positions = cache.layers[1].update(4, step, -step)
    assert positions is None  # positions 0 .. 4 in order
    assert cache.layers[1].keys.data_ptr() == storage == k.data_ptr()  # views, no copy
    torch.testing.assert_close(k, torch.cat([first, step], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(v, -k, rtol=0, atol=0)
    assert cache.layers[0].keys.abs().sum() == 0  # other layers untouched
    with pytest.raises(ValueError, match="KV cache overflow: position 7 > max_len 6"):
        cache.layers[1].update(5, torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))


@pytest.mark.parametrize("kv_heads,exact,chapter", [("32", "2,147,483,648", 2.1), ("8", "536,870,912", 0.54),
                                                    ("1", "67,108,864", 0.07)])
def test_estimator_reproduces_the_chapter_table(kv_heads, exact, chapter, capsys):
    assert main(LLAMA2_7B + ["--kv-heads", kv_heads]) == 0
    report = capsys.readouterr().out
    assert f"= {exact} bytes" in report
    gb = float(report.split(" bytes = ")[1].split(" GB")[0])
    assert round(gb, len(str(chapter).split(".")[1])) == chapter


def test_estimator_reads_a_transformers_config(tmp_path):
    config = {"hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
              "max_position_embeddings": 4096, "model_type": "llama"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert "= 2,147,483,648 bytes" in estimate(["--hf-config", str(path)])  # kv heads default to heads
    assert "= 536,870,912 bytes" in estimate(["--hf-config", str(path), "--kv-heads", "8"])  # a flag overrides it
    path.write_text(json.dumps(config | {"num_key_value_heads": 1, "head_dim": 64}))
    assert f"= {kv_cache_bytes(32, 1, 64, 4096):,} bytes" in estimate(["--hf-config", str(path)])
    assert f"= {kv_cache_bytes(32, 1, 64, 100, batch=3, bytes_per_element=4):,} bytes" in estimate(
        ["--hf-config", str(path), "--seq", "100", "--batch", "3", "--dtype", "fp32"])
    path.write_text(json.dumps(config | {"model_type": "qwen3"}))  # Qwen3Config's head dim is 128 unless given
    assert f"= {kv_cache_bytes(32, 32, 128, 4096):,} bytes" in estimate(["--hf-config", str(path)])


def test_estimator_reads_a_checkpoint(tmp_path):
    tokenizer = train_tokenizer([f"line {i} of some text" for i in range(200)], 280, tmp_path / "tokenizer.model")
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2,
                      context_length=48)
    save_checkpoint(tmp_path / "run" / "ckpt", Transformer(cfg), tokenizer.model_file)
    report = estimate(["--ckpt", str(tmp_path / "run"), "--dtype", "fp32"])
    assert f"= {kv_cache_bytes(3, 2, 16, 48, bytes_per_element=4):,} bytes" in report
    # and the same as the model's own figure per token
    assert f"{Transformer(cfg).kv_cache_bytes_per_token(torch.float32):,} bytes per token" in report


def test_estimator_counts_a_window_in_the_local_layers_only(tmp_path):
    """Mistral-7B at 32,768 positions in 4,096-position windows holds an eighth of what full layers would; a
    transformers config gives its window and local layers as transformers reads them (sliding_window; layer_types
    where the family writes it; Qwen's only with use_sliding_window, from max_window_layers on), and a windowed
    checkpoint its own."""
    mistral = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--seq", "32768"]
    assert "= 4,294,967,296 bytes" in estimate(mistral)
    assert "= 536,870,912 bytes" in estimate(mistral + ["--window", "4096"])
    assert f"= {(8 * 32768 + 24 * 4096) * 2 * 8 * 128 * 2:,} bytes" in estimate(
        mistral + ["--window", "4096", "--local-layers", "24"])
    config = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "max_position_embeddings": 32768, "model_type": "mistral", "sliding_window": 4096}
    path = tmp_path / "config.json"
    for extra, expected in (({}, 536_870_912),
                            ({"layer_types": 24 * ["sliding_attention"] + 8 * ["full_attention"]},
                             (8 * 32768 + 24 * 4096) * 2 * 8 * 128 * 2),
                            ({"model_type": "qwen3"}, 4_294_967_296),  # Qwen's window is off by default
                            ({"model_type": "qwen3", "use_sliding_window": True},  # from max_window_layers=28 on
                             (28 * 32768 + 4 * 4096) * 2 * 8 * 128 * 2)):
        path.write_text(json.dumps(config | extra))
        assert f"= {expected:,} bytes" in estimate(["--hf-config", str(path)])
    tokenizer = train_tokenizer([f"line {i} of some text" for i in range(200)], 280, tmp_path / "tokenizer.model")
    cfg = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2,
                      context_length=48, window=8, window_pattern="2:1")
    save_checkpoint(tmp_path / "run" / "ckpt", Transformer(cfg), tokenizer.model_file)
    report = estimate(["--ckpt", str(tmp_path / "run"), "--dtype", "fp32"])
    assert "(1 layers x 48 tokens + 2 local layers x 8 tokens of a 8-token window)" in report
    assert f"= {Transformer(cfg).new_kv_cache(1).nbytes:,} bytes" in report


def test_projection_counts(capsys):
    assert kv_projections(4) == (10, 4)  # the chapter's 1 + 2 + 3 + 4 vs 4
    assert kv_projections(100, prompt_tokens=1) == (5050, 100)
    assert kv_projections(5, prompt_tokens=3) == (3 + 4 + 5 + 6 + 7, 3 + 4)
    assert main(["--new-tokens", "4"]) == 0
    assert capsys.readouterr().out == ("K/V projections per layer for 4 new tokens after a 1-token prompt: "
                                       "10 without a cache, 4 with one\n")


@pytest.mark.parametrize("argv,message", [
    (LLAMA2_7B + ["--kv-heads", "0"], "--kv-heads=0 must be a positive integer"),
    (LLAMA2_7B + ["--kv-heads", "8", "--batch", "-1"], "--batch=-1 must be a positive integer"),
    (["--layers", "32", "--seq", "10"], "give --kv-heads, --head-dim (or --ckpt / --hf-config)"),
    (["--layers", "many"], "argument --layers: 'many' is not an integer written in ASCII digits"),
    (["--new-tokens", "0"], "--new-tokens=0 must be a positive integer"),
    (["--hf-config", "/nonexistent/config.json"], "--hf-config /nonexistent/config.json: cannot read it"),
    (["--ckpt", "/nonexistent"], "--ckpt /nonexistent: no checkpoint at /nonexistent"),
    (["--ckpt", "a", "--hf-config", "b"], "argument --hf-config: not allowed with argument --ckpt"),
    (LLAMA2_7B + ["--kv-heads", "8", "--window", "0"], "--window=0 must be a positive integer"),
    (LLAMA2_7B + ["--kv-heads", "8", "--window", "64", "--local-layers", "33"],
     "--local-layers=33 must be at most --layers=32"),
    (LLAMA2_7B + ["--kv-heads", "8", "--local-layers", "-1"], "--local-layers=-1 must be a non-negative integer"),
    (["--layers", "32", "--kv-rank", "512", "--seq", "64", "--window", "8"],
     "--window=8 with --kv-rank: this repo's latent attention has no window"),
    (LLAMA2_7B + ["--kv-heads", "8", "--local-layers", "4"], "--local-layers=4 says how many layers have a window, "
                                                             "and there is none: give --window"),
])
def test_estimator_bad_input_gets_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {message}") and err.count("\n") == 1


def test_estimator_rejects_a_file_that_is_not_a_model_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(UsageError, match="not a transformers model config, missing 'num_attention_heads'"):
        estimate(["--hf-config", str(path)])
    path.write_text("{oops")
    with pytest.raises(UsageError, match="not JSON"):
        estimate(["--hf-config", str(path)])


def test_each_layer_builds_its_own_kind_of_cache_and_counts_its_bytes():
    """A cache is its layers' caches, each built by its attention: an alternate window of 4 gives the local layers a
    RollingCache of 4 slots and the global ones a FullCache, or a StreamingCache with sink tokens; MLA a FullCache of
    one "head" of d_c + d_R key dims and 0 value dims. Each layer's nbytes is its attention's cache_bytes, and the
    model's the sum, by hand in fp32."""
    windowed = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2,
                                       context_length=32, window=4, window_pattern="alternate"))
    for sink_tokens, full_kind in ((None, FullCache), (2, StreamingCache)):
        cache = windowed.new_kv_cache(3, 10, sink_tokens=sink_tokens)
        assert [type(layer) for layer in cache.layers] == 2 * [RollingCache, full_kind]
        assert [layer.keys.shape for layer in cache.layers] == 2 * [(3, 2, 4, 8), (3, 2, 10, 8)]
        assert all(layer.max_len == cache.max_len == 10 for layer in cache.layers)
        assert [layer.nbytes for layer in cache.layers] == [
            block.attn.cache_bytes(windowed.cfg, i, 10, 3, 4) for i, block in enumerate(windowed.blocks)]
        assert cache.nbytes == windowed.kv_cache_bytes(10, batch=3) == 2 * (4 + 10) * 2 * 8 * 2 * 3 * 4
    latent = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4,
                                     context_length=32, kv_rank=12, rope_head_dim=4))
    cache = latent.new_kv_cache(2, 10)
    assert [(type(layer), layer.keys.shape, layer.values.shape) for layer in cache.layers] == 2 * [
        (FullCache, (2, 1, 10, 16), (2, 1, 10, 0))]
    assert cache.nbytes == latent.kv_cache_bytes(10, batch=2) == 2 * 16 * 10 * 2 * 4
    # the estimators' description of each kind gives the same bytes per position and layer
    assert Attention.PER_POSITION.elements(Attention.cache_dims(windowed.cfg)) == 2 * 2 * 8
    assert LatentAttention.PER_POSITION.elements(LatentAttention.cache_dims(latent.cfg)) == 12 + 4


def test_a_rolling_cache_keeps_the_last_window_positions():
    """Window 3 of a cache of 8: positions written one at a time land in slot p mod 3, each step's keys are the
    window (positions None: all visible); a chunk after them sees the held positions in order, then its own."""
    cache = RollingCache(batch=1, heads=1, max_len=8, key_dim=1, value_dim=1, window=3)
    for p in range(7):
        keys, values, positions = cache.update(p, torch.full((1, 1, 1, 1), float(p)), torch.full((1, 1, 1, 1), -p))
    assert positions is None and keys.flatten().tolist() == [6.0, 4.0, 5.0] and values.flatten().tolist() == [-6, -4, -5]
    chunk = torch.tensor([7.0, 8.0]).view(1, 1, 2, 1)
    keys, _, positions = cache.update(7, chunk, -chunk)
    assert positions.tolist() == [4, 5, 6, 7, 8] and keys.flatten().tolist() == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert cache.keys.flatten().tolist() == [6.0, 7.0, 8.0]  # slots 0, 1, 2: positions 6, 7, 8


def test_fill_from_copies_a_prefix_into_every_samples_rows_and_the_sinks_with_it():
    """One prompt's cache (batch 2, 5 positions written) filled into a cache of 2 x 3 rows: rows 0-2 are its row 0,
    rows 3-5 its row 1, the positions after the prompt empty; a streaming layer keeps the sinks' keys too, and a
    rolling layer whose window the prompt filled is copied whole."""
    torch.manual_seed(0)
    k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    for make in (lambda batch: FullCache(batch, 2, 8, 4, 4), lambda batch: StreamingCache(batch, 2, 8, 4, 4, 2, None),
                 lambda batch: RollingCache(batch, 2, 8, 4, 4, window=3)):
        source, shared = make(2), make(6)
        source.update(0, k, v)
        shared.fill_from(source, repeats=3, length=5)
        torch.testing.assert_close(shared.keys, source.keys.repeat_interleave(3, dim=0), rtol=0, atol=0)
        torch.testing.assert_close(shared.values, source.values.repeat_interleave(3, dim=0), rtol=0, atol=0)
        if isinstance(shared, StreamingCache):
            torch.testing.assert_close(shared.sink_keys, k[:, :, :2].repeat_interleave(3, dim=0), rtol=0, atol=0)
        if not isinstance(shared, RollingCache):
            assert shared.keys[:, :, 5:].abs().sum() == 0
