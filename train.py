"""Train a nanollama model. Settings: configs/config.yaml (train.*, wandb.*, model.*, data.*).

    python train.py                                        # llama_tiny on Shakespeare, 5 minutes of CPU
    python train.py norm=layernorm wandb.group=norms       # one component switched back to 2017
    python train.py train.max_steps=600                    # 600 steps (the schedule over them), unless 5 minutes end first
    python train.py hydra.run.dir=outputs/run1 train.resume=true
    python train.py train.init_from=outputs/run1 model.context_length=512 model.rope_scaling=yarn model.rope_factor=4
    python train.py -m train.lr=1e-3,3e-3                  # a multirun: one dir per job (training/multirun.py)
    torchrun --nproc_per_node=4 train.py train.batch_size=64

train() reads top-down: the settings, the data, the model and optimizer, the loop (each step's lr, forward and
backward, update, metrics, eval, sample, checkpoint), the summary; its helpers live in training/.
Outputs go to the Hydra run dir: ckpt/ (weights, model config, tokenizer, train_state.pt),
metrics.jsonl, config.yaml (resolved), summary.json and wandb/.
Exit codes: 0 done (a finished run run again says so and writes nothing); 1 the loss went NaN/inf; 2 a bad
setting, data or checkpoint, or a lost DDP process (one `error:` line); 130/143 stopped by SIGINT/SIGTERM after
saving a checkpoint. In a multirun (-m) each job trains in a process of its own (training/multirun.py): a job that
failed or was killed makes the command exit 1 at its end; a signal to the command stops every job, each saving its
checkpoint, and the same command resumes the unfinished ones.
"""
import math
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from cli import run_command
from data import prepare_data
from errors import UsageError
from generation.engine import Engine
from model.transformer import Transformer
from settings import check_command_line
from training.config import autocast_for, check_train_config, eval_window_count, model_config, resolve_device
from training.diagnostics import layer_stats
from training.distributed import (data_parallel, from_master, master_first, setup_distributed, summed_over_processes,
                                  teardown_distributed, world_size)
from training.endings import RunEnded, process_lost, stop_if_diverged, stop_if_signalled
from training.evaluate import evaluate, next_token_loss
from training.horizon import Clock, Horizon
from training.multirun import run_job
from training.optim import make_optimizer, set_lr
from training.run_lock import run_dir_lock
from training.signals import StopRequest
from training.state import RunCheckpoint, continue_settings, run_start, step_generator, wants_resume
from training.step import accumulate_gradients
from training.tracking import Throughput, default_run_name, progress_bar, start_tracking, wandb_mode


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int | None:
    if HydraConfig.get().mode == RunMode.MULTIRUN:  # a job of a multirun: the run, in a process of its own
        return run_job(cfg, run)
    if exit_code := run(cfg):
        sys.exit(exit_code)


def run(cfg: DictConfig) -> int:
    """The run's exit code; a bad setting, data or checkpoint, and a write that fails, are one `error:` line."""
    return run_command(lambda: run_in_its_dir(cfg, Path(HydraConfig.get().runtime.output_dir)))


def run_in_its_dir(cfg: DictConfig, run_dir: Path) -> int:
    try:
        cfg.train.resume = wants_resume(cfg.train.resume, run_dir)
        if cfg.train.resume and (complete := continue_settings(cfg, run_dir)):  # read only: the dir is left as it is
            print(complete, file=sys.stderr)
            return 0
        with ExitStack() as held:  # what the run holds until it ends: the run dir's lock, the progress bar
            return train(cfg, held)
    except OSError as e:  # a full disk, a read-only or forbidden path: the previous checkpoint is intact
        raise UsageError(f"cannot write {e.filename or run_dir}: {e.strerror or e}") from None


