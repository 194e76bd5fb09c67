"""train.py's helpers, in-process: parameter groups, lr schedule, settings checks, a resumed run's settings, run
names, metrics truncation on resume, the W&B mode choice. The end-to-end runs are in test_train.py."""
import json
import math

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from errors import ConfigError
from model.config import ModelConfig
from model.transformer import Transformer
from storage.checkpoint import CheckpointError
from training.config import check_train_config, named_settings, settings_of, settings_to_resume
from training.endings import RunEnded, stop_if_diverged
from training.horizon import Horizon
from training.optim import MuonAdamW, lr_at, make_optimizer, set_lr
from settings import CONFIG_DIR, compose_config
from training.state import Progress, RunCheckpoint, checkpoint_to_resume, resume_training, save_training_checkpoint
from training.tracking import default_run_name, keep_metrics_up_to, wandb_mode

TRAIN = OmegaConf.create(OmegaConf.to_container(compose_config([]).train, resolve=True))  # with the optim group's


def train_settings(**changes):
    settings = OmegaConf.merge(TRAIN, changes)
    settings.lr_decay_steps = changes.get("lr_decay_steps", settings.max_steps)
    return settings


def test_weight_decay_goes_to_matrices_only():
    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, context_length=8,
                      norm="layernorm", position="learned", bias=True)
    model = Transformer(cfg)
    decayed, plain = make_optimizer(model, train_settings(weight_decay=0.1)).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed_names = sorted(names[id(p)] for p in decayed["params"])
    plain_names = sorted(names[id(p)] for p in plain["params"])
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)
    # the tied LM head is the embedding: listed once
    assert decayed_names == sorted(["tok_emb.weight"] + [f"blocks.{i}.{m}.weight" for i in range(2)
                                                         for m in ("attn.qkv", "attn.out", "ffn.w_in", "ffn.w_out")])
    assert "abs_pos.table" in plain_names
    assert all(n.endswith("bias") or "norm" in n or n == "abs_pos.table" for n in plain_names)
    assert len(decayed_names) + len(plain_names) == len(list(model.parameters()))


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, context_length=8,
                      position="learned", qk_norm="rmsnorm", bias=True)
    model = Transformer(cfg)
    optimizer = make_optimizer(model, train_settings(optimizer="muon", lr=0.004, muon_lr=0.02, weight_decay=0.1))
    assert isinstance(optimizer, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    [muon], (decayed, plain) = optimizer.muon.param_groups, optimizer.adamw.param_groups
    assert sorted(names[id(p)] for p in muon["params"]) == sorted(
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.out", "ffn.w_in", "ffn.w_out"))
    assert [names[id(p)] for p in decayed["params"]] == ["tok_emb.weight"]  # the LM head tied to it, listed once
    assert all(n.endswith("bias") or "norm" in n or n == "abs_pos.table" for n in map(names.get, map(id, plain["params"])))
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    # the schedule's lr is train.lr's; Muon's peak is its own, and it follows the schedule in proportion
    set_lr(optimizer, 0.002)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.01, 0.002, 0.002], rel=1e-12)


