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
With --experiment capabilities they train on a synthetic task (`-- data.task=k_hop`; docs/capabilities.md), each
line's best lr by its final val loss at the task's answers. With --experiment speedrun the same variants are
switched on the speedrun's model instead (configs/experiment/speedrun.yaml: modern_tiny for 2 minutes of Tiny
Shakespeare; docs/speedrun.md):

    python sweep.py --experiment speedrun --out multirun/speedrun --variants baseline value_embeddings ... \
        --probe --lrs 0.0025 0.005 0.01 -- data.path=tinyshakespeare_train.txt

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
from pathlib import Path

from cli import ascii_numbers
from settings import ablation_variants
from study.launch import run_main
from study.lr_study import GRID, PROBE, run_study

# the configs/experiment/ files whose runs take configs/ablation/'s variants
EXPERIMENTS = ("ablation", "speedrun", "capabilities")


def main(argv=None) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__))
    parser.add_argument("--out", type=Path, default=Path("multirun/lr_sweep"), help="the study's dir")
    parser.add_argument("--experiment", default="ablation", choices=EXPERIMENTS,
                        help="the runs' model, data and budget (configs/experiment/): the ablation's, the "
                             "speedrun's (modern_tiny on Tiny Shakespeare for 2 minutes, docs/speedrun.md), or the "
                             "capability map's (a synthetic task, -- data.task=<task>: docs/capabilities.md)")
    variants = ablation_variants()  # configs/ablation/'s files
    parser.add_argument("--variants", nargs="+", default=variants, choices=variants)
    parser.add_argument("--probe", nargs="*", default=list(PROBE), choices=variants,
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
    run_main(lambda: run_study(args.out, args.variants, args.probe, lrs, args.seeds, args.widen, args.overrides,
                               args.experiment))


if __name__ == "__main__":
    main()
