"""The window study's lines past their trained context (docs/ablation.md, "Windows and sinks"): each line's runs at
its best learning rate in a sweep.py study (its best_lr.json), seeds 0-2, scored by evaluate.py on the val split's
first 32,768 tokens (--max-tokens)

- at 1x, 2x, 4x and 8x the context, chunked and sliding (stride L / 2), as docs/long_context.md scores its lines;
- streamed at 8x (--mode streaming): a line with a full layer with the window alone (--sink-tokens 0) and with
  StreamingLLM's 4 sink tokens, a line whose layers are all local in its own rolling cache.

    python scripts/window_lengths.py multirun/lr_window --json docs/ablation_window_lengths.json

The evaluations' JSONs go to <study>/eval_lengths/<run>/, where the same command finds and keeps them. Every number is
also paired within its run: its bpb less the run's own chunked bpb at 1x, mean and std over the seeds (`cost`).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, from any dir

from cli import ascii_numbers  # noqa: E402
from errors import UsageError  # noqa: E402
from insight.lengths import run_config  # noqa: E402
from storage.files import write_json  # noqa: E402
from study.launch import run_main  # noqa: E402
from study.lengths import MAX_TOKENS, SEEDS, evaluate_all, table  # noqa: E402
from study.lr_study import Point  # noqa: E402
from training.config import model_config  # noqa: E402

FACTORS = (1, 2, 4, 8)  # lengths as multiples of the trained context
SINK_TOKENS = (0, 4)  # the window alone, StreamingLLM's 4


def evaluations(study: Path) -> tuple[list[tuple[str, int, Path, list[str]]], dict[str, int]]:
    """(row, seed, run dir, evaluate.py's flags) of every evaluation, the study's lines at their best lr; and each
    line's trained context."""
    if not (study / "best_lr.json").is_file():
        raise UsageError(f"{study} has no best_lr.json: give the dir of a finished `python sweep.py --out` study")
    jobs, contexts = [], {}
    for line, lr in json.loads((study / "best_lr.json").read_text()).items():
        if lr is None:
            raise UsageError(f"{line} has no best learning rate in {study / 'best_lr.json'}: none of its runs ended")
        for seed in SEEDS:
            run = study / Point(line, lr, seed).name
            cfg = model_config(run_config(run))
            contexts[line] = cfg.context_length
            longest = FACTORS[-1] * cfg.context_length
            jobs.append((line, seed, run, ["--lengths", ",".join(str(f * cfg.context_length) for f in FACTORS)]))
            streaming = ["--lengths", str(longest), "--mode", "streaming"]
            if cfg.n_local_layers == cfg.n_layers:  # its rolling caches stream; there is no full layer for sinks
                jobs.append((f"{line}+stream", seed, run, streaming))
            else:
                jobs += [(f"{line}+stream{s}", seed, run, [*streaming, "--sink-tokens", str(s)]) for s in SINK_TOKENS]
    return jobs, contexts


def costs(rows: list[dict]) -> list[dict]:
    """Each row's bpb less its run's own chunked bpb at the trained context (the line's row at 1x, same seed), mean
    and sample std over seeds: what reading past the context costs that run, its seed's spread paired out."""
    own = {(r["row"], r["seed"]): r["val_bpb"] for r in rows if r["mode"] == "chunked" and r["length"] == r["context"]}
    cells = {}
    for r in rows:
        cells.setdefault((r["row"], r["length"], r["mode"]), []).append(r["val_bpb"] - own[r["line"], r["seed"]])
    return [{"row": row, "length": length, "mode": mode, "mean": statistics.mean(v), "std": statistics.stdev(v)}
            for (row, length, mode), v in cells.items()]


def main(argv=None) -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__))
    parser.add_argument("study", type=Path, help="a sweep.py study dir, with its best_lr.json")
    parser.add_argument("--json", type=Path, help="the table, the paired costs and every evaluation's rows")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="the val split's first tokens to score")
    args = parser.parse_args(argv)

    def study():
        jobs, contexts = evaluations(args.study)
        rows = [{**r, "line": (line := r["row"].split("+")[0]), "context": contexts[line]}
                for r in evaluate_all(args.study, args.study / "eval_lengths", jobs, args.max_tokens)]
        cells, paired = table(rows), costs(rows)
        cost_of = {(c["row"], c["length"], c["mode"]): c for c in paired}
        print("| row | length | mode | val bpb | less the run's own at 1x |\n|---|---:|---|---:|---:|")
        for cell in cells:
            cost = cost_of[cell["row"], cell["length"], cell["mode"]]
            print(f"| {cell['row']} | {cell['length']} | {cell['mode']} | {cell['mean']:.4f} ± {cell['std']:.4f} | "
                  f"{cost['mean']:+.4f} ± {cost['std']:.4f} |")
        if args.json:
            write_json(args.json, {"factors": FACTORS, "max_tokens": args.max_tokens, "table": cells, "cost": paired,
                                   "rows": rows})

    run_main(study)


if __name__ == "__main__":
    main()
