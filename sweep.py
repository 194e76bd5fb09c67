"""The ablation as a learning-rate study: every variant over a log-spaced grid of peak learning rates,
then three seeds at each variant's own best one, and the warm-up probe on the same grid, the way
Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training instabilities")
compare interventions: by final loss against learning rate, not at one shared learning rate.

    python sweep.py                                   # the whole study, into multirun/lr_sweep
    python compare.py multirun/lr_sweep --lr-plot docs/ablation_lr.png --plot docs/ablation.png

Every run is `python train.py +experiment=ablation ablation=<variant> train.lr=<lr> train.min_lr=<lr/10>
train.seed=<seed>` (min_lr keeps the baseline schedule's ratio of 10) in OUT/<variant>/lr<lr>/seed<seed>/.
sweep.py plans and a Hydra launcher runs: each stage is one multirun of the points it still misses
(launch()), so the overrides after `--` choose where the runs go:

    python sweep.py -- hydra/launcher=joblib hydra.launcher.n_jobs=2 train.threads=1   # 2 at a time, 1 core each
    python sweep.py -- hydra/launcher=submitit_slurm hydra.launcher.partition=gpu hydra.launcher.gpus_per_node=1

(the launchers: pip install -e ".[cluster]"; without one, Hydra's basic launcher runs the points one after
another in one process; docs/cluster.md). The overrides reach every run too (e.g. `-- model.n_layers=2` for
a smaller study); a run's lr, seed and warm-up are the study's, so overriding them is refused. Stages:
  1. grid    each variant at each --lrs, seed 0; the --probe variants also with train.warmup_fraction=0,
             as `<variant>-nowarmup`
  2. edges   a line whose best lr is its lowest or highest gets the next point beyond it, in the grid's own
             ratio, up to --widen more points per side, counted from the --lrs grid
  3. seeds   each variant at its best lr, seeds 1 .. --seeds - 1 (the no-warm-up lines keep seed 0)
A line's best lr: the lowest final val bpb among its seed-0 runs at the rates planned for it that completed
(a diverged run has none). The plan follows from the results alone, so the same command gives the same
study: a run whose summary.json records how it ended (completed, or diverged) is kept, and every other
point, in every stage, runs again; one stopped or killed resumes from its checkpoint (nothing is deleted).
So the same command resumes a study that was stopped (Ctrl-C, SIGTERM, a closed terminal, a cluster's
pre-empted jobs), and a finished one run again trains nothing. A stage with a run that ended without a
result (a bad setting, mostly) stops the study with one `error:` line that names those runs and how each
ended; while a multirun of an earlier call still runs in OUT, a call is one `error:` line.
"""
import argparse
import json
import math
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

import compare
from errors import UsageError
from settings import compose_config
from storage.files import write_json
from training.multirun import RECORDS, die_with_parent, how_it_ended
from training.run_lock import dir_lock

ROOT = Path(__file__).resolve().parent
VARIANTS = ("baseline", "layernorm", "postnorm", "sinusoidal", "mha", "relu", "transformer2017",
            "learned", "nope", "sinusoidal2017", "postnorm2017", "mqa", "qknorm", "relu2", "muon", "modern", "mla",
            "mla_small", "moe", "moe_sigmoid", "moe_shared", "dense_wide", "window", "window_3to1",
            "window_alternate", "window_sinks", "window_alternate_sinks", "sinks")