def test_a_muon_step_is_an_orthogonalised_update_at_adamws_rms():
    """One step from zero momentum, no weight decay: W moves by lr 0.2 sqrt(max(A, B)) NS5(G), NS5(G) close to
    U V^T (G = U S V^T), so the move's singular values sit near lr 0.2 sqrt(max(A, B)) (Newton-Schulz's quintic
    leaves them in about [0.7, 1.2] of it; Jordan et al. 2024) and its rms near 0.2 lr, whatever G's scale. G is
    Gaussian, its singular values within 4x of each other, so that all of them reach that band in five steps."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, context_length=8))
    lr = 0.01
    optimizer = make_optimizer(model, train_settings(optimizer="muon", lr=lr, muon_lr=lr, weight_decay=0.0))
    w = model.blocks[0].ffn.w_out.weight  # [32, 96]: A = 32, B = 96
    before = w.detach().clone()
    w.grad = 1e-3 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0))
    optimizer.step()
    move = (before - w.detach()).double()
    singular = torch.linalg.svdvals(move) / (lr * 0.2 * 96 ** 0.5)
    assert 0.6 < singular.min() and singular.max() < 1.25, singular
    assert move.square().mean().sqrt().item() == pytest.approx(0.2 * lr, rel=0.25)


@pytest.mark.parametrize("ffn", ["swiglu", "relu2"])
def test_muon_orthogonalises_each_stacked_matrix_on_its_own(ffn):
    """[Wq; Wk; Wv] ([64 + 16 + 16, 64], GQA) and SwiGLU's [W1; W3] get gradients of scales 1, 1e-3 and 1e3 per
    matrix, each with singular values spread over [1, 4] x its scale. Muon moves each as a matrix of its own:
    singular values near lr 0.2 sqrt(max(A_i, B)) for its own rows A_i, whatever its gradient's scale (the band
    of the test above). Orthogonalised whole, the 1e-3 matrix's move would be ~1e-3 of that, the 1e3 one's
    would take the whole step."""
    generator = torch.Generator().manual_seed(0)

    def gradient(a: int, b: int, scale: float) -> torch.Tensor:  # U diag(s) V^T, s from 1 to 4
        u, v = (torch.linalg.qr(torch.randn(n, min(a, b), generator=generator, dtype=torch.float64))[0] for n in (a, b))
        return scale * u @ torch.diag(torch.linspace(1, 4, min(a, b), dtype=torch.float64)) @ v.T

    model = Transformer(ModelConfig(vocab_size=64, d_model=64, n_layers=1, n_heads=4, n_kv_heads=1, context_length=8,
                                    ffn=ffn)).double()
    lr = 0.01
    optimizer = make_optimizer(model, train_settings(optimizer="muon", lr=lr, muon_lr=lr, weight_decay=0.0))
    qkv, w_in = model.blocks[0].attn.qkv.weight, model.blocks[0].ffn.w_in.weight
    stacks = {qkv: [64, 16, 16], w_in: [256] if ffn == "relu2" else [192, 192]}  # d_ff: 4 d; 8/3 d up to 32s
    before = {}
    for w, rows in stacks.items():
        w.grad = torch.cat([gradient(a, 64, scale) for a, scale in zip(rows, [1.0, 1e-3, 1e3])])
        before[w] = w.detach().clone()
    optimizer.step()
    for w, rows in stacks.items():
        for a, move in zip(rows, (before[w] - w.detach()).split(rows)):
            singular = torch.linalg.svdvals(move) / (lr * 0.2 * max(a, 64) ** 0.5)
            assert 0.6 < singular.min() and singular.max() < 1.25, (a, singular)


def test_muon_on_one_matrix_steps_as_torchs_muon():
    """Three steps with momentum and weight decay (lr wd = 1%, a tenth of a step's move here) on weights that stack
    nothing: the moves of torch.optim.Muon (match_rms_adamw), up to its bfloat16 Newton-Schulz. bf16 rounds to 2^-9
    relative, and five iterations of three matmuls compound that: 1.0-1.2% of the move measured, 3% allowed. A
    step along the momentum instead of the Nesterov blend was 38% off, one without the decay 11%."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, context_length=8))
    weights = [model.blocks[0].attn.out.weight, model.blocks[0].ffn.w_out.weight]  # [64, 64], [64, 256]
    start = [w.detach().clone() for w in weights]
    generator = torch.Generator().manual_seed(1)
    gradients = [[torch.randn(w.shape, generator=generator) for w in weights] for _ in range(3)]

    def moved_by(optimizer) -> list[torch.Tensor]:
        with torch.no_grad():
            for w, w0 in zip(weights, start):
                w.copy_(w0)
        for step in gradients:
            for w, g in zip(weights, step):
                w.grad = g
            optimizer.step()
        return [w.detach() - w0 for w, w0 in zip(weights, start)]

    ours = moved_by(make_optimizer(model, train_settings(optimizer="muon", lr=0.01, muon_lr=0.01, weight_decay=1.0)).muon)
    theirs = moved_by(torch.optim.Muon(weights, lr=0.01, weight_decay=1.0, adjust_lr_fn="match_rms_adamw"))
    for a, b in zip(ours, theirs):
        assert ((a - b).norm() / b.norm()).item() < 0.03


def test_a_checkpoint_of_torchs_muon_resumes_with_its_momentum(tmp_path):
    """Runs trained before training/muon.py used torch.optim.Muon: its state, saved and loaded as train_state.pt
    is, gives ours its momentum, and the next step goes on from it."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, context_length=8))
    ours = make_optimizer(model, train_settings(optimizer="muon", lr=0.01, muon_lr=0.02, weight_decay=0.1)).muon
    weights = ours.param_groups[0]["params"]
    theirs = torch.optim.Muon(weights, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(2):
        model(torch.randint(0, 64, (2, 8))).logsumexp(-1).mean().backward()
        theirs.step()
        theirs.zero_grad(set_to_none=True)
    saved = [theirs.state[w]["momentum_buffer"].clone() for w in weights]
    torch.save(theirs.state_dict(), tmp_path / "state.pt")
    ours.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert len(saved) == 4 and all(torch.equal(ours.state[w]["momentum_buffer"], m) for w, m in zip(weights, saved))
    model(torch.randint(0, 64, (2, 8))).logsumexp(-1).mean().backward()
    ours.step()  # continues from the loaded momentum: 0.95 M + 0.05 G
    for m, w in zip(saved, weights):
        # lerp's m + 0.05 (g - m) rounds apart from 0.95 m + 0.05 g by a few float32 ulps of the larger of the two
        scale = torch.maximum(m.abs(), w.grad.abs()).max()
        assert torch.allclose(ours.state[w]["momentum_buffer"], 0.95 * m + 0.05 * w.grad, rtol=0, atol=1e-6 * scale.item())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_resumed_optimizer_continues_bit_for_bit(optimizer, tmp_path, tokenizer_file):
    """Three steps, a checkpoint, three more in a fresh model and optimizer loaded from it: the same weights as six
    steps in one go, exactly (the optimizers' states and the RNG travel in train_state.pt). Each step sets its own
    lr first, as train.py does, so Muon's group must keep its lr_scale through the checkpoint."""
    cfg = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context_length=8, qk_norm="rmsnorm")
    settings = train_settings(optimizer=optimizer, lr=0.01, muon_lr=0.02 if optimizer == "muon" else None)

    def steps(model, opt, first, n):
        for step in range(first, first + n):
            set_lr(opt, 0.01 * (step + 1) / 6)  # a warm-up
            model(torch.randint(0, 300, (4, 8))).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def fresh():
        torch.manual_seed(0)
        model = Transformer(cfg)
        return model, make_optimizer(model, settings)

    whole, whole_opt = fresh()
    steps(whole, whole_opt, 0, 6)
    first, first_opt = fresh()
    steps(first, first_opt, 0, 3)
    save_training_checkpoint(tmp_path / "ckpt", first, tokenizer_file, first_opt, Progress(step=3))
    second, second_opt = fresh()
    assert resume_training(tmp_path / "ckpt", second, tokenizer_file, second_opt).step == 3
    steps(second, second_opt, 3, 3)
    for (name, a), b in zip(whole.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name


def step_lrs(train, steps: int) -> list[float]:
    horizon = Horizon(train.max_steps, train.lr_decay_steps, None)
    return [lr_at(*horizon.position(step, 0.0, 0.0), train) for step in range(steps)]


def test_a_loss_not_finite_before_the_first_update_is_not_put_down_to_the_learning_rate(tmp_path):
    """Step 1's loss is the starting weights' own, before any update: a NaN there names the model, not train.lr. A NaN
    later, or weights the first update made infinite, still points at train.lr."""
    model = Transformer(ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, context_length=8))
    checkpoint = RunCheckpoint(tmp_path, model, tmp_path / "tokenizer.model", make_optimizer(model, TRAIN),
                               Progress(), resumed=False)

    def ending(train_loss: float, grad_norm: float, step: int) -> str:
        with pytest.raises(RunEnded) as ended:
            stop_if_diverged(train_loss, grad_norm, model, step, 3e-3, checkpoint)
        assert (ended.value.reason, ended.value.exit_code) == (f"diverged at step {step}", 1)
        return ended.value.line

    assert ending(math.nan, math.nan, 1) == (
        "error: training diverged at step 1 (train loss nan, grad norm nan, weights finite); the loss was not finite "
        "before the first update, so train.lr=0.003 is not the cause: the model's settings or its starting weights "
        "give a non-finite loss. Stopped; no checkpoint had been saved yet")
    assert ending(math.nan, math.nan, 2).endswith("); try a lower train.lr=0.003. Stopped; no checkpoint had been "
                                                  "saved yet")
    with torch.no_grad():
        next(model.parameters()).fill_(math.inf)  # as a first update of lr 1e6 leaves them
    assert ending(4.16, 0.5, 1) == ("error: training diverged at step 1 (train loss 4.16, grad norm 0.5, weights not "
                                    "finite); try a lower train.lr=0.003. Stopped; no checkpoint had been saved yet")


def test_lr_warms_up_linearly_then_follows_the_cosine_down_to_min_lr():
    train = train_settings(lr=1.0, min_lr=0.1, warmup_fraction=4 / 14, max_steps=14)
    lrs = step_lrs(train, 16)
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0], rel=1e-12)
    assert lrs[4] == 1.0  # the cosine starts at its top
    assert lrs[9] == pytest.approx(0.55)  # half-way through the 10 decay steps: (lr + min_lr) / 2
    assert all(a > b for a, b in zip(lrs[4:14], lrs[5:14]))
    assert lrs[14:] == [0.1, 0.1]
    no_warmup = train_settings(lr=1.0, min_lr=0.0, warmup_fraction=0, max_steps=10)
    assert step_lrs(no_warmup, 1) == [1.0]


