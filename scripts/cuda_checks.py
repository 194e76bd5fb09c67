"""The CUDA path's checks, run by scripts/gpu_check.sh on a machine with a GPU (the CPU suite cannot run them).

Each check prints one line and raises on failure:
- bf16 autocast training steps (train.py's loss; fused AdamW, and Muon + AdamW, as training/optim.py builds
  them) stay finite and lower the loss on a repeated batch;
- the forward pass under autocast matches the fp32 CPU forward of the same weights to bf16's precision;
- sdpa on CUDA picks a fused kernel (flash or memory-efficient), not the math fallback;
- cached greedy decoding on CUDA gives the tokens of recomputation without the cache.
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from generation.engine import Engine
from model import ModelConfig, Transformer
from settings import compose_config
from training.config import autocast_for
from training.evaluate import next_token_loss
from training.optim import make_optimizer


def main():
    assert torch.cuda.is_available(), "no CUDA device: run this on a GPU machine"
    cuda = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, context_length=256)
    cpu_model = Transformer(cfg)
    model = Transformer(cfg).to(cuda)
    model.load_state_dict(cpu_model.state_dict())
    tokens = torch.randint(cfg.vocab_size, (8, cfg.context_length + 1))

    with torch.no_grad(), autocast_for(cuda):
        logits = model(tokens[:, :-1].to(cuda)).float().cpu()
    reference = cpu_model(tokens[:, :-1]).detach()
    error = (logits - reference).abs().max().item()
    assert error < 0.1 * reference.abs().max().item(), error  # bf16 keeps ~3 significant digits
    print(f"bf16 autocast forward vs fp32 CPU: max |diff| {error:.4f} (logits up to {reference.abs().max():.2f})")

    q = torch.randn(8, 8, 256, 32, device=cuda, dtype=torch.bfloat16)
    kv = torch.randn(8, 2, 256, 32, device=cuda, dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):  # raises if neither applies
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    print("sdpa: a fused kernel (flash or memory-efficient) runs GQA with is_causal")

    batch = tokens.to(cuda)
    for optim in ("adamw", "muon"):  # muon: training/muon.py's Newton-Schulz on CUDA, AdamW (fused) for the rest
        model.load_state_dict(cpu_model.state_dict())
        optimizer = make_optimizer(model, compose_config([f"optim={optim}"]).train)
        fused = optimizer.param_groups if optim == "adamw" else optimizer.adamw.param_groups
        assert all(group.get("fused") for group in fused), "AdamW is not fused"
        losses = []
        for _ in range(20):
            with autocast_for(cuda):
                loss = next_token_loss(model, batch[:, :-1], batch[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
        assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 1, losses
        print(f"bf16 training, optim={optim}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in 20 steps on one batch")

    engine, prompt = Engine(model.eval()), [[1, 2, 3, 4]]
    with autocast_for(cuda):
        cached = torch.stack(list(engine.generate(prompt, 64, temperature=0)), dim=1)
        recomputed = torch.stack(list(engine.generate(prompt, 64, temperature=0, use_cache=False)), dim=1)
    same = (cached == recomputed).float().mean().item()
    assert same > 0.9, same  # bf16: a near-tie of two logits may part them late in the sequence
    print(f"cached greedy decode on CUDA: {same:.0%} of 64 tokens equal recomputation's")


if __name__ == "__main__":
    main()
