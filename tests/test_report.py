"""report.py and insight/: each measurement on a model whose answer is known, the page in a real browser, W&B
offline, and the bad inputs. The checkpoints and reports are made here, once per session
(make_checkpoints_and_reports): one tiny train.py run (RoPE) and, with its tokenizer, a position=learned model, a
QK-norm and ReLU² model of known gains, and a model of another vocabulary."""
import base64
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from filelock import FileLock

import report
from data.tokenizer import train_tokenizer
from cache_formula import kv_cache_bytes
from data_helpers import run_train, tiny_run, write_corpus
from insight.attention import attention_inputs, attention_maps, cache_by_kv_heads, kv_wiring, layer_qk, logit_scale
from insight.blocks import HISTOGRAM_BINS, NEAR_ZERO, ffn_activations
from insight.decode import decode_times
from insight.positions import shift_check
from model.attention import attention_weights
from model.config import ModelConfig
from model.transformer import Transformer
from storage.checkpoint import load_checkpoint, save_checkpoint
from insight.lengths import report_windows, run_val_split, score
from insight.page import tables as page_tables
from weights import far_from_init

PROMPT = "ANNA\nGood night, sweet lord,"
SECTIONS = ("kv-cache", "attention-wiring", "attention-maps", "positions", "residual-stream", "ffn", "past-context",
            "qk-norm")
# the modern checkpoint's QK-norm gains, every layer: max|g_q| = 1.5, max|g_k| = 2 (a negative gain counts by its size)
GAIN_Q, GAIN_K = (0.25, 1.5), (-2.0, 0.5)


def set_qk_gains(model: Transformer) -> Transformer:
    """Every layer's QK-norm gains spread evenly over GAIN_Q and GAIN_K."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qk_norm.q_norm.weight.copy_(torch.linspace(*GAIN_Q, model.cfg.head_dim))
            block.attn.qk_norm.k_norm.weight.copy_(torch.linspace(*GAIN_K, model.cfg.head_dim))
    return model


def make_checkpoints_and_reports(folder: Path) -> None:
    """rope/: a tiny RoPE model trained by train.py (1 layer, d 32, 2 query heads, 1 K/V head, context 32).
    learned/ckpt: the same sizes and tokenizer with a learned position table, its weights far from init.
    modern/: a copy of rope/ (so, the run's val split) whose checkpoint is the same sizes with qk_norm=rmsnorm and
    ffn=relu2, far from init but its QK-norm gains set_qk_gains'. other/ckpt: a model of another vocabulary.
    run/report: the report of a copy of rope/, written where report.py puts it by default, with --wandb offline into
    that run's own W&B run. several/: rope/, learned/ and modern/ side by side, written over a copy of run/report (a
    report replaces an earlier one whole)."""
    rope = folder / "rope"
    result = run_train(rope, *tiny_run(folder))
    assert result.returncode == 0, result.stderr
    model, ckpt_dir = load_checkpoint(rope)
    torch.manual_seed(0)
    learned = far_from_init(Transformer(ModelConfig.from_dict(model.cfg.to_dict() | {"position": "learned"})))
    save_checkpoint(folder / "learned" / "ckpt", learned, ckpt_dir / "tokenizer.model")
    shutil.copytree(rope, folder / "modern")
    modern = far_from_init(Transformer(ModelConfig.from_dict(model.cfg.to_dict() | {"qk_norm": "rmsnorm",
                                                                                      "ffn": "relu2"})))
    save_checkpoint(folder / "modern" / "ckpt", set_qk_gains(modern), ckpt_dir / "tokenizer.model")
    other = train_tokenizer(write_corpus(folder / "other.txt").read_text().splitlines(), 320, folder / "other.model")
    save_checkpoint(folder / "other" / "ckpt", Transformer(ModelConfig.from_dict(model.cfg.to_dict() | {"vocab_size": 320})),
                    other.model_file)
    shutil.copytree(rope, folder / "run")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        for name in ("CONFIG", "CACHE", "DATA"):
            env.setenv(f"WANDB_{name}_DIR", str(folder / "wandb_home" / name.lower()))
        assert report.main(["--ckpt", str(folder / "run"), "--prompt", PROMPT, "--wandb"]) == 0
    shutil.copytree(folder / "run" / "report", folder / "several")
    assert report.main(["--ckpt", str(rope), "--ckpt", str(folder / "learned" / "ckpt"), "--ckpt",
                        str(folder / "modern"), "--prompt", PROMPT, "--out", str(folder / "several")]) == 0


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """make_checkpoints_and_reports' folder, made once per session: under pytest-xdist by the first worker that needs
    it while the others wait on its lock (then every worker reads it; nothing writes there afterwards)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "report_checkpoints"
    with FileLock(f"{folder}.lock"):
        if not (folder / "made").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed here left
            folder.mkdir()
            make_checkpoints_and_reports(folder)
            (folder / "made").touch()
    return folder


@pytest.fixture(scope="module")
def rope_run(made) -> Path:
    return made / "rope"


@pytest.fixture(scope="module")
def learned_ckpt(made) -> Path:
    return made / "learned" / "ckpt"


@pytest.fixture(scope="module")
def other_vocabulary(made) -> Path:
    return made / "other" / "ckpt"