PROBE = ("baseline", "postnorm")  # Pre-Norm and Post-Norm, with and without warm-up (Xiong et al. 2020)
GRID = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # x2 steps, 64x in all
# Where a study's runs go: set by launch(), so the overrides after -- may not
PLACEMENT = ("ablation", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.searchpath")


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


def finished(run_dir: Path) -> dict | None:
    """The summary of a run that ended by itself (completed or diverged), else None."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    reason = summary.get("stop_reason", "")
    return summary if reason == "completed" or reason.startswith("diverged") else None


class RunFailed(UsageError):
    """Runs that ended without a result of their own (completed or diverged): a bad setting, mostly."""


class StudyStopped(Exception):
    """A signal (Ctrl-C, SIGTERM, SIGHUP) while the study ran: the runs in progress saved and stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def study_dir(out: Path):
    """The study's dir, this process's alone while the study runs (a second study there is one error line)."""
    with dir_lock(out / ".lock", f"--out {out} is in use by another study (pid {{pid}}); wait for it to end"):
        yield


def check_overrides(overrides: list[str], points: list) -> None:
    """The overrides after --, refused before anything is written: one that sets what the study's points set
    themselves (a point's config would lose to it), and any that cannot be composed (a mistyped key or value, an
    unknown launcher or one whose plugin is not installed)."""
    own = set(PLACEMENT).union(*(point.settings() for point in points))
    for override in overrides:
        key = override.split("=")[0].lstrip("+~")
        if key in own:
            raise UsageError(f"{override}: the study sets {key} for each run itself")
    compose_config(["+experiment=ablation", f"ablation={points[0].variant}", *overrides], return_hydra_config=True)


def launch(points: list, out: Path, overrides: list[str], stage: str, done: list) -> None:
    """Trains the points (each with a variant, a name and its settings) that have no result yet in OUT/<name>,
    as one Hydra multirun: python train.py -m +experiment=ablation <overrides> +point=<name>,<name>,...

    Each point is a config of the group `point`, written to OUT/.plan/point/<name>.yaml; the multirun's launcher
    (basic, joblib, submitit_slurm, ...: the overrides choose it) runs them, each in OUT/<name>. A point whose
    run was stopped or killed resumes from its checkpoint (a multirun's train.resume=auto), one that never saved
    one starts again; nothing is deleted. The multirun's output goes to OUT/logs/<stage>.log; a line is printed
    as each run ends. SIGINT reaches the multirun as SIGINT, SIGTERM and SIGHUP as SIGTERM, once: its jobs save
    and stop, and so does the study (StudyStopped). Should this process be killed outright, the multirun gets
    SIGTERM from the OS (die_with_parent)."""
    todo = [p for p in points if finished(out / p.name) is None]
    if len(todo) < len(points):
        print(f"{stage}: {len(points) - len(todo)} of {len(points)} runs kept from an earlier call", flush=True)
    if not todo:
        return
    with dir_lock(out / RECORDS / "lock", f"--out {out}: a multirun of an earlier call still runs there (pid {{pid}}); "
                                          f"wait for it to end, or stop it with kill -INT {{pid}}"):
        pass  # not one run dir is touched while another process trains in it
    plan = out / ".plan"
    for point in todo:
        write_point_config(plan, point)
    log = out / "logs" / f"{stage}.log"
    log.parent.mkdir(exist_ok=True)
    command = [sys.executable, str(ROOT / "train.py"), "-m", "+experiment=ablation", "hydra.sweeper.params=null",
               f"hydra.searchpath=[file://{plan.resolve()}]", f"hydra.sweep.dir={out}",
               "hydra.sweep.subdir=${hydra:runtime.choices.point}", *overrides,
               "+point=" + ",".join(p.name for p in todo)]
    print(f"{stage}: {len(todo)} runs, as one multirun (its output: {log})", flush=True)
    started, waiting, stopped_by = time.perf_counter(), list(todo), []
    with open(log, "a") as output:
        # a session of its own: a terminal's Ctrl-C reaches this process alone, which passes it on exactly once
        # (a second SIGINT would abort the runs before their checkpoints)
        multirun = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT,
                                    start_new_session=True, preexec_fn=die_with_parent)

        def stop(signum, frame):
            if not stopped_by:
                stopped_by.append(signum)
                multirun.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

        previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while waiting:
                ended = multirun.poll() is not None
                for point, summary in [(p, finished(out / p.name)) for p in waiting]:
                    if summary is None:
                        continue
                    waiting.remove(point)
                    done.append(point)
                    result = f"val bpb {summary['val_bpb']:.4f}" if "val_bpb" in summary else summary["stop_reason"]
                    print(f"[{len(done)}] {point.name}: {result} "
                          f"({time.perf_counter() - started:.0f} s into the stage)", flush=True)
                if ended:
                    break
                time.sleep(1)
            multirun.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    if stopped_by:
        raise StudyStopped(stopped_by[0])
    if waiting:
        records = [json.loads(record.read_text()) for record in (out / RECORDS).glob("[0-9]*.json")]  # each job's end
        ends = {Path(record["dir"]).resolve(): how_it_ended(record["exit_code"]) for record in records}
        failed = ", ".join(f"{p.name} ({ends.get((out / p.name).resolve(), f'multirun exit {multirun.returncode}')})"
                           for p in waiting)
        raise RunFailed(f"{stage}: {len(waiting)} of {len(todo)} runs ended without a result: {failed}; "
                        f"their output: {log}")


