"""What an MoE block (model/moe.py) costs at the ablation's size, and which dispatch is fastest here.

    python scripts/profile_moe.py [--repeats 20] [overrides]     # default: +experiment=ablation ffn=moe

One MoE block of the composed model (d 128, 8 experts of 176, 2 per token) on the ablation's batch (16 x 128 =
2,048 tokens), forward and backward, in one process:

1. The dispatches, on the same tokens, routing and weights, alternating every round, medians and ranges of
   --repeats: `loop` (sort by expert, one matmul per weight per expert, index_add: model/moe.py's off the CPU and
   in float64), `grouped_mm` (the same sorted rows through torch's grouped GEMM, F.grouped_mm, one call per weight
   for all the experts: model/moe.py's on a CPU), and `dense` (every expert on every token in one batched matmul, the unchosen gated by 0: E/k
   times the FLOPs, no sort). Each is checked against `loop` before timing.
2. The block's time split into the matmuls (the experts', and the router's small one), SwiGLU's element-wise ops
   with the gates' product, routing (softmax or sigmoid, top-k, the gates' normalisation) and dispatch (sort,
   gather, index_add, copies), from torch.profiler's self CPU time per op over forward and backward.
3. The whole training step at that size, the model with ffn=moe against the same model dense (the ablation's
   baseline: its SwiGLU holds the parameters the MoE's k active experts hold), as bench.py --ablation times it
   (forward, loss, backward, AdamW; alternating, medians of --repeats): the MoE's tokens/s over the dense one's.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cli import ascii_numbers  # noqa: E402
from benchmarks.timing import Device, speed_rows, timed_alternately  # noqa: E402  (the repo root: bench.py's)
from benchmarks.train_steps import our_peer, tokens_per_step  # noqa: E402
from model import Transformer  # noqa: E402
from model.moe import SETTINGS as MOE_SETTINGS  # noqa: E402
from model.moe import MoE  # noqa: E402
from settings import compose_config  # noqa: E402
from training.config import model_config  # noqa: E402

# torch.profiler's op names, by the part of the block they do
MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::_grouped_mm", "aten::matmul", "aten::linear")
ELEMENTWISE = ("aten::silu", "aten::silu_backward", "aten::mul")  # SwiGLU's, and the gates' product
ROUTING = ("aten::softmax", "aten::_softmax", "aten::sigmoid", "aten::topk", "aten::gather", "aten::div",
           "aten::_softmax_backward_data", "aten::sigmoid_backward", "aten::sum", "aten::add")


def loop_experts(moe: MoE, x: torch.Tensor, chosen: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """model/moe.py's dispatch off the CPU and in float64: the same sorted rows, one matmul per weight per expert."""
    E, d_e = moe.n_experts, moe.expert_d_ff
    flat = chosen.flatten()
    order = flat.argsort(stable=True)
    tokens = order // moe.k
    w_in = moe.experts_in.weight.view(E, 2 * d_e, -1)
    w_out = moe.experts_out.weight.view(E, d_e, -1)
    hidden = []
    for e, x_e in enumerate(x[tokens].split(flat.bincount(minlength=E).tolist())):
        gate, up = (x_e @ w_in[e].T).chunk(2, dim=-1)
        hidden.append((F.silu(gate) * up) @ w_out[e])
    return torch.zeros_like(x).index_add_(0, tokens, torch.cat(hidden) * gates.flatten()[order, None])