def test_wsd_warms_up_holds_the_peak_then_decays_linearly_to_min_lr_over_its_fraction():
    """train.decay_fraction=0.5 of 12 steps, 2 of warm-up: the peak for steps 2-5, then 1 - 0.9 k / 6 at step 6 + k."""
    train = train_settings(lr=1.0, min_lr=0.1, warmup_fraction=2 / 12, decay_fraction=0.5, max_steps=12)
    lrs = step_lrs(train, 14)
    assert lrs[:2] == pytest.approx([0.5, 1.0], rel=1e-12)
    assert lrs[2:7] == [1.0] * 5  # held until half the run is done
    assert lrs[7:12] == pytest.approx([1 - 0.9 * k / 6 for k in range(1, 6)], rel=1e-12)
    assert lrs[12:] == [0.1, 0.1]
    whole = train_settings(lr=1.0, min_lr=0.0, warmup_fraction=0, decay_fraction=1.0, max_steps=4)
    assert step_lrs(whole, 4) == pytest.approx([1.0, 0.75, 0.5, 0.25], rel=1e-12)  # a straight line from the start


def test_lr_decay_steps_decouples_the_schedule_from_max_steps():
    """Training N/2 steps with lr_decay_steps=N follows the N-step run's schedule exactly."""
    full = train_settings(max_steps=20)
    half = train_settings(max_steps=10, lr_decay_steps=20)
    assert step_lrs(half, 10) == step_lrs(full, 10)


