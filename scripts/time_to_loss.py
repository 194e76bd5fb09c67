"""The speedrun's benchmark (docs/speedrun.md): how fast each preset reaches a loss on Tiny Shakespeare, and what loss
each reaches in the same wall-clock, against nanoGPT's README CPU run when a clone of nanoGPT is given.

    python scripts/time_to_loss.py --text tinyshakespeare.txt --out runs/time_to_loss --nanogpt ../nanoGPT

The split is nanoGPT's: the text's first 90% trains, its last 10% is val (data.val_fraction=0.1 of one document;
nanoGPT cuts at int(0.9 n) characters, this at n - ceil(0.1 n): the same cut for Tiny Shakespeare). Every preset
trains on the same 1024 pieces. The loss is val bits per byte, bits per character on this ASCII text; nanoGPT's val
loss in nats per character is divided by ln 2.

- Seconds to the target: a speedrun's record is the time of a run whose schedule ends at the target, so each
  preset trains at each of --budgets (seconds of training, the schedule fitted to each) and the seconds to
  --target are interpolated between the two runs whose final losses straddle it (on log seconds), per seed; a run's
  seconds are its training time (summary.json's elapsed_s: its steps and its final eval, a little under its
  budget, which keeps the end's reserve).
  nanoGPT's are its own run's: the seconds of its training loop (the sum of its iterations' times, its evals
  included, as ours include the final eval), to its final val loss, which is the target by default.
- Loss at equal wall-clock: each preset trained for --equal-time seconds, one eval at the end.

Runs go one at a time, nothing else may run meanwhile (the timings need the cores to themselves), each in a dir of
its own under --out, the seeds outermost so that any drift of the machine falls on every preset alike. A run that
has a result is kept, so the same command resumes an interrupted benchmark and only trains what is missing; a run
that fails costs itself only, and the command then exits 1 naming it. Ctrl-C or SIGTERM stops the run in progress
(ours save and resume; a stopped nanoGPT run starts again) and the command; no process outlives it. Prints a table and writes --json.
"""
import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, from any dir

from cli import ascii_numbers  # noqa: E402
from errors import UsageError  # noqa: E402
from storage.files import write_json  # noqa: E402
from study.launch import ROOT, StudyStopped, finished, run_main, signals_passed_to, start_multirun  # noqa: E402

PRESETS = ("speedrun", "modern_tiny", "llama_tiny")
NANOGPT_TARGET = 1.8857 / math.log(2)  # nanoGPT README's CPU run ends at val loss 1.8857 nats/char: 2.7205 bits
# nanoGPT's README command for a CPU (its section "I only have a macbook"), with its own seed
NANOGPT_COMMAND = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                   "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                   "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]


def main(argv=None) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__))
    parser.add_argument("--text", type=Path, required=True, help="Tiny Shakespeare as one file (input.txt)")
    parser.add_argument("--out", type=Path, default=Path("runs/time_to_loss"))
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--budgets", type=float, nargs="+", default=[10, 15, 20, 30, 45],
                        help="training seconds of the runs the seconds to the target are read from")
    parser.add_argument("--equal-time", type=float, default=120, help="training seconds of the equal wall-clock runs")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=1024, help="every preset's pieces (modern_tiny's 1024)")
    parser.add_argument("--target", type=float, default=NANOGPT_TARGET, help="val bits per character")
    parser.add_argument("--nanogpt", type=Path, help="a clone of karpathy/nanoGPT: its README CPU run, --seeds times")
    parser.add_argument("--json", type=Path, help="default: OUT/time_to_loss.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run of ours, after --")
    args = parser.parse_args(argv)
    run_main(lambda: benchmark(args))


def benchmark(args) -> int:
    if not args.text.is_file():
        raise UsageError(f"--text {args.text}: no such file")
    if args.nanogpt is not None and not (args.nanogpt / "train.py").is_file():
        raise UsageError(f"--nanogpt {args.nanogpt}: not a clone of nanoGPT (no train.py there)")
    if args.seeds < 1 or sorted(args.budgets) != args.budgets or min(args.budgets) <= 0:
        raise UsageError(f"--seeds {args.seeds} must be >= 1 and --budgets {args.budgets} positive and ascending")
    runs = [(preset, seed, budget) for seed in range(args.seeds) for preset in args.presets
            for budget in [*args.budgets, args.equal_time]]
    failed, results = [], {"target_bits": args.target, "budgets": args.budgets, "equal_time": args.equal_time}
    if args.nanogpt is not None:
        prepare_nanogpt(args.nanogpt, args.text)
        results["nanogpt"] = [nanogpt_run(args.nanogpt, args.out / "nanogpt" / f"run{k}", failed)
                              for k in range(args.seeds)]
    finals = {}
    for preset, seed, budget in runs:
        run_dir = args.out / preset / f"b{budget:g}" / f"seed{seed}"
        summary = finished(run_dir) or train(preset, seed, budget, args.text.resolve(), args.vocab_size, run_dir,
                                             args.overrides)
        if summary is None:
            failed.append(str(run_dir))
        else:
            finals.setdefault(preset, {}).setdefault(budget, {})[seed] = {
                key: summary[key] for key in ("elapsed_s", "val_bpb", "steps", "tokens_per_s")}
    results["presets"] = {preset: preset_result(finals.get(preset, {}), args) for preset in args.presets}
    write_json(args.json or args.out / "time_to_loss.json", results)
    print(table(results))
    if failed:
        print(f"error: {len(failed)} runs ended without a result: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def run_to_end(command: list[str], cwd: Path, log: Path) -> int:
    """One process, its output into log; SIGINT and SIGTERM reach it once and stop the benchmark after it saved."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as output:
        process = start_multirun(command, output, cwd)
        with signals_passed_to(process) as stopped_by:
            code = process.wait()
    if stopped_by:
        raise StudyStopped(stopped_by[0])
    return code


def train(preset: str, seed: int, budget: float, text: Path, vocab_size: int, run_dir: Path, overrides: list[str]
          ) -> dict | None:
    print(f"{preset}, {budget:g} s, seed {seed}: {run_dir}", flush=True)
    never = 1_000_000  # one eval, sample and checkpoint: at the end
    run_to_end([sys.executable, str(ROOT / "train.py"), f"model={preset}", "data=text", f"data.path={text}",
                "data.val_fraction=0.1", f"data.vocab_size={vocab_size}", f"train.time_budget={budget:g}",
                "train.max_steps=null", f"train.seed={seed}", f"train.eval_interval={never}", f"train.ckpt_interval={never}",
                f"train.sample_interval={never}", "train.resume=auto", f"hydra.run.dir={run_dir.resolve()}",
                "latest_link=null", "wandb.mode=disabled", *overrides], ROOT, run_dir.parent / f"{run_dir.name}.log")
    return finished(run_dir)


def prepare_nanogpt(clone: Path, text: Path) -> None:
    """nanoGPT's character data from this text (its prepare.py reads input.txt there, else downloads it)."""
    data = clone / "data" / "shakespeare_char"
    if not (data / "input.txt").exists():
        shutil.copyfile(text, data / "input.txt")
    elif (data / "input.txt").read_bytes() != text.read_bytes():
        raise UsageError(f"--nanogpt {clone}: its {data / 'input.txt'} is another text than --text {text}")
    if not (data / "val.bin").exists():
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)