@pytest.fixture(scope="module")
def one(made) -> Path:
    return made / "run" / "report"


@pytest.fixture(scope="module")
def modern_run(made) -> Path:
    return made / "modern"


@pytest.fixture(scope="module")
def several(made) -> Path:
    return made / "several"


# --- the measurements --------------------------------------------------------------------------------------

def shift_bound(model: Transformer, tokens: torch.Tensor, largest_position: int) -> float:
    """What the RoPE shift check may differ by, in float64, for block 0 of a model.

    The rotation tables are fp32 (model/positions.py): angle a_p = fl(p * theta_i) = p theta_i (1 + e), |e| <= u = 2^-24,
    and cos, sin of it to 1 ulp, |delta| <= u (values below 1). Each 2-d pair (i, i + D/2) of q and k is turned by
    M_p = R(a_p) + E_p, ||E_p|| <= sqrt(2) u, so M_m^T M_n = R(a_n - a_m) + F with ||F|| <= 2 sqrt(2) u + 2 u^2. Read at
    (m, n) and at (m + s, n + s), the exact angle difference is (n - m) theta_i both times and each realised one is off
    by at most u theta_i (m + n) or u theta_i (m + n + 2 s); ||R(a) - R(b)|| <= |a - b|. So a pair's term differs by
    at most |q_i| |k_i| (4 u P theta_i + 4 sqrt(2) u + 4 u^2), P the largest position, and theta_i <= theta_0 = 1 with
    Cauchy-Schwarz bounds the sum over pairs by (4 u P + 4 sqrt(2) u + 4 u^2) |q| |k| (D 2^-53 more for the float64
    dot product itself); the score divides by sqrt(D). Block 0's input does not depend on the shift at all (RoPE adds
    nothing to the embeddings), and a one-block model has no other block."""
    u = 2.0 ** -24
    q, k = layer_qk(model.double(), tokens)[0]
    D = q.shape[-1]
    relative = 4 * u * largest_position + 4 * math.sqrt(2) * u + 4 * u * u + D * 2.0 ** -53
    return relative * q.norm(dim=-1).max().item() * k.norm(dim=-1).max().item() / math.sqrt(D)


def prompt_tokens(run: Path) -> torch.Tensor:
    tokenizer = report.load(str(run))[2]
    return torch.tensor([[tokenizer.bos_id] + tokenizer.encode(PROMPT)])


def test_rope_scores_depend_on_the_distance_only_and_absolute_ones_do_not(rope_run, learned_ckpt):
    for path, holds in ((rope_run, True), (learned_ckpt, False)):
        model = report.load(str(path))[0]
        tokens = prompt_tokens(rope_run)
        check = shift_check(model, tokens)
        n = check["tokens"]  # the prompt's first half context: 16 tokens, read at shifts up to 16
        assert model.cfg.n_layers == 1 and n == model.cfg.context_length // 2 < tokens.shape[1]
        assert check["shifts"][-1]["shift"] == model.cfg.context_length - n  # up to the last position, 31
        bound = shift_bound(model, tokens[:, :n], model.cfg.context_length - 1)
        worst = max(max(s["max_abs_diff"]) for s in check["shifts"])
        if holds:
            assert worst <= bound, (worst, bound)
        else:  # PE[m + s] instead of PE[m]: the scores move by a good part of their own size
            assert worst > 1e4 * bound and worst > 0.05 * max(check["max_abs_score"]), (worst, bound)


