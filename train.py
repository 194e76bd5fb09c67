"""Train a nanollama model. Settings: configs/config.yaml (train.*, wandb.*, model.*, data.*).

    python train.py                                        # llama_tiny on Shakespeare, 5 minutes of CPU
    python train.py norm=layernorm wandb.group=norms       # one component switched back to 2017
    python train.py train.max_steps=600                    # 600 steps (the schedule over them), unless 5 minutes end first
    python train.py hydra.run.dir=outputs/run1 train.resume=true
    python train.py -m train.lr=1e-3,3e-3                  # a multirun: one dir per job (training/multirun.py)
    torchrun --nproc_per_node=4 train.py train.batch_size=64

Outputs go to the Hydra run dir: ckpt/ (weights, model config, tokenizer, train_state.pt),
metrics.jsonl, config.yaml (resolved), summary.json and wandb/.
Exit codes: 0 done; 1 the loss went NaN/inf; 2 a bad setting, data or checkpoint, or a lost DDP process
(one `error:` line); 130/143 stopped by SIGINT/SIGTERM after saving a checkpoint. In a multirun (-m) only a
signal ends the sweep; a job that failed makes it exit 1 at its end.
"""
import math
import os
import signal
import sys
import time
import traceback
import uuid
from contextlib import ExitStack, nullcontext
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from data import eval_batches, get_batch, prepare_data
from errors import UsageError
from generation.engine import Engine
from model.transformer import Transformer
from settings import check_command_line
from storage.files import atomic_symlink
from training.budget import TimeBudget, parse_duration
from training.config import autocast_for, check_train_config, eval_window_count, model_config, resolve_device
from training.diagnostics import layer_stats
from training.distributed import (agree_on_signal, from_master, lost_a_process, lost_process_line, master_first,
                                  mean_over_processes, setup_distributed, teardown_distributed, world_size)
from training.evaluate import divergence, evaluate, next_token_loss
from training.horizon import Horizon
from training.optim import lr_at, make_optimizer
from training.run_lock import run_dir_lock
from training.signals import StopRequest
from training.state import (Progress, checkpoint_to_resume, resume_training, save_training_checkpoint,
                            step_generator)
from training.tracking import Throughput, default_run_name, end_of_run_line, start_tracking, wandb_mode


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    try:
        with ExitStack() as held:  # what the run holds until it ends: the run dir's lock, the progress bar
            exit_code = train(cfg, held)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        exit_code = 2
    except OSError as e:  # a full disk, a read-only or forbidden path: the previous checkpoint is intact
        print(f"error: cannot write {e.filename or HydraConfig.get().runtime.output_dir}: {e.strerror or e}",
              file=sys.stderr)
        exit_code = 2
    except Exception as e:  # a bug: a run alone shows its traceback; a multirun's job records it and goes on
        if HydraConfig.get().mode == RunMode.RUN:
            raise
        traceback.print_exc()
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        exit_code = 1
    # In a multirun the sweep goes on after a job that failed: training/multirun.py records its exit code
    # and fails the whole command at its end; a signal stops the sweep at once.
    if exit_code and (HydraConfig.get().mode == RunMode.RUN or exit_code > 2):
        sys.exit(exit_code)
    return exit_code