def nanogpt_run(clone: Path, run_dir: Path, failed: list) -> dict | None:
    result = run_dir / "result.json"
    if result.exists():
        return json.loads(result.read_text())
    print(f"nanoGPT: {run_dir}", flush=True)
    log = run_dir / "log.txt"
    log.unlink(missing_ok=True)  # its lines are read back: one attempt's only
    code = run_to_end([sys.executable, "train.py", *NANOGPT_COMMAND, f"--out_dir={run_dir.resolve()}"], clone, log)
    lines = log.read_text().splitlines()
    iters = [float(line.split("time ")[1].split("ms")[0]) / 1000 for line in lines if line.startswith("iter ")]
    vals = [float(line.split("val loss ")[1]) for line in lines if line.startswith("step ") and "val loss" in line]
    if code or not vals:
        failed.append(str(run_dir))
        return None
    values = {"train_s": sum(iters), "iters": len(iters), "val_loss_nats": vals[-1], "val_bits": vals[-1] / math.log(2)}
    write_json(result, values)
    return values


def seconds_to(target: float, by_budget: dict[float, float]) -> tuple[float | None, str]:
    """The seconds at which the final val bits cross the target, on log seconds between the two runs (their training
    seconds: their final val bits) that straddle it: (seconds, "") or (None, "<= s" / "> s") where none do."""
    budgets = sorted(by_budget)
    if by_budget[budgets[0]] <= target:
        return None, f"<= {budgets[0]:.1f}"
    for low, high in zip(budgets, budgets[1:]):
        if by_budget[high] <= target < by_budget[low]:
            share = (by_budget[low] - target) / (by_budget[low] - by_budget[high])
            return math.exp(math.log(low) + share * (math.log(high) - math.log(low))), ""
    return None, f"> {budgets[-1]:.1f}"


def preset_result(finals: dict[float, dict[int, dict]], args) -> dict:
    """finals[budget][seed]: each run's elapsed_s, val_bpb, steps and tokens_per_s."""
    seeds = sorted(set.intersection(*(set(finals.get(b, {})) for b in args.budgets))) if finals else []
    crossings = [seconds_to(args.target, {finals[b][seed]["elapsed_s"]: finals[b][seed]["val_bpb"]
                                          for b in args.budgets}) for seed in seeds]
    return {"seconds_to_target": [s for s, _ in crossings], "not_straddled": [why for _, why in crossings if why],
            "runs_by_budget": {f"{b:g}": finals.get(b, {}) for b in [*args.budgets, args.equal_time]},
            "equal_time_bits": [run["val_bpb"] for run in finals.get(args.equal_time, {}).values()]}


def spread(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    middle = statistics.median(values)
    return f"{middle:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(results: dict) -> str:
    nano = [r for r in results.get("nanogpt", []) if r]
    nano_s = statistics.median([r["train_s"] for r in nano]) if nano else None
    rows = [f"seconds to {results['target_bits']:.4f} bits/char, and val bits/char after {results['equal_time']:g} s "
            f"of training (median, range over seeds)", "",
            "| model | seconds to target | vs nanoGPT's time | bits/char at equal time | runs |",
            "|---|---:|---:|---:|---:|"]
    if nano:
        rows.append(f"| nanoGPT README CPU run (its end) | {spread([r['train_s'] for r in nano], 1)} | 1.000 | "
                    f"{spread([r['val_bits'] for r in nano], 4)} at its end | {len(nano)} |")
    for preset, r in results["presets"].items():
        seconds = r["seconds_to_target"]
        known = [s for s in seconds if s is not None]
        ratio = spread([s / nano_s for s in known], 3) if nano_s and len(known) == len(seconds) and known else "-"
        shown = spread(known, 1) if len(known) == len(seconds) and known else ", ".join(r["not_straddled"]) or "-"
        rows.append(f"| {preset} | {shown} | {ratio} | {spread(r['equal_time_bits'], 4)} | {len(seconds)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
