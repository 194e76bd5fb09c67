"""Compare training runs without W&B: a markdown table, a plot of val bpb against tokens, and a warning where the
comparison is not fair.

    python compare.py multirun/ablation/2025-01-01_12-00-00 [more dirs...] --plot docs/ablation.png

Each DIR is a run dir or any folder above run dirs (a multirun dir); a run dir is a folder
holding the metrics.jsonl or config.yaml that train.py writes. Runs are grouped into variants:
runs of one sweep (a multirun's dir: train.py -m, a sweep.py study; or runs of their own) whose resolved
configs are equal apart from train.seed and what only changes how a run is logged or run (NOT_COMPARED:
wandb.*, train.threads, train.resume, latest_link) are seeds of one variant; two sweeps of one config stay two variants.
A variant is named by its config's `variant` key (the ablation sets it), else by the settings in which it
differs from what most variants have (a setting the variants split on evenly names each of them), written as the
overrides that give them: `ffn=moe`, `model=moe_tiny, train.lr=0.003` (a run of an older config, which names no
preset: `model.norm=layernorm`); a preset run with no override of its own is named by its preset (`llama_tiny`);
else by where its runs are (its sweep dir or run dir, relative to the others'), which is also added to a name that
several variants share.

Per variant: final val loss and val bpb as mean ± sample std over its complete runs (n), and
the difference in bpb from the baseline variant, which counts as beyond seed noise when

    |Δ| > 2 · sqrt(s_v² / n_v + s_b² / n_b)

(two standard errors of the difference of two means; "n/a" when either side has one run).
The baseline is --baseline, else by one rule: the ablation's `baseline`, else the line with no switch from its
preset, named by the preset (`llama_tiny`); of several (presets side by side, or one preset's switches beside
another preset's run), the one whose preset the most lines train, as the others are its switches; of a tie,
configs/config.yaml's own preset.
bpb alone is compared: every run reads the same tokenizer, so loss and bpb differ by a constant.
Each row also shows the steps, tokens and seconds its runs trained (a range where they differ), and their tokens/s
(the mean of each run's own rate, summary.json's tokens_per_s, the one its last line prints).
Runs trained for one train.time_budget each (an equal-wall-clock comparison) are expected to differ in
tokens: a note says so, and the plot's x axis is training seconds. --plot also draws, below the curves, each
variant's Δ bpb against the baseline as a bar whose error bar is the table's 2σ.

A warning line follows the table (study/fairness.py) where the rows are not like with like:
- at a shared lr: more than one line, every complete run at one train.lr, and not every line a line of the
  ablation (its `variant`) at the rate configs/ablation/<variant>.yaml records. A learning-rate sweep is not this
  case: its lines are compared at each one's best lr.
- the machine's speed changed: the tokens/s of one line's seeds, or (between lines that trained their preset's
  own model) each run's tokens/s over its train.reference_tokens_per_s, highest over lowest, above 2 (idle seeds
  of one config here agree within 1.14; one busy process beside a run cost 3-7x), of the runs whose steps took
  0.2 s or more (a shorter rate is the timer's as much as the machine's).
- unequal tokens: the complete runs trained different numbers of tokens, outside an equal-wall-clock comparison.

A learning-rate sweep whose run dirs are gone can be shown beside new runs from the JSON that --json wrote
(--recorded): each recorded line comes back as its final val bpb per learning rate (seed 0) and per seed at its
best learning rate, in the LR tables and the LR plot; a line in DIR replaces a recorded line of the same name.

A run whose metrics.jsonl is missing, has a line that is not JSON (killed mid-write), has no
val_bpb, or stops before train.max_steps (or whose summary.json gives a stop_reason other than
completed: a NaN loss, a signal) is reported as incomplete and left out of the means.
"""
import argparse
import sys
from pathlib import Path

from cli import ascii_numbers, run_command
from errors import UsageError
from storage.files import write_json, writing
from study.lr import AXES, grid_that_trains, largest_lr_that_trains, lr_sweep_lines
from study.plots import lr_plot, plot
from study.runs import LEARNING_RATE, SEED, Run, Variant, find_run_dirs, load_run, recorded_variants
from study.fairness import shared_lr_warning, speed_warning, unequal_tokens_warning
from study.tables import equal_time_budget, lr_curve_table, lr_table, markdown_table, routes, routing_table
from study.variants import default_baseline, group_runs


