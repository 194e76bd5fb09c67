"""The full bench's report: the training table with MFU, the ratios against their targets, the decode curves."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from benchmarks.sizes import Sizes
from benchmarks.timing import speed_table
from storage.files import atomic_write


# CPU fp32: llama_tiny's training tokens/s against this repo's GPT-2 configuration (eager, and train.compile=true)
# and transformers' LLaMA; the default decode (what generate.py runs) against transformers' and the limit
# that streaming every weight once per token sets
TARGETS = {"train_vs_gpt2": 1.0, "train_vs_hf_llama": 1.2, "compiled_train_vs_gpt2": 1.15, "decode_ratio": 3.0,
           "decode_vs_limit": 0.4, "cache_vs_nocache": 5.0}


def training_table(r: dict, settings: DictConfig, sizes: Sizes) -> str:
    header = (f"Training, {settings.train.batch_size} x {settings.model.context_length} tokens a step (fwd + bwd + "
              f"AdamW). MFU = FLOPs per token x tokens/s / peak, FLOPs per token = the model's flops_per_token "
              f"(what runs, x3 for the backward) for every row, peak {r['peak_gflops']:.0f} GFLOP/s (the best {sizes.peak_n}^3 matmul)")
    return header + "\n\n" + speed_table(r["training"], "model", "llama_tiny", {
        "MFLOP/token": lambda row: f"{row['flops_per_token'] / 1e6:.1f}", "MFU": lambda row: f"{row['mfu']:.1%}"})


def table(r: dict, sizes: Sizes) -> str:
    b = sizes.decode_batches[1]
    rows = [  # name, value, the key of its target
        ("training: llama_tiny / GPT-2 configuration, eager", r["train_vs_gpt2"], "train_vs_gpt2"),
        ("training: llama_tiny / transformers LlamaForCausalLM", r["train_vs_hf_llama"], "train_vs_hf_llama"),
        (f"training: llama_tiny train.compile=true (compiled in {r.get('compiled_train_compile_s', 0):.0f} s) / "
         f"GPT-2 configuration eager", r.get("compiled_train_vs_gpt2"), "compiled_train_vs_gpt2"),
        (f"decode, batch 1, {sizes.new_tokens} new: {r['decode_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r['hf_decode_tokens_per_s']:,.0f}", r["decode_ratio"], "decode_ratio"),
        (f"decode, batch 1: / the weight-streaming limit {r['streaming_limit_tokens_per_s']:,.0f} tokens/s "
         f"({r['weight_bytes'] / 1e6:.1f} MB at {r['memory_bandwidth_gb_per_s']:.1f} GB/s)", r["decode_vs_limit"],
         "decode_vs_limit"),
        (f"decode, batch 1, torch.compile (compiled in {r.get('compiled_decode_compile_s', 0):.0f} s): "
         f"{r.get('compiled_decode_tokens_per_s', 0):,.0f} tokens/s / transformers", r.get("compiled_decode_ratio"),
         None),
        (f"decode, batch {b}: {r[f'decode_b{b}_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r[f'hf_decode_b{b}_tokens_per_s']:,.0f}", r[f"decode_b{b}_ratio"], None),
        (f"decode, batch {b}, torch.compile (compiled in {r.get(f'compiled_decode_b{b}_compile_s', 0):.0f} s) / "
         f"transformers", r.get(f"compiled_decode_b{b}_ratio"), None),
        (f"decode, batch 1: KV cache / no cache ({r['nocache_decode_tokens_per_s']:,.0f} tokens/s)",
         r["cache_vs_nocache"], "cache_vs_nocache"),
        (f"prefill, {sizes.prefill_tokens}-token prompt: {r['prefill_tokens_per_s']:,.0f} tokens/s / transformers "
         f"{r['hf_prefill_tokens_per_s']:,.0f}", r["prefill_ratio"], None),
    ]

    def target(key):
        if key is None:
            return ""
        goal = f"{TARGETS[key]:.0%}" if key == "decode_vs_limit" else f"{TARGETS[key]:.2f}x"
        return f"≥ {goal}: {'met' if r['targets_met'][key] else 'NOT met'}"
    lines = ["| measure | ratio | target |", "|---|---:|---|"]
    lines += [f"| {name} | {value:.0%} | {target(key)} |" if key == "decode_vs_limit" else
              f"| {name} | {value:.3f}x | {target(key)} |" for name, value, key in rows
              if value is not None]  # --no-compile: no compiled rows
    return "\n".join(lines)


def plot(curves: dict, path: Path, window: int = 32):
    """tokens/s over each window of `window` new tokens, at batch 1."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, times in curves.items():
        ends = range(window, len(times) + 1, window)
        ax.plot(list(ends), [window / (times[end - 1] - (times[end - window - 1] if end > window else 0))
                             for end in ends], label=label, marker=".")
    ax.set(xlabel="generated tokens", ylabel=f"tokens/s (batch 1, over {window}-token windows)", yscale="log",
           title="Greedy decode speed against generated length")
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png"))
