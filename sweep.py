"""The ablation as a learning-rate study: every variant over a log-spaced grid of peak learning rates,
then three seeds at each variant's own best one, and the warm-up probe on the same grid, the way
Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities")
compare interventions: by final loss against learning rate, not at one shared learning rate.

    python sweep.py                                   # the whole study, into multirun/lr_sweep
    python compare.py multirun/lr_sweep --lr-plot docs/ablation_lr.png --plot docs/ablation.png

Every run is `python train.py +experiment=ablation ablation=<variant> train.lr=<lr> train.min_lr=<lr/10>
train.seed=<seed>` (min_lr keeps the baseline schedule's ratio of 10) in OUT/<variant>/lr<lr>/seed<seed>/,
with its output in train.log there. Stages:
  1. grid    each variant at each --lrs, seed 0; the --probe variants also with train.warmup_fraction=0,
             as `<variant>-nowarmup`
  2. edges   a line whose best lr is the grid's lowest or highest gets the next point beyond it, in the
             grid's own ratio, up to --widen more points per side
  3. seeds   each variant at its best lr, seeds 1 .. --seeds - 1 (the no-warm-up lines keep seed 0)
A line's best lr: the lowest final val bpb among its seed-0 runs that completed (a diverged run has none).
A run whose summary.json records how it ended (completed, or diverged) is kept, so the same command
resumes a study that was stopped: a run dir without one is deleted and run again.

--jobs runs that many trainings at once, each with cores / jobs torch threads; extra Hydra overrides after
`--` go to every run before its own (e.g. `-- model.n_layers=2` for a smaller study; a run's lr, seed and
warm-up are the study's).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import compare
from errors import UsageError
from storage.files import write_json

ROOT = Path(__file__).resolve().parent
VARIANTS = ("baseline", "layernorm", "postnorm", "sinusoidal", "mha", "relu", "transformer2017",
            "learned", "nope", "sinusoidal2017", "postnorm2017")
PROBE = ("baseline", "postnorm")  # Pre-Norm and Post-Norm, with and without warm-up (Xiong et al. 2020)
GRID = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # x2 steps, 64x in all


@dataclass(frozen=True)
class Point:
    variant: str  # a configs/ablation/ name
    lr: float
    seed: int = 0
    warmup: bool = True

    @property
    def line(self) -> str:
        """The name compare.py shows: the variant, or `<variant>-nowarmup`."""
        return self.variant if self.warmup else f"{self.variant}-nowarmup"

    def run_dir(self, out: Path) -> Path:
        return out / self.line / f"lr{self.lr:.4g}" / f"seed{self.seed}"

    def overrides(self, out: Path) -> list[str]:
        overrides = ["+experiment=ablation", f"ablation={self.variant}", f"train.lr={self.lr:.6g}",
                     f"train.min_lr={self.lr / 10:.6g}", f"train.seed={self.seed}",
                     f"hydra.run.dir={self.run_dir(out)}", "wandb.group=lr_sweep",
                     f"wandb.name=lr_sweep-{self.line}-lr{self.lr:.4g}-seed{self.seed}"]
        if not self.warmup:
            overrides += ["train.warmup_fraction=0", f"variant={self.line}"]
        return overrides


def finished(run_dir: Path) -> dict | None:
    """The summary of a run that ended by itself (completed or diverged), else None."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    reason = summary.get("stop_reason", "")
    return summary if reason == "completed" or reason.startswith("diverged") else None