def dense_experts(moe: MoE, x: torch.Tensor, chosen: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    E, d_e = moe.n_experts, moe.expert_d_ff
    weights = torch.zeros(x.shape[0], E, dtype=x.dtype, device=x.device).scatter(1, chosen, gates)  # 0: unchosen
    gate, up = torch.matmul(x, moe.experts_in.weight.view(E, 2 * d_e, -1).transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(F.silu(gate) * up, moe.experts_out.weight.view(E, d_e, -1))  # [E, N, d]
    return torch.einsum("end,ne->nd", y, weights)


DISPATCHES = {"loop": loop_experts, "grouped_mm": MoE.experts, "dense": dense_experts}  # model/moe.py's on a CPU


def timed(run, repeats: int) -> dict:
    """Every dispatch once per round, the order alternating (A B C, C B A, ...), after one untimed round."""
    names, seconds = list(run), {name: [] for name in run}
    for round_ in range(repeats + 1):
        for name in names if round_ % 2 else names[::-1]:
            start = time.perf_counter()
            run[name]()
            if round_:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16 * 128, help="tokens a step (the ablation's 16 x 128)")
    parser.add_argument("overrides", nargs="*", default=["+experiment=ablation", "ffn=moe"])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = Transformer(model_config(compose_config(args.overrides))).train()
    moe = next(iter(model.moe_layers().values()))
    x = torch.randn(args.tokens, model.cfg.d_model)
    grad = torch.randn_like(x)
    with torch.no_grad():
        chosen, gates, *_ = moe.route(x)
    loads = chosen.flatten().bincount(minlength=moe.n_experts).tolist()
    print(f"{torch.get_num_threads()} threads | d {model.cfg.d_model}, {moe.n_experts} experts of {moe.expert_d_ff}, "
          f"{moe.k} per token | {args.tokens} tokens, loads {loads}")
    reference = loop_experts(moe, x, chosen, gates)
    for name, dispatch in DISPATCHES.items():
        got = dispatch(moe, x, chosen, gates)
        # float32, sums in other orders: the outputs' scale is ~1, so a few float32 steps of it
        assert (got - reference).abs().max() <= 1e-4 * reference.abs().max(), name

    def step(dispatch):
        def run():
            inputs = x.clone().requires_grad_()
            dispatch(moe, inputs, chosen, gates).backward(grad)
            moe.zero_grad(set_to_none=True)
        return run

    seconds = timed({name: step(dispatch) for name, dispatch in DISPATCHES.items()}, args.repeats)
    base = statistics.median(seconds["loop"])
    print(f"\nforward + backward of the experts, ms (median, min - max of {args.repeats}), and loop's over each:")
    for name, times in seconds.items():
        ms = [1e3 * t for t in times]
        print(f"  {name:<11} {statistics.median(ms):7.2f}  {min(ms):7.2f} - {max(ms):7.2f}   "
              f"{base / statistics.median(times):.3f}x")

    def block():
        inputs = x.clone().requires_grad_()
        moe(inputs).backward(grad)
        moe.zero_grad(set_to_none=True)

    for _ in range(3):
        block()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.repeats):
            block()
    parts = dict.fromkeys(("matmuls", "SwiGLU and gates, element-wise", "routing", "dispatch and the rest"), 0.0)
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / args.repeats / 1e3
        part = ("matmuls" if event.key in MATMULS else "SwiGLU and gates, element-wise" if event.key in ELEMENTWISE
                else "routing" if event.key in ROUTING else "dispatch and the rest")
        parts[part] += ms
    total = sum(parts.values())
    print(f"\nthe block, forward + backward: {total:.2f} ms of CPU time (torch.profiler, self time by op)")
    for part, ms in parts.items():
        print(f"  {part:<38} {ms:7.2f}  {ms / total:6.1%}")
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
    print("  largest ops: " + ", ".join(f"{e.key} {e.self_cpu_time_total / args.repeats / 1e3:.2f}" for e in ops))

    moe_keys = tuple(f"model.{key}=" for key in MOE_SETTINGS)
    dense_overrides = [o for o in args.overrides if not o.startswith(("ffn=", *moe_keys))]
    device = Device("cpu")
    peers = {"dense": our_peer(compose_config(dense_overrides), device),
             "moe": our_peer(compose_config(args.overrides), device)}
    seconds, _, _ = timed_alternately("training steps", {name: lambda p=p: p.step(device)
                                                               for name, p in peers.items()}, args.repeats, device)
    rows = speed_rows(seconds, tokens_per_step(peers), "dense")
    print(f"\nthe training step ({' '.join(dense_overrides)}; moe: {' '.join(args.overrides)}), tokens/s:")
    for name, row in rows.items():
        low, high = row["tokens_per_s_range"]
        print(f"  {name:<6} {row['tokens_per_s']:9,.0f}  {low:,.0f} - {high:,.0f}   vs dense {row['vs_baseline']:.3f}x"
              f"   {peers[name].counted.num_params():,} parameters, {peers[name].counted.active_params():,} active")


if __name__ == "__main__":
    main()
