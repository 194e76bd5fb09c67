"""The ablation at equal wall-clock (docs/ablation.md): each variant at its own learning rate, trained for the
seconds the baseline takes for the ablation's 300 steps, seeds 0-2. It goes the way sweep.py's stages go: each
stage one Hydra multirun of the runs still missing (study/launch.py), so the overrides after `--` reach every run
and choose the launcher. The default, Hydra's basic launcher, trains one run at a time with all the cores, the
seeds outermost, so that any drift of the machine falls on every variant alike; nothing else may run meanwhile.
A run whose summary.json says it ended by itself is kept, so the same command resumes a stopped study.

    python scripts/equal_time.py --variants baseline layernorm postnorm ...     # into multirun/equal_time
    python compare.py multirun/equal_time/runs --plot docs/ablation_time.png
"""
import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, from any dir

from cli import ascii_numbers  # noqa: E402
from settings import ablation_variants  # noqa: E402
from study.launch import check_overrides, launch, run_main, study_dir  # noqa: E402

SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Run:
    name: str  # its dir under the study's
    variant: str  # a configs/ablation/ name
    own: dict = field(hash=False)  # its settings beyond the ablation's

    def settings(self) -> dict:
        return {"train.diagnostics": False, "wandb.group": "equal_time", **self.own}


def main(argv=None) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__))
    parser.add_argument("--out", type=Path, default=Path("multirun/equal_time"), help="the study's dir")
    parser.add_argument("--variants", nargs="+", required=True, choices=ablation_variants())
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run and the launcher, after --")
    args = parser.parse_args(argv)
    run_main(lambda: equal_time(args.out, args.variants, args.overrides))


def equal_time(out: Path, variants: list[str], overrides: list[str]) -> None:
    reference = Run("reference/baseline_300_steps", "baseline", {"train.seed": 0})
    # the intervals' defaults follow train.max_steps, which a budgeted run leaves null: only at the end
    budgeted = {"train.max_steps": None, "train.ckpt_interval": 1_000_000, "train.sample_interval": 1_000_000}
    runs = [Run(f"runs/{variant}/seed{seed}", variant, {"train.seed": seed, **budgeted})
            for seed in SEEDS for variant in variants]
    check_overrides(overrides, [reference, *runs])
    with study_dir(out):
        launch([reference], out, overrides, "reference", [])
        seconds = round(json.loads((out / reference.name / "summary.json").read_text())["elapsed_s"], 1)
        print(f"budget: the baseline's 300 steps took {seconds} s of training ({out / reference.name})", flush=True)
        launch([Run(run.name, run.variant, {**run.own, "train.time_budget": seconds}) for run in runs],
                     out, overrides, "runs", [])


if __name__ == "__main__":
    main()