def write_point_config(plan: Path, point) -> None:
    """The point as a config of the group `point`: its variant, then its own settings."""
    settings = OmegaConf.create()
    for key, value in point.settings().items():
        OmegaConf.update(settings, key, value)
    config = plan / "point" / f"{point.name}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"# @package _global_\ndefaults:\n  - override /ablation: {point.variant}\n\n"
                      f"{OmegaConf.to_yaml(settings)}")


def best_lrs(out: Path, lines: dict[str, Point], planned: dict[str, list[float]]) -> dict[str, float | None]:
    """Each line's best lr among the learning rates planned for it, by compare.py's rule (None where no run
    completed): runs in OUT at other rates (an earlier, wider study's) are not this study's. A diverged run is
    never the best, so the loss at initialisation it would count at does not matter here."""
    best = {}
    for line, point in lines.items():
        dirs = [out / Point(point.variant, lr, warmup=point.warmup).name for lr in planned[line]]
        runs = [compare.load_run(d) for d in dirs if finished(d)]
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
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run and the launcher, after --")
    args = parser.parse_args(argv)
    lrs = sorted(args.lrs)
    if len(lrs) < 2 or lrs[0] <= 0 or len(set(lrs)) < len(lrs):
        parser.error(f"--lrs {' '.join(map(str, args.lrs))}: at least two distinct positive learning rates")
    if args.seeds < 1 or args.widen < 0:
        parser.error(f"--seeds {args.seeds} must be >= 1, --widen {args.widen} >= 0")
    run_main(lambda: run_study(args.out, args.variants, args.probe, lrs, args.seeds, args.widen, args.overrides))


def run_main(study) -> None:
    """Runs a study as a script does: bad input is one `error:` line and exit 2; a signal one line and 128 + its
    number (130 for Ctrl-C)."""
    try:
        study()
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (StudyStopped, KeyboardInterrupt) as stopped:  # a KeyboardInterrupt: Ctrl-C between two stages
        signum = getattr(stopped, "signum", signal.SIGINT)
        print(f"stopped: {signal.Signals(signum).name}: the runs in progress saved a checkpoint and stopped; the same command resumes the "
              f"study (finished runs are kept, stopped ones continue from their checkpoints)", file=sys.stderr)
        sys.exit(128 + signum)


def run_study(out: Path, variants: list[str], probe: list[str], lrs: list[float], n_seeds: int, widen: int,
              overrides: list[str]) -> None:
    started, done = time.perf_counter(), []
    grid = [Point(v, lr, warmup=w) for w in (True, False) for v in (variants if w else probe)
            for lr in lrs]
    check_overrides(overrides, grid)
    print(f"study in {out}: {len(variants)} variants x {len(lrs)} learning rates ({lrs[0]:g} .. {lrs[-1]:g})",
          flush=True)
    with study_dir(out):
        launch(grid, out, overrides, "grid", done)
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
            launch(extra, out, overrides, f"edges{edge + 1}", done)

        best = best_lrs(out, lines, planned)
        seeds = [Point(p.variant, best[line], seed) for line, p in lines.items() if p.warmup and best[line]
                 for seed in range(1, n_seeds)]
        launch(seeds, out, overrides, "seeds", done)
        write_json(out / "best_lr.json", best)

    print(f"\n{len(done)} runs in {(time.perf_counter() - started) / 60:.1f} min. Best learning rates:")
    for line, lr in best.items():
        print(f"  {line}: {lr:g}" if lr else f"  {line}: no run completed")
    print(f"\npython compare.py {out} --lr-plot docs/ablation_lr.png --plot docs/ablation.png")


if __name__ == "__main__":
    main()
