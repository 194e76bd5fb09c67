"""compare.py's warnings that its rows are not like with like: lines trained at one shared learning rate, a machine
whose speed changed under the runs, runs of unequal lengths. Each is one line: `warning: what (the numbers): why it
matters; what to run instead`."""
import math

from omegaconf import OmegaConf

from settings import CONFIG_DIR, flatten
from study.runs import Run, Variant
from study.tables import equal_time_budget, extent
from study.variants import unexplained

EQUAL_TOKENS = "compare at equal tokens (train.max_steps, +experiment=ablation)"

# Seeds of one line train one model, so on an unchanged machine their tokens/s agree to within its jitter: highest
# over lowest 1.14 for 8 seeds of llama_quick's 60 steps, one at a time on the idle 2-core machine here (1.18-1.44
# for the tests' 0.1-second tiny runs), where one busy process beside a run cut it 3-7x. Twice sits above the
# jitter and below the load; a smaller change to budgeted runs still shows in their tokens (unequal_tokens_warning).
SPEED_SPREAD = 2.0
# A rate over less than a fifth of a second of steps is the timer's and the start's as much as the machine's: idle
# seeds of the tests' tiny model spread 1.52-1.97 over 4 steps (0.04 s), 1.17-1.22 over 60 (0.24 s)
MEASURED_S = 0.2
# what sets a token's work and the cores that do it: a run's rate over its preset's reference measures the machine
# only where these are the preset's own (the batch and the corpus move it too, but the lines compared share them)
SPEED_SETTINGS = ("model.", "train.threads", "train.compile")


def shared_lr_warning(variants: list[Variant]) -> str | None:
    """When more than one line has complete runs and they all trained at one train.lr, unless every line is a line of
    the ablation (its `variant` names configs/ablation/<it>.yaml) at the rate recorded there, the learning-rate
    study's best for it. One rate for all puts each line at its own distance from its best: the first ablation table
    did that and showed ReLU 0.18 bpb ahead of SwiGLU, where each line's own rate gives 0.035 (docs/ablation.md)."""
    trained = [v for v in variants if v.complete]
    lrs = {r.config.get("train", {}).get("lr") for v in trained for r in v.complete}
    if len(trained) < 2 or len(lrs) != 1 or None in lrs or all(map(at_recorded_rate, trained)):
        return None
    return (f"warning: at a shared lr ({lrs.pop():g}): the differences include each line's distance from its best lr; "
            f"compare at each line's own rate (python train.py -m +experiment=ablation ablation=..., or a train.lr "
            f"sweep of each line, which compare.py compares at each line's best)")


def at_recorded_rate(variant: Variant) -> bool:
    name = variant.complete[0].config.get("variant")
    recorded = CONFIG_DIR / "ablation" / f"{name}.yaml"
    if not isinstance(name, str) or not recorded.is_file():
        return False
    lr = OmegaConf.load(recorded).get("train", {}).get("lr")
    return lr is not None and all(math.isclose(r.config["train"]["lr"], lr) for r in variant.complete)


def speed_warning(lines: list[Variant]) -> str | None:
    """When tokens/s (each run's own, measured_rate) varied by more than SPEED_SPREAD (highest / lowest) where the
    lines do not explain it: between the seeds of one line (one model), or between lines in each run's rate over its
    preset's idle rate (train.reference_tokens_per_s), the machine's share of it, compared between the runs that
    trained their preset's own model (SPEED_SETTINGS): a switched component has a speed of its own that the
    preset's reference does not know."""
    changes = []
    for line in lines:
        rates = [rate for r in line.complete if (rate := measured_rate(r))]
        if len(rates) > 1 and max(rates) / min(rates) > SPEED_SPREAD:
            changes.append(f"{line.name}'s seeds at {min(rates):,.0f}-{max(rates):,.0f} tokens/s")
    referenced = [(line, reference) for line in lines if (reference := preset_rate(line))]
    shares = [rate / reference for line, reference in referenced for r in line.complete if (rate := measured_rate(r))]
    if len(referenced) > 1 and len(shares) > 1 and max(shares) / min(shares) > SPEED_SPREAD:
        changes.append(f"the presets' runs at {min(shares):.0%}-{max(shares):.0%} of their "
                       f"train.reference_tokens_per_s")
    if not changes:
        return None
    if any(r.summary.get("ended_by") == "time_budget" for line in lines for r in line.complete):
        effect = "a time budget bought each run the steps its share of the machine allowed; " + EQUAL_TOKENS
    else:
        effect = "the tokens/s column measures the load, not the lines (python bench.py measures them on an idle one)"
    return f"warning: the machine's speed changed during these runs ({'; '.join(changes)}): {effect}"


def measured_rate(run: Run) -> float | None:
    """summary.json's tokens/s, the last session's, where its steps took MEASURED_S or more, else None."""
    summary = run.summary
    if not summary.get("tokens_per_s") or not summary.get("steps"):
        return None
    session_tokens = summary["tokens"] * (summary["steps"] - summary.get("session_start_step", 0)) / summary["steps"]
    return summary["tokens_per_s"] if session_tokens / summary["tokens_per_s"] >= MEASURED_S else None


def preset_rate(line: Variant) -> float | None:
    """The line's train.reference_tokens_per_s where its runs trained its preset's own model (SPEED_SETTINGS as
    `model=<model.name>` composes them), else None."""
    if not line.complete:
        return None
    config = line.complete[0].config
    reference, preset = config.get("train", {}).get("reference_tokens_per_s"), config.get("model", {}).get("name")
    if not reference or not isinstance(preset, str) or not (CONFIG_DIR / "model" / f"{preset}.yaml").is_file():
        return None
    # model.vocab_size is the corpus's, set by train.py: config.yaml has none, so with_model_defaults' stands there
    speed = {key: value for key, value in flatten(config).items()
             if key.startswith(SPEED_SETTINGS) and key != "model.vocab_size"}
    return None if unexplained(speed, [f"model={preset}"]) else reference


def unequal_tokens_warning(runs: list[Run]) -> str | None:
    """When the complete runs trained different numbers of tokens: runs of other lengths, or budgeted runs on a
    slower or busier machine. Runs that one train.time_budget ended (an equal-wall-clock comparison) are meant to
    differ: a note says so instead."""
    tokens = {e[1] for e in map(extent, runs) if e}
    if len(tokens) < 2:
        return None
    if (budget := equal_time_budget(runs)) is not None:
        return (f"equal wall-clock: every run trained for train.time_budget={budget:g} s, so the tokens differ "
                f"({min(tokens):,}-{max(tokens):,}) by each variant's speed; the runs must have shared the machine "
                f"alike (one at a time) for the comparison to hold")
    return (f"warning: the runs trained unequal numbers of tokens ({min(tokens):,}-{max(tokens):,}): runs of other "
            f"lengths, or budgeted runs on a slower or busier machine (a budget is wall-clock), so each line's bpb is "
            f"partly its length; " + EQUAL_TOKENS)
