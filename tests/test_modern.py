"""After LLaMA, through train.py in process: a run with QK-norm, ReLU² and Muon together, what its config and
checkpoint record, and the settings it refuses with one line and nothing written. The parts: QK-norm against a
direct computation (here), Muon's groups, step and exact resume (test_train_parts.py), the KV cache for every
combination (test_generate.py), the exports (test_interop.py, test_gguf.py)."""
import math

import pytest
import torch
from omegaconf import OmegaConf

from data_helpers import metrics, summary, train_in_process
from interop_helpers import one_error_line
from model import ModelConfig, Transformer
from storage.checkpoint import load_checkpoint
from weights import far_from_init


def test_qk_norm_rms_normalises_each_head_before_rope():
    """Attention.heads with QK-norm against the formula written out in float64: each q and k head divided by its
    rms over the head's D dims and multiplied by its gain, then rotated (the rotation is the model's own, checked
    against transformers elsewhere; it keeps each head's norm, so |q_h| = sqrt(D) exactly with unit gains)."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, context_length=16,
                      qk_norm="rmsnorm")
    model = far_from_init(Transformer(cfg), seed=3).double()
    attn = model.blocks[0].attn
    x = torch.randn(2, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    q, k, _ = attn.heads(x)
    raw = attn.qkv(x).view(2, 16, 8, 8).transpose(1, 2)  # [B, H + 2 H_kv, T, D]
    eps = cfg.norm_eps

    def by_hand(heads, gain):
        return heads / (heads.pow(2).mean(-1, keepdim=True) + eps).sqrt() * gain

    expected = attn.rotary(torch.cat([by_hand(raw[:, :4], attn.qk_norm.q_norm.weight),
                                      by_hand(raw[:, 4:6], attn.qk_norm.k_norm.weight)], dim=1), 0)
    torch.testing.assert_close(torch.cat([q, k], dim=1), expected, rtol=1e-12, atol=1e-12)
    # the scale the norm leaves: |q_h| <= sqrt(D) max|g_q| for every head and position
    bound = math.sqrt(8) * attn.qk_norm.q_norm.weight.abs().max()
    assert (q.norm(dim=-1) <= bound * (1 + 1e-12)).all()


def test_a_run_with_qk_norm_relu2_and_muon_trains_and_records_them(workdir, tiny, monkeypatch):
    run_dir = workdir / "modern"
    assert train_in_process(run_dir, [*tiny, "qk_norm=rmsnorm", "ffn=relu2", "optim=muon", "train.lr=0.01",
                                      "train.max_steps=12"], monkeypatch) == 0
    config = OmegaConf.load(run_dir / "config.yaml")
    assert (config.model.qk_norm, config.model.ffn, config.train.optimizer, config.train.muon_lr) == (
        "rmsnorm", "relu2", "muon", 0.01)  # Muon's lr follows train.lr unless set
    assert summary(run_dir)["name"] == "llama_tiny-norm=layernorm-qk_norm=rmsnorm-ffn=relu2-optim=muon"
    losses = [m["train_loss"] for m in metrics(run_dir)]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3
    model, _ = load_checkpoint(run_dir)
    assert model.cfg.qk_norm == "rmsnorm" and model.cfg.ffn == "relu2"
    state = torch.load(run_dir / "ckpt" / "train_state.pt", weights_only=True)
    assert set(state["optimizer"]) == {"muon", "adamw"} and state["optimizer"]["muon"]["state"]


@pytest.mark.parametrize("case, overrides, message", [
    ("negative", ["optim=muon", "train.muon_lr=-0.01"], "error: train.muon_lr=-0.01 must be a positive number: Muon's peak"),
    ("zero", ["optim=muon", "train.muon_lr=0"], "error: train.muon_lr=0.0 must be a positive number: Muon's peak"),
    ("head_dim", ["qk_norm=rmsnorm", "position=none", "model.d_model=4", "model.n_heads=4", "model.n_kv_heads=1"],
     "error: model.qk_norm=rmsnorm normalises each head, but model.d_model=4 / model.n_heads=4 = 1 dim per head"),
])
def test_bad_settings_are_one_line_exit_2_and_nothing_written(case, overrides, message, workdir, tiny, monkeypatch,
                                                              capsys):
    run_dir = workdir / f"refused-{case}"
    capsys.readouterr()
    assert train_in_process(run_dir, [*tiny, *overrides], monkeypatch) == 2
    assert one_error_line(capsys).startswith(message)
    assert not any(run_dir.rglob("*"))  # Hydra makes the run dir before train.py starts; nothing is written in it
