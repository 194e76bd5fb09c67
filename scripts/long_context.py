"""The study of docs/long_context.md: past the trained context, what each position encoding and RoPE scaling does.

    python scripts/long_context.py --out /work/runs/long_context --json docs/long_context.json \
        -- hydra/launcher=joblib hydra.launcher.n_jobs=2 train.threads=1

1. pretrain: the ablation's position lines (baseline = RoPE, sinusoidal2017, nope, learned), each at its recorded
   best lr (configs/ablation/), at context L0 = 64: 300 steps of 32 x 64 tokens, the ablation's token budget;
2. finetune: RoPE's checkpoints go on at 4 L0 = 256 from their weights (train.init_from), 60 steps of 8 x 256
   tokens at lr 4e-4 (the pretraining's floor), under Position Interpolation (linear x4), YaRN (x4) or none;
3. evaluate (evaluate.py, a process for each): every checkpoint at 64, 128, 256 and 512 tokens (1x-8x; learned at 64 only),
   chunked and sliding (stride L / 2), on the val split's first 32,768 tokens; RoPE's pretrained checkpoints also
   under linear, NTK-aware and YaRN with s = L / L0 at each length, and dynamic NTK with s = 2, untrained for it.
Seeds 0, 1, 2 throughout. Each stage is one Hydra multirun (study/launch.py: every job its own dir, a failed job fails
the stage); everything after -- goes to it. The same command resumes: finished runs and evaluations are kept.
"""
import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli import ascii_numbers  # noqa: E402
from insight.figures import png  # noqa: E402  (after the path: run as a script from anywhere)
from storage.files import write_bytes, write_json  # noqa: E402
from study.launch import launch, run_main, study_dir  # noqa: E402
from study.lengths import MAX_TOKENS, SEEDS, evaluate_all, table  # noqa: E402

L0 = 64
LENGTHS = (64, 128, 256, 512)
LINES = ("baseline", "sinusoidal2017", "nope", "learned")
FINETUNES = {"pi": ("linear", 4.0), "yarn": ("yarn", 4.0), "plain": ("none", 1.0)}
UNTRAINED = ("linear", "ntk", "yarn", "dynamic")  # RoPE scalings read by the pretrained weights


@dataclass(frozen=True)
class Run:
    """A training run of the study: a point of study.launch.launch (its variant, name and settings)."""
    variant: str
    name: str
    own: tuple = field(default=())

    def settings(self) -> dict:
        return dict(self.own) | {"wandb.group": "long_context", "wandb.name": "long_context-" + self.name.replace("/", "-")}


def pretrain_run(line: str, seed: int) -> Run:
    return Run(line, f"pretrain/{line}/seed{seed}", (("model.context_length", L0), ("train.batch_size", 32),
                                                     ("train.micro_batch_size", 32), ("train.seed", seed)))


def finetune_run(out: Path, method: str, seed: int) -> Run:
    scaling, factor = FINETUNES[method]
    source = out / pretrain_run("baseline", seed).name
    return Run("baseline", f"finetune/{method}/seed{seed}", (
        ("train.init_from", str(source)), ("model.context_length", 4 * L0), ("model.rope_scaling", scaling),
        ("model.rope_factor", factor), ("train.max_steps", 60), ("train.batch_size", 8),
        ("train.micro_batch_size", 8), ("train.lr", 4e-4), ("train.min_lr", 4e-5), ("train.eval_interval", 20),
        ("train.seed", seed)))


def evaluations(out: Path) -> list[tuple[str, int, Path, list[str]]]:
    """(row name, seed, checkpoint, evaluate.py's flags) of every evaluation."""
    jobs = []
    for seed in SEEDS:
        for line in LINES:  # a learned table has no position past L0 (evaluate.py refuses one)
            lengths = LENGTHS[:1] if line == "learned" else LENGTHS
            jobs.append((line, seed, out / pretrain_run(line, seed).name, ["--lengths", ",".join(map(str, lengths))]))
        rope = out / pretrain_run("baseline", seed).name
        for scaling in UNTRAINED:
            for length in LENGTHS[1:]:
                factor = 2.0 if scaling == "dynamic" else length / L0
                jobs.append((f"baseline+{scaling}", seed, rope, ["--lengths", str(length), "--rope-scaling", scaling,
                                                                  "--rope-factor", str(factor)]))
        for method in FINETUNES:
            jobs.append((f"finetune-{method}", seed, out / finetune_run(out, method, seed).name,
                         ["--lengths", ",".join(map(str, LENGTHS))]))
    return jobs


def degradation(rows: list[dict]) -> list[dict]:
    """Each row's val bpb at L less its checkpoint's at L0, per seed, then mean and sample std over seeds: what going
    past the trained context costs, paired within a checkpoint (the seeds' spread at L0 cancels). The scalings read
    the pretrained RoPE checkpoints, so their L0 is the baseline's; a fine-tuned model's is its own."""
    at_l0 = {(r["row"], r["seed"], r["mode"]): r["val_bpb"] for r in rows if r["length"] == L0}
    cells = {}
    for r in rows:
        own = (r["row"] if (r["row"], r["seed"], r["mode"]) in at_l0 else "baseline", r["seed"], r["mode"])
        cells.setdefault((r["row"], r["length"], r["mode"]), []).append(r["val_bpb"] - at_l0[own])
    return [{"row": row, "length": length, "mode": mode, "mean": statistics.mean(v), "std": statistics.stdev(v)}
            for (row, length, mode), v in cells.items() if length != L0]


