"""The vocabulary rule's measurement: which vocab size trains best on a corpus of a given size, in a fixed budget.

    python scripts/vocab_rule.py --out /tmp/vocab_rule --json docs/vocab_rule.json     # 12 runs, one at a time
    python scripts/vocab_rule.py --out /tmp/vocab_rule --plays 8 --vocabs 4096          # one more point
    python scripts/vocab_rule.py --out /tmp/vocab_default --model default --seeds 0 1   # the default model, 5 minutes

Subsets of the default corpus (Shakespeare's plays, data=shakespeare), every k-th play, are written as text files,
and each is trained as a user's own corpus would be (data=text) at each --vocabs, with model=llama_quick's model and
2-minute budget (--model quick) or the default model and its 5-minute budget (--model default), one run at a time
(a budget is wall-clock: runs side by side share the cores unevenly). Within a
subset the split (by documents, or each document's tail) is the same for every vocab, and bits per byte divide out
the tokenizer, so the rows of one subset compare. The size the rule reads is the train split's UTF-8 bytes, from
the token cache's manifest. A run dir that holds a completed run's summary.json is kept: the same command resumes,
and --json keeps the rows of the runs this command did not make (two commands, one table).
"""
import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli import ascii_numbers  # noqa: E402
from data.sources import shakespeare  # noqa: E402  (after the path: run as a script from anywhere)
from storage.files import write_json  # noqa: E402


def write_subsets(out: Path, play_counts: list[int]) -> dict[int, Path]:
    plays = shakespeare({}).load()["text"]
    subsets = {}
    for count in play_counts:
        folder = out / f"plays{count}"
        folder.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(plays[:: max(1, len(plays) // count)][:count]):
            (folder / f"play{i:02d}.txt").write_text(text)
        subsets[count] = folder
    return subsets


MODELS = {"quick": (["model=llama_quick"], "2m"), "default": ([], "5m")}  # overrides, budget


def train(folder: Path, vocab: int, seed: int, out: Path, model: str, budget: str, threads: int) -> dict:
    run_dir = out / "runs" / f"{folder.name}-v{vocab}-s{seed}"
    summary_file = run_dir / "summary.json"
    if not (summary_file.exists() and json.loads(summary_file.read_text()).get("stop_reason") == "completed"):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        with open(out / f"{run_dir.name}.log", "w") as log:
            subprocess.run([sys.executable, str(ROOT / "train.py"), *MODELS[model][0], "data=text",
                            f"data.path={folder}/*.txt", f"data.vocab_size={vocab}", f"data.cache_dir={out / 'cache'}",
                            f"train.time_budget={budget or MODELS[model][1]}", f"train.seed={seed}", "wandb.mode=disabled", "latest_link=null",
                            f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           check=True)
    summary = json.loads(summary_file.read_text())
    cache = re.search(r"tokens in (\S+)", (out / f"{run_dir.name}.log").read_text()).group(1)
    train_bytes = json.loads((Path(cache) / "manifest.json").read_text())["splits"]["train"]["bytes"]
    return {"plays": int(folder.name.removeprefix("plays")), "train_bytes": train_bytes, "vocab_size": vocab,
            "seed": seed, "steps": summary["steps"], "tokens": summary["tokens"], "val_bpb": summary["val_bpb"], "run": run_dir.name}


def main() -> None:
    parser = ascii_numbers(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plays", type=int, nargs="+", default=[2, 8, 38], help="subset sizes, in plays")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--model", choices=MODELS, default="quick")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--budget", help="train.time_budget (default: the model's, 2m quick, 5m default)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each on cores / jobs threads")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    subsets = write_subsets(args.out, args.plays)
    points = [(folder, vocab, seed) for folder in subsets.values() for vocab in args.vocabs for seed in args.seeds]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    budget = args.budget or MODELS[args.model][1]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda point: train(*point, args.out, args.model, budget, threads), points))
    print("| plays | train split MB | vocab | seed | steps | tokens (M) | val bpb |\n|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['plays']} | {row['train_bytes'] / 1e6:.2f} | {row['vocab_size']} | {row['seed']} "
              f"| {row['steps']:,} | {row['tokens'] / 1e6:.2f} | {row['val_bpb']:.4f} |")
    if args.json:
        made = {row["run"] for row in rows}
        kept = [row for row in json.loads(args.json.read_text())["rows"] if row["run"] not in made] \
            if args.json.exists() else []
        write_json(args.json, {"model": args.model, "budget": budget, "jobs": args.jobs, "threads": threads,
                               "rows": kept + rows})


if __name__ == "__main__":
    main()
