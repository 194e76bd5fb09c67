"""What a run reports, on disk and to W&B: one Tracker, so both always get the same numbers (its evals and
samples go to the screen too, and its last line says how the run ended).

    run_dir/metrics.jsonl   one JSON object per logged step, appended and flushed line by line
    run_dir/summary.json    num_params, kv_cache_bytes_per_token, vocab_size, name from the start;
                            the final metrics and stop_reason added at the end; tokens_per_s and first_step_s
                            are the last session's, which started at session_start_step (0 unless resumed)
    run_dir/config.yaml     the resolved settings, written whole or not at all (what a resume takes its settings from)
    run_dir/wandb/          the W&B run (offline runs: wandb/offline-run-*, for `wandb sync`), or under wandb.dir

W&B mode (wandb.mode): online, offline or disabled. Left null it is $WANDB_MODE if set, else online
when a W&B login is present ($WANDB_API_KEY or a netrc entry for the W&B host), else offline, so a
machine without an account never blocks on a login prompt.
"""
import json
import netrc
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from errors import ConfigError
from settings import CONFIG_DIR
from storage.files import atomic_symlink, atomic_write, write_json, writing
from training.budget import overrun_notice

WANDB_MODES = ("online", "offline", "disabled")
SESSION_KEYS = ("tokens_per_s", "first_step_s", "session_start_step")  # summary.json's figures of the last session


def wandb_mode(setting: str | None) -> str:
    if setting is not None and setting not in WANDB_MODES:
        raise ConfigError(f"wandb.mode={setting!r} must be one of {', '.join(WANDB_MODES)} (or null: automatic)")
    return setting or os.environ.get("WANDB_MODE") or ("online" if has_wandb_login() else "offline")


def has_wandb_login() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def default_run_name(choices: dict, task: str | None = None) -> str:
    """The synthetic task it learns (data.task, if any), the preset, then every component group chosen differently
    from the preset's own defaults, e.g. `llama_tiny-norm=layernorm-ffn=relu` or `mqar-llama_tiny-position=none`,
    whatever the experiment (+experiment=quick shortens a run, not its model) (choices: Hydra's group -> option of
    this run)."""
    preset = choices["model"]
    preset_defaults = OmegaConf.load(CONFIG_DIR / "model" / f"{preset}.yaml").get("defaults", [])
    switched = []
    for entry in preset_defaults:  # entries look like {"override /norm": "rmsnorm"}
        for key, option in entry.items():
            group = key.removeprefix("override /")
            if choices.get(group) != option:
                switched.append(f"{group}={choices.get(group)}")
    return "-".join([*([task] if task else []), preset, *switched])


def keep_metrics_up_to(path: Path, step: int) -> dict:
    """On resume: drop the lines logged after the checkpoint's step (and a half-written last line),
    since the resumed run logs those steps again. Returns the last line kept ({} where none is)."""
    if not path.exists():
        return {}
    kept, last = [], {}
    for line in path.read_text().splitlines():
        try:
            if (record := json.loads(line))["step"] <= step:
                kept.append(line + "\n")
                last = record
        except (json.JSONDecodeError, KeyError, TypeError):
            break
    atomic_write(path, lambda f: f.write("".join(kept).encode()))
    return last