def test_attention_weights_are_the_ones_sdpa_applies():
    """attention_weights @ v equals the model's own sdpa call, in float64: the grouping (query head h reads K/V head
    h // (H / H_kv)) and the causal mask are enable_gqa's and is_causal's."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 9, 8, dtype=torch.float64), *torch.randn(2, 2, 2, 9, 8, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    weights = attention_weights(q, k)
    assert torch.allclose(weights @ v.repeat_interleave(3, dim=1), expected, rtol=0, atol=1e-12)
    assert torch.all(weights.triu(1) == 0)


@pytest.mark.parametrize("attention,n_kv_heads", [("mha", 4), ("gqa", 2), ("mqa", 1)])
def test_measured_wiring_is_the_grouping(attention, n_kv_heads):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=n_kv_heads, context_length=16)
    assert cfg.attention == attention  # named after its K/V heads
    torch.manual_seed(0)
    reads = kv_wiring(far_from_init(Transformer(cfg)), torch.randint(64, (1, 10)))
    assert reads == [[h // (4 // n_kv_heads)] for h in range(4)]
    sizes = cache_by_kv_heads(cfg)
    assert [(s["attention"], s["kv_heads"], s["this_model"]) for s in sizes] == [
        ("MHA", 4, n_kv_heads == 4), ("GQA", 2, n_kv_heads == 2), ("MQA", 1, n_kv_heads == 1)]
    assert [s["bytes"] for s in sizes] == [kv_cache_bytes(1, n, 8, 16, 1, 4) for n in (4, 2, 1)]


def test_every_head_of_mla_reads_its_one_latent_and_the_table_gets_its_row():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, context_length=16, kv_rank=12,
                      rope_head_dim=4)
    torch.manual_seed(0)
    assert kv_wiring(far_from_init(Transformer(cfg)), torch.randint(64, (1, 10))) == [[0]] * 4
    sizes = cache_by_kv_heads(cfg)
    assert [(s["attention"], s["kv_heads"], s["this_model"], s["bytes"]) for s in sizes] == [
        *((kind, n, False, kv_cache_bytes(1, n, 8, 16, 1, 4)) for kind, n in (("MHA", 4), ("GQA", 2), ("MQA", 1))),
        ("MLA (12 + 4)", 1, True, (12 + 4) * 16 * 4)]  # fp32, 1 layer, 16 positions


def test_mlas_attention_maps_are_the_weights_its_queries_give_the_cached_latents():
    """The page's maps of an MLA model (insight.attention.attention_maps, through each block's naive heads) are
    the weights that its decode computes through the latent, in float64: softmax over the cached [c_kv, k_R] of
    [q_C W_uk,h, q_R] / sqrt(D + d_R), no per-head key made."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, context_length=16, kv_rank=12,
                      rope_head_dim=4)
    torch.manual_seed(0)
    model, tokens = far_from_init(Transformer(cfg)).double(), torch.randint(64, (1, 10))
    maps = attention_maps(model, tokens)["weights"]
    for layer, (block, (x, start)) in enumerate(zip(model.blocks, attention_inputs(model, tokens))):
        attn = block.attn
        with torch.no_grad():
            q, latent = attn.project(x, start)  # latent: [1, 1, T, d_c + d_R], what the cache holds
            q_c, q_r = q.split([attn.head_dim, attn.rope_width], dim=-1)
            q_latent = torch.cat([q_c @ attn.k_up.weight.view(4, attn.head_dim, 12), q_r], dim=-1)
            # attention_weights divides by sqrt(q's width), d_c + d_R = 16 here; MLA's is sqrt(D + d_R) = sqrt(12)
            through_latent = attention_weights(q_latent * math.sqrt((12 + 4) / (8 + 4)), latent)[0]
        torch.testing.assert_close(torch.tensor(maps[layer], dtype=torch.float64), through_latent,
                                   rtol=0, atol=1e-12)


def test_relu_zeroes_about_half_its_units_and_silu_none():
    torch.manual_seed(0)
    tokens = torch.randint(64, (1, 12))
    for ffn, low, high in (("relu", 0.3, 0.7), ("relu2", 0.3, 0.7), ("swiglu", 0.0, 0.0)):
        cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn=ffn, context_length=16)
        activations = ffn_activations(far_from_init(Transformer(cfg)), tokens)
        assert all(low <= zero <= high for zero in activations["zero"]), activations["zero"]
        assert all(near >= zero for near, zero in zip(activations["near_zero"], activations["zero"]))