def train(cfg: DictConfig, held: ExitStack) -> int:
    run_dir, tcfg = Path(HydraConfig.get().runtime.output_dir), cfg.train
    stop = StopRequest()  # from here on a signal stops the run at a step (before the first, if it comes that early)
    if int(os.environ.get("RANK", 0)) == 0:  # the run dir is this run's alone (DDP's other ranks write nothing there)
        held.enter_context(run_dir_lock(run_dir))  # a run refused before it writes leaves no dir (run_lock.py)
    start = run_start(cfg, run_dir)  # the checkpoint it resumes, or the run whose weights (and settings) it starts from

    # -------- settings: everything that can be checked without data fails here, in a second
    setup_clock = time.perf_counter()
    T = model_config(cfg).context_length
    micro_batch, accum_steps = check_train_config(tcfg, world_size())
    eval_windows = eval_window_count(tcfg, T)
    device = resolve_device(tcfg.device)
    if tcfg.threads is not None:  # N jobs of a multirun on one machine share its cores
        torch.set_num_threads(tcfg.threads)
    tracking_mode = wandb_mode(cfg.wandb.mode)

    # -------- data: rank 0 builds the tokenizer and token caches; the other processes then load them
    ddp = setup_distributed(device)
    with master_first(ddp):
        data = prepare_data(cfg.data, T, micro_batch)  # a corpus's token streams, or a synthetic task's sets

    # -------- model and optimizer, or those of the checkpoint it resumes
    torch.manual_seed(tcfg.seed + ddp.rank)  # DDP copies rank 0's initial weights; the offset varies dropout
    raw_model = Transformer(model_config(cfg, data.tokenizer.vocab_size)).to(ddp.device)  # vocab_size=null: the rule's
    optimizer = make_optimizer(raw_model, tcfg)
    progress = start.load(raw_model, data.tokenizer.model_file, optimizer)
    checkpoint = RunCheckpoint(run_dir, raw_model, data.tokenizer.model_file, optimizer, progress, start.resumed)
    model = data_parallel(ddp, raw_model)
    # train.compile=true compiles the forward and the cross-entropy in one graph: the vocabulary's softmax fuses too
    loss_of = torch.compile(next_token_loss) if tcfg.compile else next_token_loss
    autocast = autocast_for(ddp.device)  # bf16 autocast on CUDA, fp32 on CPU
    horizon = Horizon.of(tcfg, eval_sequences=eval_windows * ddp.world_size, num_params=raw_model.num_params())

    name = cfg.wandb.name or default_run_name(HydraConfig.get().runtime.choices, cfg.data.task)
    if ddp.master:  # the run has started: its files are written and outputs/latest points at it
        val_batches = data.eval_batches(micro_batch, eval_windows, ddp.device)
        tracker = start_tracking(cfg, run_dir, tracking_mode, name, progress, start.resumed, raw_model, data,
                                 eval_tokens=sum(y.numel() for _, y, _ in val_batches))
        engine = Engine(raw_model, data.tokenizer)
        print(f"{name}: {raw_model.num_params() / 1e6:.2f} M parameters | {tcfg.batch_size} sequences x {T} tokens "
              f"per step = {ddp.world_size} processes x {accum_steps} accumulation x {micro_batch} | "
              f"{ddp.device} | {run_dir}{start.describe(progress)}\n{name}: {horizon.describe()}")

    # -------- the loop: one optimizer step per iteration, until the horizon or an early end (training/endings.py)
    meter = Throughput(tcfg.batch_size * T, progress.step,  # rank 0 draws the bar
                       held.enter_context(progress_bar(name, disable=not ddp.master)))
    setup_s, clock = time.perf_counter() - setup_clock, Clock(progress.elapsed_s)  # the training time starts
    ending = RunEnded("completed", 0)
    try:
        spent = from_master(ddp, [horizon.spent(progress.step, progress.elapsed_s)])[0]
        while not spent:
            started = progress.elapsed_s = clock()  # once a step: the previous one's eval, sample and checkpoint count
            stop_if_signalled(ddp, stop.signum, progress.step, run_dir)
            generator = step_generator(tcfg.seed, ddp.rank, progress.step)
            batches = (data.train_batch(micro_batch, generator, ddp.device) for _ in range(accum_steps))
            train_loss, aux_losses = accumulate_gradients(model, raw_model, loss_of, batches, accum_steps, ddp,
                                                          autocast)
            # by rank 0's clock, so that every process takes the same lr and stops at the same step
            lr, last = from_master(ddp, horizon.plan(progress.step, started, clock() - started, tcfg))
            set_lr(optimizer, lr)
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip or math.inf).item()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            raw_model.after_optimizer_step(lambda counts: summed_over_processes(ddp, counts))  # e.g. an MoE's bias
            stop_if_diverged(train_loss, grad_norm, raw_model, progress.step + 1, tcfg.lr, checkpoint)
            step_s = clock() - started
            progress.advance(tcfg.batch_size * T, elapsed_s=started + step_s)
            meter.add(step_s, train_loss, horizon.standing(progress.step, progress.elapsed_s))
            horizon.record("step", step_s)
            if ddp.master:  # -------- rank 0: eval, metrics, samples, checkpoints
                val = {}
                if horizon.evaluates(progress.step, tcfg.eval_interval) or last:
                    with horizon.timed("eval"):  # train.diagnostics: per-layer stats on the first val batch too
                        val = evaluate(raw_model, val_batches, autocast, data.bytes_per_token.get("val"))
                        val |= data.task_metrics(val, raw_model.num_params()) | (
                            layer_stats(raw_model, *val_batches[0][:2]) if tcfg.diagnostics else {})
                    tracker.show_eval(progress.step, progress.record_eval(val))
                if val or last or progress.step % tcfg.log_interval == 0:
                    tracker.log({"step": progress.step, "tokens": progress.tokens, "train_loss": train_loss, "lr": lr,
                                 "grad_norm": grad_norm, **aux_losses, "tokens_per_s": meter.window_rate(),
                                 "elapsed_s": progress.elapsed_s, **val, **horizon.budget_fraction(progress.elapsed_s)})
                if horizon.samples(progress.step, tcfg.sample_interval, evaluated=bool(val)) or last:
                    with horizon.timed("sample"):
                        text = engine.complete(data.sample_prompt(tcfg.sample_prompt), tcfg.sample_tokens,
                                               tcfg.sample_temperature, seed=tcfg.seed)
                    tracker.log_sample(progress.step, text)
                if progress.step % tcfg.ckpt_interval == 0 or last:
                    with horizon.timed("ckpt"):
                        progress.elapsed_s = clock()  # the checkpoint keeps the time it is written at
                        checkpoint.save()
            if last:
                break
        progress.elapsed_s = clock()  # the last step's eval, sample and checkpoint count
    except RunEnded as early:
        ending = early
    except RuntimeError as e:  # a peer process died: its gradients never came, the weights are the last step's
        ending = process_lost(ddp, e, progress.step, run_dir)
    if ddp.master and ending.exit_code > 1 and checkpoint.step != progress.step:  # a signal or a lost process
        checkpoint.save()
    if ddp.master:
        tracker.finish(progress, meter, setup_s, horizon.summary(progress.step, progress.elapsed_s, ending.completed),
                       ending.reason, ending.line)
    if not ending.process_lost:  # after a lost process there is no process group left to leave
        teardown_distributed(ddp)
    return ending.exit_code


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
