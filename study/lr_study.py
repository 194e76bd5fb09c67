"""sweep.py's learning-rate study: its points, its stages (grid, edges, seeds) and each line's best learning rate."""
import math
import time
from dataclasses import dataclass
from pathlib import Path

from storage.files import write_json
from study.launch import check_overrides, finished, launch, study_dir
from study.lr import lr_line
from study.runs import Variant, load_run


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

    @property
    def name(self) -> str:
        """Its run dir under the study's."""
        return f"{self.line}/lr{self.lr:.4g}/seed{self.seed}"

    def settings(self) -> dict:
        """What the point sets itself, as key: value (its config, OUT/.plan/point/<name>.yaml)."""
        settings = {"train.lr": float(f"{self.lr:.6g}"), "train.min_lr": float(f"{self.lr / 10:.6g}"),
                    "train.seed": self.seed, "wandb.group": "lr_sweep",
                    "wandb.name": f"lr_sweep-{self.line}-lr{self.lr:.4g}-seed{self.seed}"}
        if not self.warmup:
            settings |= {"train.warmup_fraction": 0, "variant": self.line}
        return settings


def best_lrs(out: Path, lines: dict[str, Point], planned: dict[str, list[float]]) -> dict[str, float | None]:
    """Each line's best lr among the learning rates planned for it, by compare.py's rule (None where no run
    completed): runs in OUT at other rates (an earlier, wider study's) are not this study's. A diverged run is
    never the best, so the loss at initialisation it would count at does not matter here."""
    best = {}
    for line, point in lines.items():
        dirs = [out / Point(point.variant, lr, warmup=point.warmup).name for lr in planned[line]]
        runs = [load_run(d) for d in dirs if finished(d)]
        best[line] = lr_line(Variant(line, runs), init=math.inf, grid=[]).best_lr
    return best


def run_study(out: Path, variants: list[str], probe: list[str], lrs: list[float], n_seeds: int, widen: int,
              overrides: list[str], experiment: str = "ablation") -> None:
    started, done = time.perf_counter(), []
    grid = [Point(v, lr, warmup=w) for w in (True, False) for v in (variants if w else probe)
            for lr in lrs]
    check_overrides(overrides, grid, experiment)
    print(f"study in {out}: {len(variants)} variants x {len(lrs)} learning rates ({lrs[0]:g} .. {lrs[-1]:g})",
          flush=True)
    with study_dir(out):
        launch(grid, out, overrides, "grid", done, experiment)
        lines = {p.line: p for p in grid}  # one Point per line: its variant and warm-up
        # each line's learning rates: the grid, then a point beyond an edge that was best, up to `widen` a side;
        # planned from the results alone, so that the same command always gives the same study
        planned = {line: list(lrs) for line in lines}
        low_ratio, high_ratio = lrs[0] / lrs[1], lrs[-1] / lrs[-2]
        for edge in range(widen):
            best = best_lrs(out, lines, planned)
            extra = [Point(p.variant, lr, warmup=p.warmup) for line, p in lines.items() if best[line] is not None
                     for lr in ([planned[line][0] * low_ratio] if math.isclose(best[line], planned[line][0]) else [])
                     + ([planned[line][-1] * high_ratio] if math.isclose(best[line], planned[line][-1]) else [])]
            if not extra:
                break
            for point in extra:
                planned[point.line] = sorted([*planned[point.line], point.lr])
            launch(extra, out, overrides, f"edges{edge + 1}", done, experiment)

        best = best_lrs(out, lines, planned)
        seeds = [Point(p.variant, best[line], seed) for line, p in lines.items() if p.warmup and best[line]
                 for seed in range(1, n_seeds)]
        launch(seeds, out, overrides, "seeds", done, experiment)
        write_json(out / "best_lr.json", best)

    print(f"\n{len(done)} runs in {(time.perf_counter() - started) / 60:.1f} min. Best learning rates:")
    for line, lr in best.items():
        print(f"  {line}: {lr:g}" if lr else f"  {line}: no run completed")
    print(f"\npython compare.py {out} --lr-plot docs/ablation_lr.png --plot docs/ablation.png")