def read_summary(run_dir: Path) -> dict:
    """A run dir's summary.json, {} where it has none that reads as one."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def start_tracking(cfg: DictConfig, run_dir: Path, mode: str, name: str, progress, resumed: bool, model,
                   data, eval_tokens: int) -> "Tracker":
    """Writes the run's resolved config.yaml, with its name (what a resume takes its settings from), opens its
    metrics, summary and W&B run, and points cfg.latest_link at the run dir (a multirun's jobs leave it where it
    was: training/multirun.py runs them with latest_link=null). config.yaml is replaced in one rename: a resume
    that fails to write it (a full disk) leaves the previous one, which agrees with the checkpoint, and the same
    train.resume=true works once there is room."""
    cfg.wandb.name = name
    config_file = run_dir / "config.yaml"
    with writing(config_file):
        atomic_write(config_file, lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True).encode()))
    # a multirun's runs log under one W&B dir, the sweep's (wandb.dir): `wandb leet <sweep dir>/wandb` shows them
    wandb_dir = Path(cfg.wandb.dir) if cfg.wandb.dir else run_dir
    tracker = Tracker(run_dir, wandb_dir, cfg, mode, name, cfg.wandb.group, progress.wandb_id,
                      summary={"num_params": model.num_params(), "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(),
                               "vocab_size": model.cfg.vocab_size, "name": name, "eval_tokens": eval_tokens,
                               "unigram_val_bpb": data.unigram_val_bpb},
                      resume_step=progress.step if resumed else None)
    if cfg.latest_link:
        atomic_symlink(Path(cfg.latest_link).expanduser(), run_dir)
    return tracker


BAR = "{l_bar}{bar:20}| "  # the share of the run done; the text after it is the step's (Throughput.add)


def progress_bar(name: str, disable: bool) -> tqdm:
    """The run's one bar: its n is the share of the run done (of 1), drawn by Throughput.add after each step."""
    return tqdm(total=1, desc=name, disable=disable, bar_format=BAR)


class Throughput:
    """Training tokens per second: of the session (summary.json), of the steps since the last logged line
    (metrics.jsonl) and of one step (the progress bar, drawn here with what is left of the run and each step's
    loss). The first step's time is kept apart: with train.compile=true it is the compilation."""

    def __init__(self, tokens_per_step: int, start_step: int, bar: tqdm):
        self.tokens_per_step, self.bar = tokens_per_step, bar
        self.start_step = start_step  # where this session's steps start: a resumed run's at its checkpoint
        self.steps, self.seconds = 0, 0.0
        self.window_steps, self.window_seconds = 0, 0.0
        self.first_step_s = None

    def add(self, step_s: float, loss: float, standing: tuple[float, str]) -> None:
        """One step's time and loss; standing: the share of the run done and what is left (Horizon.standing)."""
        self.first_step_s = self.first_step_s or step_s
        self.steps, self.seconds = self.steps + 1, self.seconds + step_s
        self.window_steps, self.window_seconds = self.window_steps + 1, self.window_seconds + step_s
        self.bar.n, left = standing
        # the text goes into the format itself: tqdm's postfix would start it with a comma
        self.bar.bar_format = BAR + f"{left}, loss={loss:.3f}, tok_s={self.tokens_per_step / step_s:,.0f}"
        self.bar.refresh()

    def window_rate(self) -> float:
        """Since the last call."""
        rate = self.window_steps * self.tokens_per_step / self.window_seconds
        self.window_steps, self.window_seconds = 0, 0.0
        return rate

    @property
    def session_rate(self) -> float | None:
        return self.steps * self.tokens_per_step / self.seconds if self.seconds else None

    def summary(self) -> dict:
        """The session's rate and first step, from session_start_step on: the figures of a resumed run's last
        session, which a session that trained no step leaves as the one before it measured them."""
        return {"tokens_per_s": self.session_rate, "first_step_s": self.first_step_s,
                "session_start_step": self.start_step}


def end_of_run_line(name: str, progress, meter: Throughput, reference_tokens_per_s: float | None,
                    measured_for: str) -> str:
    """How much the run trained, to what val bpb (its last eval's), and its speed against the reference, which was
    measured for the model named measured_for (model.name: each preset sets its own): a time budget is wall-clock,
    so a busy or slower machine buys fewer steps with it."""
    bpb, acc = progress.last_val.get("val_bpb"), progress.last_val.get("val_acc")
    line = (f"{name}: done: " + (f"val bpb {bpb:.4f} after " if bpb is not None else "")
            + (f"val acc {acc:.3f} after " if acc is not None else "")
            + f"{progress.step:,} steps, {progress.tokens / 1e6:.2f} M tokens in {progress.elapsed_s:.1f} s of training")
    rate = meter.session_rate
    if rate is not None:
        line += f", {rate:,.0f} tokens/s"
        if reference_tokens_per_s:
            line += (f" ({rate / reference_tokens_per_s:.0%} of train.reference_tokens_per_s="
                     f"{reference_tokens_per_s:,.0f}, {measured_for}'s rate on an idle 2-core CPU machine)")
    return line


