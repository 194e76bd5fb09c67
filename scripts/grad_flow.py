"""Gradient flow at initialisation: how much gradient reaches the first block, relative to the last,
for Pre-Norm and Post-Norm at several depths.

    python scripts/grad_flow.py                                 # llama_tiny, depths 4 12 24
    python scripts/grad_flow.py model.d_model=64 --depths 2 8   # any Hydra override of the model, first

Each model is freshly initialised (torch seed --seed) and does one forward/backward of the
next-token loss on one fixed batch of uniformly random tokens: no data or tokenizer is needed,
and every model sees the same batch. Two ratios, block 1 over block L:

    stream: ||dL/dh_1|| / ||dL/dh_L||          h_i = the residual stream leaving block i
    params: ||dL/dtheta_1|| / ||dL/dtheta_L||  theta_i = all of block i's weights
and, to explain them, the growth of the stream itself: rms(h_L) / rms(h_1).

A ratio near 1 means the first block learns at the pace of the last; well below 1 means the
gradient shrinks on its way down, the vanishing that a learning-rate warm-up is meant to nurse.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli import ascii_numbers, run_command  # noqa: E402  (after the path: run as a script from anywhere)
from model import ModelConfig, Transformer  # noqa: E402
from model.config import NORM_POSITIONS  # noqa: E402
from settings import compose_config  # noqa: E402
from training.config import model_config  # noqa: E402
from training.evaluate import next_token_loss  # noqa: E402

def gradient_ratios(model: Transformer, tokens: torch.Tensor) -> dict:
    """The stream and params gradient ratios of block 1 over block L for one backward pass of
    the next-token loss on tokens [B, T + 1], and the stream's rms growth from block 1 to L."""
    outputs = []

    def keep_output(_block, _inputs, output):
        output.retain_grad()
        outputs.append(output)

    hooks = [block.register_forward_hook(keep_output) for block in model.blocks]
    loss = next_token_loss(model, tokens[:, :-1], tokens[:, 1:])
    for hook in hooks:
        hook.remove()
    loss.backward()

    def param_grad_norm(block):
        return torch.cat([p.grad.flatten() for p in block.parameters()]).norm()

    def rms(h):
        return h.detach().pow(2).mean().sqrt()

    first, last = model.blocks[0], model.blocks[-1]
    return {"stream": (outputs[0].grad.norm() / outputs[-1].grad.norm()).item(),
            "params": (param_grad_norm(first) / param_grad_norm(last)).item(),
            "rms_growth": (rms(outputs[-1]) / rms(outputs[0])).item()}


def model_config_for(overrides: list[str]) -> ModelConfig:
    """The `model` node Hydra composes from configs/ with these overrides, e.g. ["norm_position=post"]."""
    return model_config(compose_config(overrides))


def grad_flow_rows(depths: list[int], overrides: list[str], batch_size: int, seed: int):
    """One dict per (norm position, depth) with the numbers of gradient_ratios."""
    for norm_position in NORM_POSITIONS:
        for depth in depths:
            cfg = model_config_for([*overrides, f"norm_position={norm_position}", f"model.n_layers={depth}"])
            torch.manual_seed(seed)
            model = Transformer(cfg)
            tokens = torch.randint(cfg.vocab_size, (batch_size, cfg.context_length + 1),
                                   generator=torch.Generator().manual_seed(seed))
            yield {"norm_position": norm_position, "n_layers": depth, **gradient_ratios(model, tokens)}


def main(argv=None):
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 12, 24])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=transformer2017_tiny")
    args = parser.parse_args(argv)
    if min(args.depths) < 2:
        parser.error(f"--depths {min(args.depths)}: a first/last ratio needs at least 2 blocks")
    if status := run_command(lambda: model_config_for(args.overrides)):  # a bad override fails before any model
        sys.exit(status)
    print("| norm position | layers | stream ‖∂L/∂h₁‖ / ‖∂L/∂h_L‖ | params ‖∇θ₁‖ / ‖∇θ_L‖ | rms(h_L) / rms(h₁) |")
    print("|---|---:|---:|---:|---:|")
    for row in grad_flow_rows(args.depths, args.overrides, args.batch_size, args.seed):
        print(f"| {row['norm_position']} | {row['n_layers']} | {row['stream']:.3f} | {row['params']:.3f} "
              f"| {row['rms_growth']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