def train(cfg: DictConfig, held: ExitStack) -> int:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    tcfg = cfg.train

    # -------- settings: everything that can be checked without data fails here, in a second
    setup_clock = time.perf_counter()
    model_cfg = model_config(cfg)
    T = model_cfg.context_length
    micro_batch, accum_steps = check_train_config(tcfg, world_size())
    eval_windows = eval_window_count(tcfg, T)
    budget_s = parse_duration(tcfg.time_budget)
    device = resolve_device(tcfg.device)
    tracking_mode = wandb_mode(cfg.wandb.mode)

    # -------- the run dir is this run's alone from here on (DDP's other ranks write nothing of their own there)
    if int(os.environ.get("RANK", 0)) == 0:
        held.enter_context(run_dir_lock(run_dir))
    resume_from = checkpoint_to_resume(run_dir, tcfg.resume)

    # -------- processes, data, model, optimizer
    ddp = setup_distributed(device)
    with master_first(ddp):  # rank 0 builds the tokenizer and token caches; the others then load them
        data = prepare_data(cfg.data, T, micro_batch)
    model_cfg = model_config(cfg, data.tokenizer.vocab_size)  # data.vocab_size=null: the rule chose it
    torch.manual_seed(tcfg.seed + ddp.rank)  # DDP copies rank 0's initial weights; the offset varies dropout
    raw_model = Transformer(model_cfg).to(ddp.device)
    optimizer = make_optimizer(raw_model, tcfg)
    progress = Progress()
    if resume_from is not None:
        progress = resume_training(resume_from, raw_model, data.tokenizer.model_file, optimizer)
    progress.wandb_id = progress.wandb_id or uuid.uuid4().hex[:8]
    last_saved_step = progress.step if resume_from is not None else None
    model = raw_model
    if ddp.world_size > 1:
        model = DistributedDataParallel(model, device_ids=[ddp.device.index] if ddp.device.type == "cuda" else None)
    # train.compile=true compiles the loss: the forward and the cross-entropy in one graph, so that the
    # softmax over the vocabulary is fused too
    loss_of = torch.compile(next_token_loss) if tcfg.compile else next_token_loss
    autocast = autocast_for(ddp.device)  # bf16 autocast on CUDA, fp32 on CPU
    # An eval of eval_windows sequences costs about half a training step per batch_size / processes of them.
    budget = TimeBudget(budget_s, tcfg.sample_tokens, eval_windows * ddp.world_size / tcfg.batch_size / 2,
                        raw_model.num_params()) if budget_s else None
    horizon = Horizon(tcfg.max_steps, tcfg.lr_decay_steps, budget)

    name = cfg.wandb.name or default_run_name(hydra_cfg.runtime.choices)
    if ddp.master:  # the run has started: its files are written and outputs/latest points at it
        val_batches = eval_batches(data.val, micro_batch, T, eval_windows, ddp.device)
        tracker = start_tracking(cfg, run_dir, tracking_mode, name, progress, resume_from is not None, raw_model,
                                 data, eval_tokens=sum(y.numel() for _, y in val_batches))
        if cfg.latest_link:
            atomic_symlink(Path(cfg.latest_link).expanduser(), run_dir)
        engine = Engine(raw_model, data.tokenizer)
        print(f"{name}: {raw_model.num_params() / 1e6:.2f} M parameters | {tcfg.batch_size} sequences x {T} tokens "
              f"per step = {ddp.world_size} processes x {accum_steps} accumulation x {micro_batch} | "
              f"{ddp.device} | {run_dir}" + (f" | resumed at step {progress.step}" if resume_from else "")
              + f"\n{name}: {horizon.describe()}")

    # -------- the loop: one optimizer step per iteration
    stop = StopRequest()
    meter = Throughput(tcfg.batch_size * T)
    stop_reason, exit_code, last_record = "completed", 0, {}  # stop_reason: completed, diverged, a signal, a lost process
    final_line = None  # why the run ended early, printed last
    setup_s = time.perf_counter() - setup_clock
    elapsed_before, clock = progress.elapsed_s, time.perf_counter()

    def tick():  # the training time so far, over every session
        progress.elapsed_s = elapsed_before + time.perf_counter() - clock

    bar = held.enter_context(tqdm(total=tcfg.max_steps, initial=progress.step, disable=not ddp.master, unit="step",
                                  desc=name))
    try:
        spent = from_master(ddp, [horizon.spent(progress.step, progress.elapsed_s)])[0]
        while not spent:
            signum = agree_on_signal(ddp, stop.signum)
            if signum:  # between two steps: the last one's eval and checkpoint are done
                stop_reason, exit_code = signal.Signals(signum).name, 128 + signum
                final_line = (f"{stop_reason}: stopped after step {progress.step} and saved {run_dir / 'ckpt'}; "
                              f"continue with python train.py hydra.run.dir={run_dir} train.resume=true")
                break
            step_start = time.perf_counter()
            generator = step_generator(tcfg.seed, ddp.rank, progress.step)
            loss_sum = torch.zeros((), device=ddp.device)
            for micro in range(accum_steps):
                x, y = get_batch(data.train, micro_batch, T, generator, ddp.device)
                # DDP all-reduces gradients in backward; the micro-batches before the last skip it
                syncs = ddp.world_size == 1 or micro == accum_steps - 1
                with nullcontext() if syncs else model.no_sync():
                    with autocast:
                        loss = loss_of(model, x, y)
                    (loss / accum_steps).backward()
                loss_sum += loss.detach()
            train_loss = mean_over_processes(ddp, loss_sum / accum_steps)
            # by rank 0's clock, so that every process takes the same lr and stops at the same step
            last = horizon.is_last(progress.step, progress.elapsed_s)
            done, share = horizon.position(progress.step, progress.elapsed_s, time.perf_counter() - step_start)
            lr, last = from_master(ddp, [lr_at(done, share, tcfg), float(last)])
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip or math.inf).item()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            problem = divergence(train_loss, grad_norm, raw_model)  # before anything is saved
            if problem:
                stop_reason, exit_code = f"diverged at step {progress.step + 1}", 1
                kept = (f"the last good checkpoint is {run_dir / 'ckpt'} (step {last_saved_step})"
                        if last_saved_step is not None else "no checkpoint had been saved yet")
                final_line = (f"error: training diverged at step {progress.step + 1} ({problem}); try a lower "
                              f"train.lr={tcfg.lr}. Stopped; {kept}")
                break
            progress.step += 1
            progress.tokens += tcfg.batch_size * T
            step_s = time.perf_counter() - step_start
            meter.add(step_s)
            if budget is not None:
                budget.record("step", step_s)
            tick()
            if ddp.master:  # -------- rank 0: progress bar, eval, metrics, samples, checkpoints
                bar.update()
                bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{meter.step_rate(step_s):,.0f}")
                val = {}
                if progress.step % tcfg.eval_interval == 0 or last:
                    with horizon.timed("eval"):
                        val = evaluate(raw_model, val_batches, autocast, data.bytes_per_token["val"])
                        if tcfg.diagnostics:  # per-layer stats on the first val batch (training/diagnostics.py)
                            val |= layer_stats(raw_model, *val_batches[0])
                    progress.last_val = val
                    progress.best_val_loss = min(val["val_loss"], progress.best_val_loss or math.inf)
                    tqdm.write(f"step {progress.step}: val loss {val['val_loss']:.4f} | bpb {val['val_bpb']:.4f} | "
                               f"ppl {val['val_ppl']:.1f}")
                if val or last or progress.step % tcfg.log_interval == 0:
                    last_record = {"step": progress.step, "tokens": progress.tokens, "train_loss": train_loss,
                                   "lr": lr, "grad_norm": grad_norm, "tokens_per_s": meter.window_rate(),
                                   "elapsed_s": progress.elapsed_s, **val}
                    if budget is not None:
                        last_record["budget_fraction"] = progress.elapsed_s / budget.seconds
                    tracker.log(last_record)
                if progress.step % tcfg.sample_interval == 0 or last:
                    with horizon.timed("sample"):
                        text = engine.complete(tcfg.sample_prompt, tcfg.sample_tokens, tcfg.sample_temperature,
                                               seed=tcfg.seed)
                    tqdm.write(f"---- sample at step {progress.step} ----\n{text}\n----")
                    tracker.log_sample(progress.step, text)
                if progress.step % tcfg.ckpt_interval == 0 or last:
                    with horizon.timed("ckpt"):
                        tick()  # the eval and sample count
                        save_training_checkpoint(run_dir / "ckpt", raw_model, data.tokenizer.model_file, optimizer,
                                                 progress)
                    last_saved_step = progress.step
                tick()
            if last:
                break
    except RuntimeError as e:  # a peer process died: its gradients never came, the weights are the last step's
        if not lost_a_process(ddp, e):
            raise
        lost = True
        stop_reason, exit_code = f"lost a process after step {progress.step}", 2
        final_line = lost_process_line(ddp, e, progress.step, run_dir)
    else:
        lost = False
    if ddp.master and exit_code > 1 and last_saved_step != progress.step:  # a signal or a lost process
        save_training_checkpoint(run_dir / "ckpt", raw_model, data.tokenizer.model_file, optimizer, progress)
    bar.close()  # before the last line, so that the bar is not redrawn below it
    if ddp.master:
        tracker.finish({**last_record, **progress.last_val, "best_val_loss": progress.best_val_loss, **meter.summary(),
                        "tokens": progress.tokens, "elapsed_s": progress.elapsed_s, "setup_s": setup_s, **horizon.summary(progress.step, progress.elapsed_s, stop_reason == "completed"),
                        "stop_reason": stop_reason})
        print(final_line or end_of_run_line(name, progress, meter, tcfg.reference_tokens_per_s), file=sys.stderr)
    if not lost:  # after a lost process there is no process group left to leave
        teardown_distributed(ddp)
    return exit_code


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