class Tracker:
    def __init__(self, run_dir: Path, wandb_dir: Path, cfg: DictConfig, mode: str, name: str, group: str | None,
                 wandb_id: str, summary: dict, resume_step: int | None):
        self.run_dir, self.name, self.summary = run_dir, name, summary
        self.reference_tokens_per_s, self.model_name = cfg.train.reference_tokens_per_s, cfg.model.name
        self.eval_tokens, self.sample_tokens = cfg.train.eval_tokens, cfg.train.sample_tokens  # what sizes the end
        # a resumed run's last session's throughput, kept where this session trains no step
        before = read_summary(run_dir) if resume_step is not None else {}
        self.session_before = {key: before[key] for key in SESSION_KEYS if before.get(key) is not None}
        write_json(run_dir / "summary.json", summary)
        metrics = run_dir / "metrics.jsonl"
        # the latest metrics line, the base of the final summary: a resumed run's last kept one until it logs
        self.last_record = keep_metrics_up_to(metrics, resume_step) if resume_step is not None else {}
        self.metrics = open(metrics, "a" if resume_step is not None else "w")
        self.wandb_run = None
        if mode != "disabled":
            import wandb  # imported only when used: it adds a second to start-up

            self.wandb_run = wandb.init(project=cfg.wandb.project, group=group, name=name, mode=mode,
                                        dir=wandb_dir, id=wandb_id, resume="allow",
                                        config=OmegaConf.to_container(cfg, resolve=True))
            self.wandb_run.summary.update(summary)
            # INCREMENTAL: each log appends the new rows instead of re-uploading the whole table
            self.samples = wandb.Table(columns=["step", "sample"], log_mode="INCREMENTAL")

    def log(self, record: dict) -> None:
        self.last_record = record
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def show_eval(self, step: int, val: dict) -> None:
        """On screen only: metrics.jsonl and W&B get the eval in the step's metrics line."""
        shown = [f"val loss {val['val_loss']:.4f}"] + [f"{label} {val[key]:{form}}" for key, label, form in (
            ("val_bpb", "bpb", ".4f"), ("val_ppl", "ppl", ".1f"), ("val_acc", "acc", ".3f")) if key in val]
        tqdm.write(f"step {step}: " + " | ".join(shown))

    def log_sample(self, step: int, text: str) -> None:
        tqdm.write(f"---- sample at step {step} ----\n{text}\n----")
        if self.wandb_run is not None:
            self.samples.add_data(step, text)
            self.wandb_run.log({"samples": self.samples}, step=step)

    def finish(self, progress, meter: Throughput, setup_s: float, horizon: dict, stop_reason: str,
               early_line: str | None) -> None:
        """summary.json's final metrics (the latest metrics line's, the best eval, the session's throughput, the
        horizon's summary, why the run stopped), then the run's last line: why it stopped early, or what it did,
        below the progress bar, closed first so that it is not redrawn under the line."""
        meter.bar.close()
        session = meter.summary() if meter.steps else meter.summary() | self.session_before
        final = {**self.last_record, **progress.last_val, "best_val_loss": progress.best_val_loss, **session,
                 "tokens": progress.tokens, "elapsed_s": progress.elapsed_s, "setup_s": setup_s, **horizon,
                 "stop_reason": stop_reason}
        self.summary.update(final)
        write_json(self.run_dir / "summary.json", self.summary)
        self.metrics.close()
        if self.wandb_run is not None:
            # the last step's history row goes out first: flushed at finish() it would overwrite these keys (elapsed_s,
            # tokens_per_s, budget_fraction) in W&B's summary with their values at that step
            self.wandb_run.log({}, commit=True)
            self.wandb_run.summary.update(final)
            self.wandb_run.finish()
        print(early_line or end_of_run_line(self.name, progress, meter, self.reference_tokens_per_s, self.model_name),
              file=sys.stderr)
        if "over_budget_s" in horizon:
            print(overrun_notice(horizon, self.eval_tokens, self.sample_tokens), file=sys.stderr)