@pytest.mark.parametrize("changes, world_size, message", [
    ({"batch_size": 16, "micro_batch_size": 4}, 1, None),
    ({"batch_size": 16, "micro_batch_size": 4}, 2, None),
    ({"batch_size": 12, "micro_batch_size": 4}, 2, "train.batch_size=12 must be a multiple of 2 processes x "
                                                   "train.micro_batch_size=4; set train.micro_batch_size to one of "
                                                   "1, 2, 3, 6, or null to choose"),
    ({"batch_size": 5}, 2, "train.batch_size=5 must be a multiple of the 2 processes"),
    ({"max_steps": None, "time_budget": None}, 1,
     "train.max_steps=null needs a train.time_budget: a run must end by steps or by time"),
    ({"time_budget": "10 minutes"}, 1, "train.time_budget='10 minutes' must be seconds (600) or a duration like "
                                       "10m, 1h30m, 2m30s"),
    ({"max_steps": 0}, 1, "train.max_steps=0 must be a positive integer"),
    ({"min_lr": 0.1, "lr": 0.01}, 1, "train.min_lr=0.1 must be a number in [0, train.lr=0.01]"),
    ({"warmup_fraction": 1.0}, 1, "train.warmup_fraction=1.0 must be a number in [0, 1)"),
    ({"warmup_fraction": 0.25, "decay_fraction": 0.8}, 1,
     "train.decay_fraction=0.8 must be null (the cosine) or a number in (0, 1 - train.warmup_fraction = 0.75]"),
    ({"decay_fraction": 0.0}, 1, "train.decay_fraction=0.0 must be null (the cosine) or a number in (0, 1 - "
                                 "train.warmup_fraction = 0.9]"),
    ({"reference_tokens_per_s": 0.0}, 1, "train.reference_tokens_per_s=0.0 must be a positive number or null"),
    ({"threads": 0}, 1, "train.threads=0 must be a positive integer or null"),
    ({"optimizer": "muon", "muon_lr": 0.0}, 1, "train.muon_lr=0.0 must be a positive number: Muon's peak learning rate"),
    ({"optimizer": "muon", "muon_lr": None}, 1, "train.muon_lr=None must be a positive number: Muon's peak learning rate"),
    ({"optimizer": "adamw", "muon_lr": 0.01}, 1, "train.muon_lr=0.01 does nothing with train.optimizer=adamw; choose "
                                                 "optim=muon"),
    ({"optimizer": "sgd"}, 1, "train.optimizer='sgd' must be one of adamw, muon (optim=muon chooses Muon)"),
])
def test_train_settings_checks(changes, world_size, message):
    train = train_settings(**changes)
    if message is None:
        micro = changes["micro_batch_size"]
        assert check_train_config(train, world_size) == (micro, changes["batch_size"] // (world_size * micro))
    else:
        with pytest.raises(ConfigError) as e:
            check_train_config(train, world_size)
        assert str(e.value) == message


@pytest.mark.parametrize("batch_size, world_size, micro, accumulation", [
    (16, 1, 16, 1), (4, 1, 4, 1), (64, 1, 16, 4), (24, 1, 12, 2), (48, 2, 12, 2), (17, 1, 1, 17), (32, 4, 8, 1)])
def test_a_null_micro_batch_is_the_largest_divisor_up_to_the_maximum(batch_size, world_size, micro, accumulation):
    train = train_settings(batch_size=batch_size, micro_batch_size=None)
    assert check_train_config(train, world_size) == (micro, accumulation)


@pytest.mark.parametrize("choices, name", [
    ({"model": "llama_tiny", "norm": "rmsnorm", "norm_position": "pre", "position": "rope",
      "attention": "gqa", "ffn": "swiglu", "data": "text"}, "llama_tiny"),
    ({"model": "llama_tiny", "norm": "layernorm", "norm_position": "pre", "position": "rope",
      "attention": "mha", "ffn": "swiglu", "data": "shakespeare"}, "llama_tiny-norm=layernorm-attention=mha"),
    ({"model": "transformer2017_tiny", "norm": "layernorm", "norm_position": "post", "position": "rope",
      "attention": "mha", "ffn": "relu", "data": "shakespeare"}, "transformer2017_tiny-position=rope"),
    ({"model": "llama_tiny", "norm": "rmsnorm", "norm_position": "pre", "position": "rope", "attention": "gqa",
      "ffn": "relu", "data": "shakespeare", "experiment": "quick"}, "llama_tiny-ffn=relu"),
    ({"model": "llama_tiny", "norm": "rmsnorm", "norm_position": "pre", "position": "rope", "attention": "gqa",
      "ffn": "swiglu", "qk_norm": "rmsnorm", "optim": "muon", "data": "text"}, "llama_tiny-qk_norm=rmsnorm-optim=muon"),
    ({"model": "modern_tiny", "norm": "rmsnorm", "norm_position": "pre", "position": "rope", "attention": "gqa",
      "ffn": "swiglu", "qk_norm": "rmsnorm", "optim": "muon", "data": "text"}, "modern_tiny-ffn=swiglu"),
])
def test_default_run_name_lists_the_groups_switched_away_from_the_preset(choices, name):
    assert default_run_name({"qk_norm": "none", "optim": "adamw", **choices}) == name  # the groups every run has


def test_a_fresh_run_never_overwrites_a_checkpoint_and_resume_needs_one(tmp_path):
    with pytest.raises(CheckpointError, match=f"train.resume=true but there is no checkpoint in {tmp_path}"):
        checkpoint_to_resume(tmp_path, resume=True)
    assert checkpoint_to_resume(tmp_path, resume=False) is None
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert checkpoint_to_resume(tmp_path, resume=True) == tmp_path / "ckpt"
    with pytest.raises(ConfigError, match=f"{tmp_path} already holds a checkpoint; add train.resume=true"):
        checkpoint_to_resume(tmp_path, resume=False)


def test_resume_keeps_metrics_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "train_loss": 1.0 / s}) for s in range(1, 7)]
    path.write_text("\n".join(lines) + '\n{"step": 7, "train_lo')  # killed mid-line
    keep_metrics_up_to(path, 4)
    assert path.read_text() == "\n".join(lines[:4]) + "\n"