def test_relu2_fractions_are_direct_counts_and_its_tail_stays_out_of_the_bins():
    """ReLU²'s zero and near-zero fractions counted directly from x·W1 (the FFN's input caught by a hook), and its
    histogram: the 99.9% quantile cuts the right tail, and what lies past it is in no bin (the last bin holds only
    its own values), its share in `beyond` and its reach in `range`."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn="relu2", context_length=16)
    model = far_from_init(Transformer(cfg))
    torch.manual_seed(0)
    tokens = torch.randint(64, (1, 16))
    ffn_inputs = []
    hooks = [block.ffn.register_forward_pre_hook(lambda _ffn, args: ffn_inputs.append(args[0]))
             for block in model.blocks]
    activations = ffn_activations(model, tokens)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        hidden = [block.ffn.w_in(x) for block, x in zip(model.blocks, ffn_inputs)]  # x·W1, as the model rounds it
    assert (activations["kind"], activations["activation"]) == ("relu2", "relu(x·W1)², the hidden activation")
    assert activations["zero"] == [(h <= 0).float().mean().item() for h in hidden]  # relu(h)² = 0 iff h <= 0
    squares = [F.relu(h).square() for h in hidden]
    assert activations["near_zero"] == pytest.approx(
        [(a.abs() < NEAR_ZERO * a.pow(2).mean().sqrt()).float().mean().item() for a in squares], abs=1e-9)
    every = torch.cat([a.flatten() for a in squares])
    edges, density = activations["edges"], activations["density"]
    width = (edges[-1] - edges[0]) / HISTOGRAM_BINS
    assert edges[0] == 0  # a third or more are exactly 0, so the 0.1% quantile is 0 and no left tail is cut
    past = (every > edges[-1]).sum().item()
    assert 0 < past <= 0.001 * every.numel() + 1 and activations["beyond"] == pytest.approx(past / every.numel())
    assert activations["range"] == [0.0, every.max().item()] and every.max().item() > 1.2 * edges[-1]
    in_last_bin = ((every >= edges[-2]) & (every <= edges[-1])).sum().item()
    assert abs(density[-1] * every.numel() * width - in_last_bin) <= 1  # +-1: a value on the bin's edge
    assert sum(density) * width == pytest.approx(1 - past / every.numel(), abs=1e-6)


def rope_float64(x: torch.Tensor, base: float) -> torch.Tensor:
    """x [B, H, T, D] turned by RoPE from position 0, half-split (model/positions.py's formula), in float64."""
    T, D = x.shape[-2:]
    angles = torch.arange(T, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def direct_max_logits(model: Transformer, windows: torch.Tensor, normalised: bool) -> list[float]:
    """Per layer the max |q·k|/√D over causal pairs, from each block's attention input (caught by a hook) and the
    weights alone, in float64: the q and k rows of the stacked projection, each head RMS-normalised with its gains
    (if normalised), RoPE, query head h reading K/V head h // (H / H_kv)."""
    cfg = model.cfg
    H, H_kv, D, T = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, windows.shape[1]
    inputs = []
    hooks = [block.attn.register_forward_pre_hook(lambda _attn, args: inputs.append(args[0])) for block in model.blocks]
    with torch.no_grad():
        model(windows)
    for hook in hooks:
        hook.remove()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    found = []
    for block, x in zip(model.blocks, inputs):
        heads = (x.double() @ block.attn.qkv.weight.double().T).unflatten(-1, (H + 2 * H_kv, D)).transpose(1, 2)
        q, k = heads[:, :H], heads[:, H:H + H_kv]
        if normalised:
            q, k = (t / (t.pow(2).mean(-1, keepdim=True) + cfg.norm_eps).sqrt() * norm.weight.double()
                    for t, norm in ((q, block.attn.qk_norm.q_norm), (k, block.attn.qk_norm.k_norm)))
        q, k = rope_float64(q, cfg.rope_base), rope_float64(k, cfg.rope_base).repeat_interleave(H // H_kv, dim=1)
        found.append(((q @ k.transpose(-1, -2)).abs() / math.sqrt(D)).masked_fill(future, 0).amax().item())
    return found


def test_qk_norm_logits_are_a_direct_computation_within_the_bound_and_bypassing_reads_the_raw_projections():
    """A 2-layer GQA model with QK-norm and known gains, 3 windows read 2 at a time: as trained, each layer's max
    |q·k|/√D is the float64 computation with the norm and at most √D·1.5·2; bypassed, it is the one without (the
    raw projections, then RoPE), on the same block inputs. The model's logits are bit-identical afterwards, and
    after an error inside the bypass too."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, qk_norm="rmsnorm",
                      context_length=16)
    model = set_qk_gains(far_from_init(Transformer(cfg)))
    torch.manual_seed(0)
    windows = torch.randint(64, (3, 16))
    with torch.no_grad():
        before = model(windows)
    norms = [block.attn.qk_norm for block in model.blocks]
    scale = logit_scale(model, windows, batch_size=2)
    bound = math.sqrt(cfg.head_dim) * max(map(abs, GAIN_Q)) * max(map(abs, GAIN_K))
    assert scale["bound"] == pytest.approx([bound] * 2, rel=1e-6)
    assert scale["as_trained"] == pytest.approx(direct_max_logits(model, windows, normalised=True), rel=1e-5)
    assert scale["bypassed"] == pytest.approx(direct_max_logits(model, windows, normalised=False), rel=1e-5)
    assert all(logit <= b for logit, b in zip(scale["as_trained"], scale["bound"]))
    # the two columns differ by more than rounding, so the comparisons above tell them apart
    assert all(abs(raw - normed) > 0.1 * normed for raw, normed in zip(scale["bypassed"], scale["as_trained"]))
    assert all(block.attn.qk_norm is norm for block, norm in zip(model.blocks, norms))  # the model as it was
    with torch.no_grad():
        assert torch.equal(model(windows), before)
    # without QK-norm: the as-trained column only, the same direct computation without the norm
    plain = far_from_init(Transformer(ModelConfig.from_dict(cfg.to_dict() | {"qk_norm": "none"})))
    plain_scale = logit_scale(plain, windows)
    assert plain_scale["bypassed"] is None and plain_scale["bound"] is None
    assert plain_scale["as_trained"] == pytest.approx(direct_max_logits(plain, windows, normalised=False), rel=1e-5)


def decode_work(cfg: ModelConfig, position: int, cached: bool) -> int:
    """Multiply-adds of the step that feeds position t: per token and layer the q, k, v, output and FFN matmuls,
    the attention's q.k and weights.v over the t + 1 keys each query sees, and the LM head for the last token."""
    per_token = cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + cfg.d_model ** 2 \
        + 3 * cfg.d_model * cfg.ffn_width
    queries = [position] if cached else range(position + 1)
    attention = sum(2 * cfg.n_heads * cfg.head_dim * (t + 1) for t in queries)
    return cfg.n_layers * (len(queries) * per_token + attention) + cfg.d_model * cfg.vocab_size


def test_uncached_steps_grow_with_position_and_cached_ones_stay_the_same_order():
    """On a model wide and long enough for the work to show, the first and the last tenth of the positions, each by
    its fastest step. Counted, a cached step's work grows at most 1.32x from one to the other (its attention over
    more keys), an uncached step's at least 10x. Timed, a step also carries a fixed cost the count leaves out
    (dispatch, sampling), which flattens both: the uncached steps must still grow more than 3x, and the cached ones
    less than 3x, room for a busy machine."""
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, context_length=256)
    first, last = slice(0, 25), slice(230, 255)  # positions 1-25 and 231-255
    assert decode_work(cfg, 255, True) / decode_work(cfg, 1, True) < 1.33
    assert decode_work(cfg, 231, False) / decode_work(cfg, 25, False) > 10
    torch.manual_seed(0)
    times = decode_times(Transformer(cfg).eval(), first_token=1, repeats=3)
    assert times["positions"] == list(range(1, 256)) and times["cache_bytes"] == kv_cache_bytes(2, 2, 32, 256, 1, 4)
    uncached, cached = times["uncached_s"], times["cached_s"]
    assert min(uncached[last]) > 3 * min(uncached[first]), uncached
    assert min(cached[last]) < 3 * min(cached[first]), cached


# --- the report ----------------------------------------------------------------------------------------------

def embedded_images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


@pytest.mark.parametrize("which", ["one", "several"])
def test_every_section_is_in_the_page_and_every_figure_in_it(which, request):
    out = request.getfixturevalue(which)
    page, numbers = (out / "index.html").read_text(), json.loads((out / "report.json").read_text())
    labels = [c["label"] for c in numbers["checkpoints"]]
    assert labels == (["llama_tiny-norm=layernorm"] if which == "one" else [
        "position=rope, qk_norm=none, ffn=swiglu", "position=learned, qk_norm=none, ffn=swiglu",
        "position=rope, qk_norm=rmsnorm, ffn=relu2"])
    for section in SECTIONS:
        body = page.split(f'<section id="{section}">')[1].split("</section>")[0]
        assert "<img" in body and "<table>" in body and all(label in body for label in labels), section
    pngs = sorted(out.glob("*.png"))
    assert sorted(embedded_images(page)) == sorted(p.read_bytes() for p in pngs)
    maps = {f"attention_maps_{i}" for i in range(len(labels))}
    expected = maps | {"kv_cache", "kv_cache_by_context", "attention_wiring", "attention_entropy", "shift_check",
                       "score_distance", "residual_stream", "ffn", "qk_logits", "lengths_0"}
    assert {p.stem for p in pngs} == expected | ({"position_table", "lengths_2"} if which == "several" else set())
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    # Qwen3-Next against the context: its 36 linear layers' states stay, its 12 attention layers' K and V grow at a
    # quarter of the rate of 48 attention layers
    by_context = numbers["estimator"]["by_context"]
    growth = {line: sizes[-1] - sizes[0] for line, sizes in by_context["bytes"].items()}
    assert by_context["contexts"][0] == 1024 and by_context["contexts"][-1] == 131072
    assert growth == {"Qwen3-Next (3:1)": growth["all full attention"] // 4, "all linear": 0,
                      "all full attention": 48 * 2 * 2 * 256 * 2 * (131072 - 1024)}
    for ckpt in numbers["checkpoints"]:
        T = len(numbers["tokens"])
        assert len(ckpt["attention_maps"]["weights"][0][0]) == T and len(ckpt["kv_cache"]["cached_s"]) == 31
        assert (ckpt["positions"]["table_similarity"] is None) == (ckpt["model"]["position"] == "rope")


def test_past_the_context_scores_the_runs_val_split_at_1_2_and_4_times(several, rope_run):
    rope, learned, _ = json.loads((several / "report.json").read_text())["checkpoints"]
    lengths = rope["past_context"]
    assert [r["length"] for r in lengths["results"]] == [32, 64, 128]
    stream, bytes_per_token = run_val_split(rope_run / "ckpt")
    model, _ = load_checkpoint(rope_run)
    with torch.no_grad():  # the section's numbers are evaluate.py's chunked scores on the same tokens
        expected = score(model, stream[:lengths["val_tokens"]], 128, "chunked", 128, 8, bytes_per_token)
    assert lengths["results"][2] == expected
    # a checkpoint outside a training run dir: no val split, and the page says why
    assert learned["past_context"] == {"unavailable": f"no config.yaml in {learned['path'].removesuffix('/ckpt')}, "
                                                      f"so no val split to score: give a training run's dir"}


def test_the_qk_norm_section_reads_the_val_windows_and_stays_within_the_bound(several, rope_run, modern_run):
    """Section 8 of rope/, learned/ and modern/: the run's val windows at the trained context (the prompt for the
    checkpoint outside a run), modern's bound from its known gains, and for the two without QK-norm the as-trained
    column only, in report.json and in the page's table."""
    numbers = json.loads((several / "report.json").read_text())
    rope, learned, modern = (c["qk_logits"] for c in numbers["checkpoints"])
    windows = report_windows(run_val_split(rope_run / "ckpt")[0], 32)
    assert len(windows) > 1
    for scale in (rope, modern):
        assert (scale["source"], scale["windows"], scale["window_tokens"]) == ("val", len(windows), 32)
    assert (learned["source"], learned["windows"], learned["window_tokens"]) == ("prompt", 1, len(numbers["tokens"]))
    assert rope["bypassed"] is None and rope["bound"] is None and learned["bypassed"] is None
    model = report.load(str(modern_run))[0]
    assert modern["as_trained"] == pytest.approx(logit_scale(model, windows)["as_trained"], rel=1e-6)
    assert modern["bound"] == pytest.approx([math.sqrt(16) * 1.5 * 2.0], rel=1e-6)
    assert modern["as_trained"][0] <= modern["bound"][0]
    rows = page_tables(numbers)["qk_logits"]["rows"]
    assert [row[:4] for row in rows] == [
        ["position=rope, qk_norm=none, ffn=swiglu", "none", 0, f"val split, {len(windows)} windows of 32 tokens"],
        ["position=learned, qk_norm=none, ffn=swiglu", "none", 0,
         f"the prompt, {len(numbers['tokens'])} tokens (no val split)"],
        ["position=rope, qk_norm=rmsnorm, ffn=relu2", "rmsnorm", 0, f"val split, {len(windows)} windows of 32 tokens"]]
    assert [row[5:] for row in rows] == [[None, None], [None, None], [modern["bypassed"][0], modern["bound"][0]]]
    assert [c["ffn"]["kind"] for c in numbers["checkpoints"]] == ["swiglu", "swiglu", "relu2"]


def test_the_experts_section_reads_each_routers_choices_on_the_val_windows(rope_run, tmp_path):
    """Section 9 for an MoE checkpoint (a copy of rope/, so the run's val split, with 4 experts, 2 per token, far from
    init): the loads, MaxVio and each expert's most frequent tokens against the router's choices computed here, the
    heatmap, the table, and section 6's panel of the experts' gates."""
    shutil.copytree(rope_run, tmp_path / "moe")
    model, ckpt_dir = load_checkpoint(rope_run)
    torch.manual_seed(0)
    moe = far_from_init(Transformer(ModelConfig.from_dict(model.cfg.to_dict() | {
        "ffn": "moe", "n_experts": 4, "experts_per_token": 2})))
    save_checkpoint(tmp_path / "moe" / "ckpt", moe, ckpt_dir / "tokenizer.model")
    assert report.main(["--ckpt", str(tmp_path / "moe"), "--prompt", PROMPT, "--out", str(tmp_path / "out")]) == 0
    numbers = json.loads((tmp_path / "out" / "report.json").read_text())
    [ckpt] = numbers["checkpoints"]
    routing, windows = ckpt["experts"], report_windows(run_val_split(rope_run / "ckpt")[0], 32)
    assert (routing["source"], routing["tokens"], routing["n_experts"], routing["k"]) == ("val", windows.numel(), 4, 2)
    inputs = []
    hook = moe.blocks[0].ffn.register_forward_hook(lambda _m, args, _out: inputs.append(args[0].reshape(-1, 32)))
    with torch.no_grad():
        moe(windows)
    hook.remove()
    chosen = moe.blocks[0].ffn.router(inputs[0]).softmax(-1).topk(2).indices  # [N, 2], no bias: the softmax router
    [block] = routing["blocks"]
    loads = [(chosen == e).sum().item() / chosen.numel() for e in range(4)]
    assert block["load"] == pytest.approx(loads) and block["max_vio"] == pytest.approx(max(loads) * 4 - 1)
    ids = windows.flatten()
    occurrences = ids.bincount(minlength=300)
    for e, top in enumerate(block["top_tokens"]):
        counts = ids[(chosen == e).any(-1)].bincount(minlength=300)  # the tokens whose 2 choices include e
        assert [t["count"] for t in top] == counts[counts > 0].sort(descending=True).values[:5].tolist()
        shares = sorted(counts[t] / occurrences[t] for t in range(300) if counts[t] in [x["count"] for x in top])
        assert all(any(abs(t["share"] - share) < 1e-12 for share in shares) for t in top)
    page = (tmp_path / "out" / "index.html").read_text()
    body = page.split('<section id="experts">')[1].split("</section>")[0]
    assert "<img" in body and body.count("<tr>") == 1 + 4  # the header and an expert a row
    assert (tmp_path / "out" / "experts.png").is_file() and ckpt["ffn"]["kind"] == "moe"


@pytest.mark.parametrize("case,message", [
    ("missing", "--ckpt {missing}: no checkpoint at {missing}"),
    ("corrupt", "does not match the sha256 in its config.json"),
    ("empty prompt", "--prompt='' is empty"),
    ("one-token prompt", "--prompt='A' is one token"),
    ("long prompt", "tokens with BOS, more than model.context_length=32 of --ckpt"),
    ("vocabularies", "have different vocabularies (300 and 320 pieces)"),
    ("out", "exists and is not a report (no report.json in it)"),
    ("wandb", "is not a train.py run's checkpoint"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, message, rope_run, learned_ckpt, other_vocabulary,
                                                          tmp_path, capsys):
    missing, out = tmp_path / "missing", tmp_path / "out"
    argv = {"missing": ["--ckpt", str(missing)],
            "corrupt": ["--ckpt", str(corrupted(rope_run, tmp_path))],
            "empty prompt": ["--ckpt", str(rope_run), "--prompt", ""],
            "one-token prompt": ["--ckpt", str(rope_run), "--prompt", "A"],
            "long prompt": ["--ckpt", str(rope_run), "--prompt", PROMPT * 3],
            "vocabularies": ["--ckpt", str(rope_run), "--ckpt", str(other_vocabulary)],
            "out": ["--ckpt", str(rope_run), "--out", str(tmp_path)],
            "wandb": ["--ckpt", str(learned_ckpt), "--wandb"]}[case]
    before = sorted(tmp_path.rglob("*"))
    code = report.main(argv + (["--prompt", PROMPT] if "--prompt" not in argv else []) +
                       (["--out", str(out)] if "--out" not in argv else []))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("error: ") and message.format(missing=missing) in captured.err, captured.err
    assert sorted(tmp_path.rglob("*")) == before and not (learned_ckpt.parent / "report").exists()


def at_context(run: Path, folder: Path, context: int) -> Path:
    """run's model and tokenizer at another context: a checkpoint outside a run dir."""
    model, ckpt_dir = load_checkpoint(run)
    shorter = ModelConfig.from_dict(model.cfg.to_dict() | {"context_length": context})
    save_checkpoint(folder / "ckpt", Transformer(shorter), ckpt_dir / "tokenizer.model")
    return folder / "ckpt"


def test_the_default_prompt_is_cut_to_the_smallest_context_and_a_given_one_refused(rope_run, tmp_path, capsys):
    """rope/ (context 32) beside a model of context 8: without --prompt the report reads the default prompt's first 8
    tokens with BOS and says so in one line; the same text given as --prompt is refused, and so is the default on a
    context of 2, which holds less than the report reads."""
    short, tiny = at_context(rope_run, tmp_path / "short", 8), at_context(rope_run, tmp_path / "tiny", 2)
    tokenizer = report.load(str(rope_run))[2]
    ids = [tokenizer.bos_id] + tokenizer.encode(report.DEFAULT_PROMPT)
    assert len(ids) > 32
    assert report.main(["--ckpt", str(rope_run), "--ckpt", str(short), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"the default prompt is {len(ids)} tokens with BOS, more than model.context_length=8 of --ckpt {short}: the "
        f"report reads its first 8 (--prompt gives another)")
    numbers = json.loads((tmp_path / "out" / "report.json").read_text())
    assert numbers["token_ids"] == ids[:8] and numbers["prompt"] == tokenizer.decode(ids[1:8])
    assert report.main(["--ckpt", str(short), "--prompt", report.DEFAULT_PROMPT, "--out", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr() == ("", f"error: --prompt is {len(ids)} tokens with BOS, more than "
                                       f"model.context_length=8 of --ckpt {short}; give a shorter one\n")
    assert report.main(["--ckpt", str(tiny), "--out", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr() == ("", f"error: model.context_length=2 of --ckpt {tiny} holds fewer than the 3 tokens "
                                       f"the report reads (BOS and 2 after it)\n")
    assert not (tmp_path / "o2").exists()


def test_a_report_that_cannot_be_written_is_one_line_after_the_run_it_read(rope_run, tmp_path, capsys):
    """--ckpt through a link, as outputs/latest is: the run's real path is printed (the link moves with the next
    run); an --out inside a file cannot be made: one error line naming it, and nothing is written."""
    (tmp_path / "latest").symlink_to(rope_run)
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "report"
    before = sorted(tmp_path.rglob("*"))
    assert report.main(["--ckpt", str(tmp_path / "latest"), "--prompt", PROMPT, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0] == f"checkpoint: {rope_run.resolve()}"
    assert captured.err == f"error: cannot write {out}: Not a directory\n"
    assert sorted(tmp_path.rglob("*")) == before


def corrupted(run: Path, tmp_path: Path) -> Path:
    broken = tmp_path / "broken"
    shutil.copytree(run / "ckpt", broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 20)
    return broken


def test_wandb_offline_gets_every_figure_and_table(one):
    """`one` ran with --wandb offline: the checkpoint's own W&B run (train.py's id), in its run dir, holds every figure
    (wandb.Image) and every table (wandb.Table) of the report."""
    run = one.parent
    wandb_id = torch.load(run / "ckpt" / "train_state.pt", weights_only=True)["progress"]["wandb_id"]
    [files] = (run / "wandb").glob(f"offline-run-*-{wandb_id}/files")
    images = files / "media" / "images" / "report"
    for png in one.glob("*.png"):  # W&B names a logged image <key>_<step>_<hash of its bytes>.png
        [logged] = images.glob(f"{png.stem}_0_*.png")
        assert logged.read_bytes() == png.read_bytes()
    tables = sorted(p.name.split("_0_")[0] for p in (files / "media" / "table" / "report" / "table").glob("*.table.json"))
    assert tables == sorted(["kv_cache", "wiring", "kv_heads", "entropy", "shift", "stream", "ffn", "lengths",
                             "qk_logits"])


# --- the page in a browser -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    """Headless Chromium from the system's packages (Debian: chromium, chromium-driver), driven by Selenium with the
    driver's path given, so that Selenium Manager never looks for, or downloads, a browser of its own. Without one
    the test is skipped with the reason, which pytest's summary shows (-rs in pyproject.toml)."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        pytest.skip("no browser for the page's test: install Debian's chromium and chromium-driver "
                    "(apt-get install -y chromium chromium-driver, as README says)")
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # --no-sandbox: Chromium refuses to run as root without it, and CI runs as root
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    except WebDriverException as e:
        pytest.skip(f"chromium did not start for the page's test: {str(e.msg).splitlines()[0]}")
    yield driver
    driver.quit()


def set_fields(driver, **values):
    from selenium.webdriver.support.ui import Select

    for key, value in values.items():
        if key in ("dtype", "cache"):
            Select(driver.find_element("id", f"est-{key}")).select_by_value(value)
        else:
            field = driver.find_element("id", f"est-{key}")
            field.clear()
            field.send_keys(str(value))


def shown(driver) -> tuple[int, str]:
    text = driver.find_element("id", "est-bytes").text
    return int(text.replace(",", "")), driver.find_element("id", "est-gb").text


def test_the_page_in_a_browser(browser, several):
    browser.get((several / "index.html").as_uri())
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
    widths = browser.execute_script("return Array.from(document.images, img => img.complete ? img.naturalWidth : 0)")
    assert len(widths) == len(list(several.glob("*.png"))) and all(w > 0 for w in widths), widths
    numbers = json.loads((several / "report.json").read_text())
    model = numbers["checkpoints"][0]["model"]
    # prefilled with the first checkpoint: its cache at its full context in fp32
    assert shown(browser)[0] == kv_cache_bytes(model["n_layers"], model["n_kv_heads"],
                                               model["d_model"] // model["n_heads"], model["context_length"], 1, 4)
    browser.find_element("xpath", "//button[text()='LLaMA-2-7B']").click()
    assert shown(browser) == (2_147_483_648, "2.15 GB")
    set_fields(browser, layers=32, kv_heads=8, head_dim=128, seq=4096, dtype="fp16")
    assert shown(browser) == (kv_cache_bytes(32, 8, 128, 4096, 1, 2), "0.54 GB")
    set_fields(browser, kv_heads=1)
    assert shown(browser) == (kv_cache_bytes(32, 1, 128, 4096, 1, 2), "0.07 GB")
    for layers, kv_heads, head_dim, seq, batch, dtype, size in ((80, 8, 128, 131072, 64, "bf16", 2),
                                                                 (3, 5, 7, 11, 13, "fp8", 1)):
        set_fields(browser, layers=layers, kv_heads=kv_heads, head_dim=head_dim, seq=seq, batch=batch, dtype=dtype)
        assert shown(browser)[0] == kv_cache_bytes(layers, kv_heads, head_dim, seq, batch, size)
    set_fields(browser, seq=0)
    assert browser.find_element("id", "est-bytes").text == "seq must be a positive integer"
    # the fourth row: LLaMA-2-7B's sizes with MLA's 512 + 64, then DeepSeek-V3's 61 layers at bf16
    browser.find_element("xpath", "//button[text()='LLaMA-2-7B with MLA']").click()
    assert shown(browser) == (32 * (512 + 64) * 4096 * 2, "0.15 GB")
    browser.find_element("xpath", "//button[text()='DeepSeek-V3']").click()
    assert shown(browser) == (61 * (512 + 64) * 4096 * 2, "0.29 GB")
    set_fields(browser, rope_head_dim=0, seq=100, batch=3)  # no RoPE key
    assert shown(browser)[0] == kv_cache_bytes(61, 1, 512, 100, 3, 2, value_dim=0)
    set_fields(browser, kv_rank=0)
    assert browser.find_element("id", "est-bytes").text == "kv_rank must be a positive integer"
    set_fields(browser, cache="heads", layers=32, kv_heads=8, head_dim=128, seq=4096, batch=1, dtype="fp16")
    assert shown(browser) == (kv_cache_bytes(32, 8, 128, 4096, 1, 2), "0.54 GB")  # the latent's fields set aside
    # Mistral-7B's 32,768 positions in 4,096-position windows: an eighth of the 4.29 GB every layer would hold
    browser.find_element("xpath", "//button[text()='Mistral-7B']").click()
    assert shown(browser) == (kv_cache_bytes(32, 8, 128, 32768, 1, 2, window=4096, local_layers=32), "0.54 GB")
    set_fields(browser, local_layers=24)  # Gemma 3's way: some layers global, holding every position
    assert shown(browser)[0] == (8 * 32768 + 24 * 4096) * 2 * 8 * 128 * 2
    set_fields(browser, window=0)  # no window: the local layers are full ones
    assert shown(browser) == (kv_cache_bytes(32, 8, 128, 32768, 1, 2), "4.29 GB")
    set_fields(browser, window=4096, local_layers=33)
    assert browser.find_element("id", "est-bytes").text == "local_layers must be at most layers"
    # Qwen3-Next's 3:1: 12 attention layers hold 32,768 positions, 36 Gated DeltaNet layers a state each
    state = 32 * 128 * 128 + (2 * 16 + 32) * 128 * 3
    browser.find_element("xpath", "//button[text()='Qwen3-Next (3:1)']").click()
    assert shown(browser) == ((12 * 32768 * 2 * 2 * 256 + 36 * state) * 2, "0.84 GB")
    set_fields(browser, seq=65536)  # twice the positions: the attention layers' part doubles, the states stay
    assert shown(browser)[0] == (12 * 65536 * 2 * 2 * 256 + 36 * state) * 2
    set_fields(browser, linear_layers=48)  # all linear: no position held at all
    assert shown(browser)[0] == 48 * state * 2
    set_fields(browser, cache="heads")
    assert browser.find_element("id", "est-bytes").text == "this cache has no fixed state: linear_layers must be 0"
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