def report_lr_sweep(runs: list[Run], sweep, baseline_name: str, margin: float, args) -> None:
    lines, grid, init = sweep
    baseline = next((line for line in lines if line.name == baseline_name), None)
    lines.sort(key=lambda line: line is not baseline)
    unigram = next((r.summary["unigram_val_bpb"] for r in runs if "unigram_val_bpb" in r.summary), None)
    trains = {line.name: largest_lr_that_trains(line, unigram - margin) if unigram is not None else None
              for line in lines}
    grid_trains = {line.name: grid_that_trains(line, grid, unigram - margin) if unigram is not None else "n/a"
                   for line in lines}
    unit = AXES[lines[0].axis]  # bpb, or a task's val loss in nats
    print(lr_table(lines, baseline, trains, grid_trains))
    if routing := routing_table([line.best for line in lines]):
        print(f"\nThe routing at each line's best lr (last eval):\n\n{routing}")
    print(f"\nLR sensitivity: over the {len(grid)} learning rates every variant has ({', '.join(f'{lr:g}' for lr in grid)}), "
          f"with the loss at initialisation, val {unit} {init:.4f} (ln vocab_size), for a diverged run or one worse than "
          f"that.")
    if unigram is not None:
        print(f"Trains: final val bpb below the unigram level {unigram:.4f} - {margin:g} = {unigram - margin:.4f} (seed 0).")
    print(f"\nFinal val {unit} (seed 0) at each learning rate:\n\n" + lr_curve_table(lines))
    if baseline is None:
        print(f"\nno variant named {baseline_name!r}, so no differences: pass --baseline with one of "
              f"{', '.join(repr(line.name) for line in lines)}")
    if args.plot:
        plot([line.best for line in lines if line.best.runs], args.plot, baseline=baseline.best if baseline else None)
        print(f"\nplot (each variant at its best lr): {args.plot}")
    if args.lr_plot:
        lr_plot(lines, init, unigram, args.lr_plot)
        print(f"plot (final val {unit} vs learning rate): {args.lr_plot}")
    if args.json:
        numbers = {"grid": grid, "init_bpb": init, "unigram_val_bpb": unigram, "trains_margin": margin,
                   "variants": {line.name: {
                       "best_lr": line.best_lr, "lr_sensitivity": line.sensitivity,
                       "largest_lr_that_trains": trains[line.name], "grid_that_trains": grid_trains[line.name],
                       f"final_{unit}_seed0": {f"{lr:g}": bpb for lr, bpb in line.curve.items()},
                       "diverged": sorted(line.diverged),
                       f"best_lr_val_{unit}": line.best.final(line.axis),
                       **({"best_lr_max_vio": line.best.final("moe/max_vio")} if routes(line.best) else {})}
                       for line in lines}}
        with writing(args.json):
            write_json(args.json, numbers)
        print(f"numbers: {args.json}")


def report_comparison(variants: list[Variant], baseline_name: str, args) -> None:
    baseline = next((v for v in variants if v.name == baseline_name), None)
    variants.sort(key=lambda v: v is not baseline)  # the baseline row first, the rest as found
    print(markdown_table(variants, baseline))
    if routing := routing_table(variants):
        print(f"\nThe routing (last eval):\n\n{routing}")
    if baseline is None:
        print(f"\nno variant named {baseline_name!r}, so no differences: pass --baseline with one of "
              f"{', '.join(repr(v.name) for v in variants)}")
    if args.plot:
        x = "elapsed_s" if equal_time_budget([r for v in variants for r in v.runs]) is not None else "tokens"
        plot(variants, args.plot, x, baseline)
        deltas = ", and each variant's Δ bpb with its seed noise" if baseline else ""
        print(f"\nplot (val bpb vs {'training seconds' if x == 'elapsed_s' else 'tokens'}{deltas}): {args.plot}")


def main(argv=None) -> None:
    if status := run_command(lambda: compare(argv)):
        sys.exit(status)


def compare(argv) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs or folders above them (a multirun dir)")
    parser.add_argument("--plot", type=Path, help="write val bpb vs tokens to this PNG")
    parser.add_argument("--lr-plot", type=Path, help="a learning-rate sweep: final val bpb vs lr to this PNG")
    parser.add_argument("--json", type=Path, help="a learning-rate sweep: its numbers to this JSON file")
    parser.add_argument("--trains-margin", type=float, default=0.1,
                        help="a run trains when its final val bpb is this far below the unigram level")
    parser.add_argument("--baseline", help="the variant the others are compared with (default: `baseline`, else the "
                        "line with no switch from its preset, of the preset the most lines train)")
    parser.add_argument("--recorded", type=Path,
                        help="a learning-rate sweep's JSON (--json) whose lines are shown beside the dirs' lines")
    args = parser.parse_args(argv)

    run_dirs = []
    for root in args.dirs:
        found = find_run_dirs(root) if root.is_dir() else []
        if not found:
            raise UsageError(f"DIR {root}: no run there (a run dir holds metrics.jsonl or config.yaml)")
        run_dirs += found
    runs = [load_run(d) for d in dict.fromkeys(run_dirs)]
    lines = group_runs(runs, SEED + LEARNING_RATE)
    if args.recorded:
        try:
            recorded = recorded_variants(args.recorded)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UsageError(f"--recorded {args.recorded}: not a sweep's JSON from compare.py --json "
                             f"({type(err).__name__}: {err})") from None
        lines += [v for v in recorded if v.name not in {line.name for line in lines}]
    sweep = lr_sweep_lines(lines)
    if sweep is None and (args.lr_plot or args.json):
        raise UsageError(f"--lr-plot/--json need a learning-rate sweep, but no variant in "
                         f"{' '.join(map(str, args.dirs))} has runs at more than one train.lr")
    # a sweep's table compares each line at its best lr and shows no tokens/s: of the warnings, the tokens' alone
    variants = group_runs(runs) if sweep is None else []
    try:
        if sweep is None:
            report_comparison(variants, args.baseline or default_baseline(variants), args)
        else:
            report_lr_sweep(runs, sweep, args.baseline or default_baseline(lines), args.trains_margin, args)
    finally:  # a plot or JSON that cannot be written: what was read is printed whole, then the error line
        warnings = [shared_lr_warning(variants), speed_warning(variants), unequal_tokens_warning(runs)]
        if any(warnings):
            print("\n" + "\n".join(w for w in warnings if w))
        incomplete = [r for r in runs if r.problem]
        if incomplete:
            print("\nincomplete runs, left out of the means:")
            for run in incomplete:
                print(f"- {run.path}: {run.problem}")


if __name__ == "__main__":
    main()