def test_wandb_mode_is_offline_without_a_login(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_mode(None) == "offline"  # no netrc file at all
    netrc.write_text("machine example.com login x password y\n")
    assert wandb_mode(None) == "offline"
    netrc.write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    netrc.chmod(0o600)
    assert wandb_mode(None) == "online"
    assert wandb_mode("disabled") == "disabled"  # an explicit setting wins
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode(None) == "disabled"
    with pytest.raises(ConfigError, match="wandb.mode='cloud' must be one of online, offline, disabled"):
        wandb_mode("cloud")


QUICK_RUN = ["model=llama_quick", "+experiment=quick", "norm=layernorm", "train.lr=0.004", "train.max_steps=40"]


def resumed(run: list[str], command_line: list[str]) -> tuple[dict, list[str]]:
    """The settings `python train.py <command_line> train.resume=true` continues a run of `run`'s overrides
    with, and the notice's changes, composed as train.py does inside Hydra's main."""
    saved = OmegaConf.create(OmegaConf.to_container(compose_config(run), resolve=True))  # the run's config.yaml
    overrides = [*command_line, "train.resume=true"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        HydraConfig.instance().set_config(compose("config", overrides=overrides, return_hydra_config=True))
        cfg = compose("config", overrides=overrides)
        base = settings_of(cfg)
        changed = settings_to_resume(cfg, saved, compose("config"), lambda: named_settings(overrides, base))
    return OmegaConf.to_container(cfg, resolve=True), changed


@pytest.mark.parametrize("command_line", [[], QUICK_RUN, ["model.n_layers=2"]],
                         ids=["nothing", "the run's own overrides", "a setting the run has"])
def test_a_resume_takes_the_runs_own_settings(command_line):
    cfg, changed = resumed(QUICK_RUN, command_line)
    own = OmegaConf.to_container(compose_config(QUICK_RUN), resolve=True)
    assert changed == [] and {k: v for k, v in cfg.items() if k != "train"} == {k: v for k, v in own.items()
                                                                               if k != "train"}
    assert cfg["train"] == own["train"] | {"resume": True}
    assert (cfg["model"]["name"], cfg["model"]["n_layers"], cfg["train"]["lr"]) == ("llama_quick", 2, 0.004)


def test_a_resume_names_what_it_may_change():
    cfg, changed = resumed(QUICK_RUN, ["train.time_budget=10m", "train.max_steps=null", "train.batch_size=8"])
    # train.lr_decay_steps follows train.max_steps: named with it, so the schedule follows the time
    assert changed == ["train.time_budget=10m (was 2m)", "train.max_steps=None (was 40)", "train.batch_size=8 (was 16)",
                       "train.lr_decay_steps=None (was 40)"]
    assert (cfg["train"]["time_budget"], cfg["train"]["batch_size"], cfg["model"]["n_layers"]) == ("10m", 8, 2)


@pytest.mark.parametrize("command_line, message", [
    (["norm=rmsnorm"], "model.norm=rmsnorm: the run being resumed has model.norm=layernorm"),  # the default option
    (["model=transformer2017_tiny"],
     "model.name=transformer2017_tiny: the run being resumed has model.name=llama_quick"),
    (["train.lr=0.01"], "train.lr=0.01: the run being resumed has train.lr=0.004"),
    (["train.seed=1"], "train.seed=1: the run being resumed has train.seed=0"),
    (["data=tinyshakespeare"], "data.name=tinyshakespeare: the run being resumed has data.name=shakespeare"),
    (["optim=muon"], "train.optimizer=muon: the run being resumed has train.optimizer=adamw"),
    (["qk_norm=rmsnorm"], "model.qk_norm=rmsnorm: the run being resumed has model.qk_norm=none")])
def test_a_resume_refuses_what_would_change_its_checkpoint(command_line, message):
    with pytest.raises(ConfigError) as refused:
        resumed(QUICK_RUN, command_line)
    assert str(refused.value).startswith(message + ", and a resumed run keeps what its checkpoint was trained with")
