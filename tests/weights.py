"""One way to put a test model's weights far from init, used by every test that needs it.

At init (matrices std 0.02, gains 1) logits sit near 0, so greedy picks are decided by float error and a
swapped matrix or gain can go unnoticed. Here each matrix is N(0, (2 / sqrt(fan_in))^2), so a projection of a
unit-scale input has outputs of std about 2 whatever the width, and each vector (norm gains, biases) is 1 + N(0, 0.3^2).
"""
import torch


def far_from_init(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """model in eval mode, its parameters redrawn in place from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.3 * noise if p.ndim == 1 else 2 / p.shape[-1] ** 0.5 * noise)
    return model.eval()


def ffn_settings(ffn: str) -> dict:
    """The ModelConfig settings a tiny test model needs beside model.ffn: ffn=moe's 4 experts, 2 per token (the
    experts' width follows the dense d_ff, model/moe.py); none for a dense FFN."""
    return {"n_experts": 4, "experts_per_token": 2} if ffn == "moe" else {}