def train(point: Point, out: Path, extra: list[str], threads: int) -> tuple[Point, dict, float]:
    run_dir = point.run_dir(out)
    summary = finished(run_dir)
    if summary is not None:
        return point, summary, 0.0
    shutil.rmtree(run_dir, ignore_errors=True)  # a run that was killed: start it again from scratch
    run_dir.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    with open(run_dir / "train.log", "w") as log:
        code = subprocess.run([sys.executable, str(ROOT / "train.py"), *extra, *point.overrides(out)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    summary = finished(run_dir)
    if summary is None:  # a bad setting (exit 2) or a signal: nothing else in the study would fare better
        last = (run_dir / "train.log").read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RunFailed(f"{point.line} lr {point.lr:g} seed {point.seed} ended with exit code {code}: "
                        f"{last[0]} (log: {run_dir / 'train.log'})")
    return point, summary, time.perf_counter() - start


class RunFailed(UsageError):
    """A run that ended without a result of its own (completed or diverged): a bad setting, mostly."""


def run_all(points: list[Point], out: Path, extra: list[str], jobs: int, threads: int, done: list) -> None:
    """Trains the points, `jobs` at a time, in order; after a failure no new run starts."""
    queue = list(reversed(points))
    with ThreadPoolExecutor(jobs) as pool:
        running = set()
        while queue or running:
            while queue and len(running) < jobs:
                running.add(pool.submit(train, queue.pop(), out, extra, threads))
            ended, running = wait(running, return_when=FIRST_COMPLETED)
            for future in ended:
                point, summary, seconds = future.result()  # RunFailed goes up once the running ones end
                done.append(point)
                result = f"val bpb {summary['val_bpb']:.4f}" if "val_bpb" in summary else summary["stop_reason"]
                took = f"{seconds:.0f} s" if seconds else "kept from an earlier run"
                print(f"[{len(done)}] {point.line} lr {point.lr:g} seed {point.seed}: {result} ({took})", flush=True)


def best_lrs(out: Path, lines: list[str]) -> dict[str, float | None]:
    """Each line's best lr in OUT, by compare.py's rule (None where no run completed). A diverged run is
    never the best, so the loss at initialisation it would count at does not matter here."""
    best = {}
    for line in lines:
        runs = [compare.load_run(d) for d in compare.find_run_dirs(out / line)] if (out / line).is_dir() else []
        best[line] = compare.lr_line(compare.Variant(line, runs), init=math.inf, grid=[]).best_lr
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, default=Path("multirun/lr_sweep"), help="the study's dir")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--probe", nargs="*", default=list(PROBE), choices=VARIANTS,
                        help="variants also trained without warm-up over the grid")
    parser.add_argument("--lrs", type=float, nargs="+", default=list(GRID), help="the grid, ascending")
    parser.add_argument("--seeds", type=int, default=3, help="seeds at each variant's best lr")
    parser.add_argument("--widen", type=int, default=2, help="extra grid points allowed beyond each edge")
    parser.add_argument("--jobs", type=int, default=2, help="trainings at once")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, after --")
    args = parser.parse_args(argv)
    lrs = sorted(args.lrs)
    if len(lrs) < 2 or lrs[0] <= 0 or len(set(lrs)) < len(lrs):
        parser.error(f"--lrs {' '.join(map(str, args.lrs))}: at least two distinct positive learning rates")
    if args.seeds < 1 or args.jobs < 1 or args.widen < 0:
        parser.error(f"--seeds {args.seeds} and --jobs {args.jobs} must be >= 1, --widen {args.widen} >= 0")
    try:
        run_study(args.out, args.variants, args.probe, lrs, args.seeds, args.widen, args.jobs, args.overrides)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def run_study(out: Path, variants: list[str], probe: list[str], lrs: list[float], n_seeds: int, widen: int,
              jobs: int, overrides: list[str]) -> None:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    started, done = time.perf_counter(), []
    print(f"study in {out}: {len(variants)} variants x {len(lrs)} learning rates "
          f"({lrs[0]:g} .. {lrs[-1]:g}), {jobs} jobs x {threads} threads", flush=True)
    grid = [Point(v, lr, warmup=w) for w in (True, False) for v in (variants if w else probe)
            for lr in lrs]
    run_all(grid, out, overrides, jobs, threads, done)
    lines = {p.line: p for p in grid}  # one Point per line: its variant and warm-up
    low_ratio, high_ratio = lrs[0] / lrs[1], lrs[-1] / lrs[-2]
    for _ in range(widen):
        best = best_lrs(out, list(lines))
        tried = {line: sorted(float(d.name[2:]) for d in (out / line).glob("lr*")) for line in lines}
        extra = [Point(p.variant, lr, warmup=p.warmup) for line, p in lines.items() if best[line] is not None
                 for lr in ([best[line] * low_ratio] if best[line] <= tried[line][0] else [])
                 + ([best[line] * high_ratio] if best[line] >= tried[line][-1] else [])]
        if not extra:
            break
        run_all(extra, out, overrides, jobs, threads, done)

    best = best_lrs(out, list(lines))
    seeds = [Point(p.variant, best[line], seed) for line, p in lines.items() if p.warmup and best[line]
             for seed in range(1, n_seeds)]
    run_all(seeds, out, overrides, jobs, threads, done)

    print(f"\n{len(done)} runs in {(time.perf_counter() - started) / 60:.1f} min. Best learning rates:")
    for line, lr in best.items():
        print(f"  {line}: {lr:g}" if lr else f"  {line}: no run completed")
    write_json(out / "best_lr.json", best)
    print(f"\npython compare.py {out} --lr-plot docs/ablation_lr.png --plot docs/ablation.png")


if __name__ == "__main__":
    main()
