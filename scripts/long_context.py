"""The study of docs/long_context.md: past the trained context, what each position encoding and RoPE scaling does.

    python scripts/long_context.py --out /work/runs/long_context --json docs/long_context.json \
        -- hydra/launcher=joblib hydra.launcher.n_jobs=2 train.threads=1

1. pretrain: the ablation's position lines (baseline = RoPE, sinusoidal2017, nope, learned), each at its recorded
   best lr (configs/ablation/), at context L0 = 64: 300 steps of 32 x 64 tokens, the ablation's token budget;
2. finetune: RoPE's checkpoints go on at 4 L0 = 256 from their weights (train.init_from), 60 steps of 8 x 256
   tokens at lr 4e-4 (the pretraining's floor), under Position Interpolation (linear x4), YaRN (x4) or none;
3. evaluate (evaluate.py's functions, in this process): every checkpoint at 64, 128, 256 and 512 tokens (1x-8x),
   chunked and sliding (stride L / 2), on the val split's first 32,768 tokens; RoPE's pretrained checkpoints also
   under linear, NTK-aware and YaRN with s = L / L0 at each length, and dynamic NTK with s = 2, untrained for it.
Seeds 0, 1, 2 throughout. Each stage is one Hydra multirun (sweep.launch: every job its own dir, a failed job fails
the stage); everything after -- goes to it. The same command resumes: finished runs and evaluations are kept.
"""
import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import evaluate  # noqa: E402  (after the path: run as a script from anywhere)
from insight.figures import png  # noqa: E402
from storage.files import write_bytes, write_json  # noqa: E402
from sweep import launch, run_main, study_dir  # noqa: E402

L0 = 64
LENGTHS = (64, 128, 256, 512)
LINES = ("baseline", "sinusoidal2017", "nope", "learned")
FINETUNES = {"pi": ("linear", 4.0), "yarn": ("yarn", 4.0), "plain": ("none", 1.0)}
UNTRAINED = ("linear", "ntk", "yarn", "dynamic")  # RoPE scalings read by the pretrained weights
SEEDS = (0, 1, 2)
MAX_TOKENS = 32768


@dataclass(frozen=True)
class Run:
    """A training run of the study: a point of sweep.launch (its variant, name and settings)."""
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
        for line in LINES:
            jobs.append((line, seed, out / pretrain_run(line, seed).name, ["--lengths", ",".join(map(str, LENGTHS))]))
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


def evaluate_all(out: Path) -> list[dict]:
    """Every evaluation's JSON (kept from an earlier call where it exists), one row per length and mode."""
    rows = []
    for row, seed, ckpt, flags in evaluations(out):
        file = out / "eval" / f"{row}-seed{seed}-{'-'.join(flags[1::2][:2])}.json"
        if not file.exists():
            file.parent.mkdir(exist_ok=True)
            if evaluate.main(["--ckpt", str(ckpt), *flags, "--max-tokens", str(MAX_TOKENS), "--json", str(file),
                              "--plot", str(file.with_suffix(".png"))]):
                raise SystemExit(f"evaluate.py failed on {ckpt}")
        result = json.loads(file.read_text())
        rows += [{"row": row, "seed": seed, "rope_factor": result["rope_factor"], **r} for r in result["results"]]
    return rows


def table(rows: list[dict]) -> list[dict]:
    """Mean and sample std over seeds of each (row, length, mode)."""
    cells = {}
    for r in rows:
        cells.setdefault((r["row"], r["length"], r["mode"]), []).append(r["val_bpb"])
    return [{"row": row, "length": length, "mode": mode, "seeds": len(v), "mean": statistics.mean(v),
             "std": statistics.stdev(v) if len(v) > 1 else 0.0} for (row, length, mode), v in cells.items()]


def figure(rows: list[dict]):
    """Left: val bpb against the window's length (chunked solid, sliding dashed), each row a colour, mean of seeds.
    Right: chunked bpb against position at 8 L0 (seed 0), where the early-token curse and the cliff past L0 show."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(13, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    names = list(dict.fromkeys(r["row"] for r in rows))
    for i, name in enumerate(names):
        for mode, style in (("chunked", "-"), ("sliding", "--")):
            cells = sorted((c["length"], c["mean"]) for c in table(rows) if c["row"] == name and c["mode"] == mode)
            left.plot(*zip(*cells), style, marker=".", color=f"C{i % 10}", label=name if mode == "chunked" else None)
        longest = [r for r in rows if r["row"] == name and r["seed"] == 0 and r["mode"] == "chunked"
                   and r["length"] == LENGTHS[-1]]
        for r in longest:
            right.plot([(b["start"] + b["end"]) / 2 for b in r["buckets"]], [b["val_bpb"] for b in r["buckets"]],
                       color=f"C{i % 10}", label=name)
    left.set(xscale="log", yscale="log", xlabel="window length (tokens; trained at 64)",
             ylabel="val bpb (mean of 3 seeds)", title="chunked (solid) and sliding, stride L/2 (dashed)")
    left.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
    right.axvline(L0, color="grey", linestyle=":")
    right.set(xscale="log", yscale="log", xlabel="position in a 512-token window", ylabel="val bpb",
              title="chunked at 8x, by position (seed 0)")
    left.legend(fontsize=7, ncols=2)
    return fig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
            rows = evaluate_all(out)
        cells = table(rows)
        print("| row | length | chunked | sliding |\n|---|---:|---:|---:|")
        for row, length in dict.fromkeys((c["row"], c["length"]) for c in cells):
            by_mode = {c["mode"]: c for c in cells if (c["row"], c["length"]) == (row, length)}
            print(f"| {row} | {length} | " + " | ".join(
                f"{by_mode[m]['mean']:.4f} ± {by_mode[m]['std']:.4f}" if m in by_mode else "" for m in
                ("chunked", "sliding")) + " |")
        if args.json:
            write_json(args.json, {"L0": L0, "lengths": LENGTHS, "max_tokens": MAX_TOKENS, "table": cells,
                                   "rows": rows})
            write_bytes(args.json.with_suffix(".png"), png(figure(rows)))

    run_main(study)


if __name__ == "__main__":
    main()