def by_position(rows: list[dict], row: str, width: int = L0) -> tuple[list[float], list[float]]:
    """Chunked bpb at 8 L0 by position, in buckets of `width` positions (the buckets' token-weighted mean), averaged
    over seeds: (bucket centres, bpb)."""
    runs = [r for r in rows if r["row"] == row and r["mode"] == "chunked" and r["length"] == LENGTHS[-1]]
    centres, values = [], []
    for start in range(0, LENGTHS[-1], width):
        per_seed = []
        for r in runs:
            inside = [b for b in r["buckets"] if start <= b["start"] < start + width]
            per_seed.append(sum(b["val_bpb"] * b["tokens"] for b in inside) / sum(b["tokens"] for b in inside))
        centres.append(start + width / 2)
        values.append(statistics.mean(per_seed))
    return centres, values


def figure(rows: list[dict]):
    """Left and middle: what each row loses past L0, chunked and sliding (degradation(), mean of 3 seeds with their
    std). Right: chunked bpb by position inside 8 L0 windows, where the loss rises past L0."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    costs = degradation(rows)
    names = [n for n in dict.fromkeys(r["row"] for r in rows) if any(c["row"] == n for c in costs)]
    colours = {name: f"C{i}" if i < 10 else "black" for i, name in enumerate(names)}
    styles = {name: "--" if name.startswith("finetune") else ":" if "+" in name else "-" for name in names}
    for ax, mode in zip(axes, ("chunked", "sliding")):
        for name in names:
            cells = sorted((c["length"], c["mean"], c["std"]) for c in costs if c["row"] == name and c["mode"] == mode)
            lengths, means, stds = zip(*([(L0, 0.0, 0.0)] + cells))
            ax.errorbar(lengths, means, yerr=stds, linestyle=styles[name], marker=".", capsize=2,
                        color=colours[name], label=name)
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set(xscale="log", xlabel="window length (tokens; trained at 64)",
               title=f"{mode}{', stride L/2' if mode == 'sliding' else ''}: bpb at L − bpb at 64")
        ax.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
        ax.minorticks_off()
    axes[0].set_ylabel("val bpb lost past the trained context (3 seeds)")
    axes[0].legend(fontsize=7, ncols=2)
    for name in ("baseline", "sinusoidal2017", "nope", "baseline+ntk", "baseline+yarn", "finetune-pi",
                 "finetune-yarn", "finetune-plain"):
        axes[2].plot(*by_position(rows, name), linestyle=styles[name], marker=".", color=colours[name], label=name)
    axes[2].axvline(L0, color="grey", linestyle=":")
    axes[2].set(xlabel="position in a 512-token window (64-token buckets)", ylabel="val bpb (mean of 3 seeds)",
                title="chunked at 8x, by position")
    axes[2].legend(fontsize=7)
    return fig


def main(argv=None) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--json", type=Path, help="the table and every evaluation's rows")
    parser.add_argument("overrides", nargs="*", help="after --: the multiruns' launcher and its settings")
    args = parser.parse_args(argv)
    out = args.out.resolve()

    def study():
        with study_dir(out):
            done = []
            launch([pretrain_run(line, seed) for line in LINES for seed in SEEDS], out, args.overrides,
                   "pretrain", done)
            launch([finetune_run(out, method, seed) for method in FINETUNES for seed in SEEDS], out,
                   args.overrides, "finetune", done)
            rows = evaluate_all(out, out / "eval", evaluations(out))
        cells = table(rows)
        print("| row | length | chunked | sliding |\n|---|---:|---:|---:|")
        for row, length in dict.fromkeys((c["row"], c["length"]) for c in cells):
            by_mode = {c["mode"]: c for c in cells if (c["row"], c["length"]) == (row, length)}
            print(f"| {row} | {length} | " + " | ".join(
                f"{by_mode[m]['mean']:.4f} ± {by_mode[m]['std']:.4f}" if m in by_mode else "" for m in
                ("chunked", "sliding")) + " |")
        print("\nbpb at L less bpb at L0, paired within a checkpoint\n| row | length | chunked | sliding |\n"
              "|---|---:|---:|---:|")
        costs = degradation(rows)
        for row, length in dict.fromkeys((c["row"], c["length"]) for c in costs):
            by_mode = {c["mode"]: c for c in costs if (c["row"], c["length"]) == (row, length)}
            print(f"| {row} | {length} | " + " | ".join(f"{by_mode[m]['mean']:+.4f} ± {by_mode[m]['std']:.4f}"
                                                      for m in ("chunked", "sliding")) + " |")
        if args.json:
            write_json(args.json, {"L0": L0, "lengths": LENGTHS, "max_tokens": MAX_TOKENS, "table": cells,
                                   "degradation": costs, "rows": rows})
            write_bytes(args.json.with_suffix(".png"), png(figure(rows)))

    run_main(study)


if __name__ == "__main__":
    main()
