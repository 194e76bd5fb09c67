"""Train a nanollama model. Settings: configs/config.yaml (train.*, wandb.*, model.*, data.*).

    python train.py                                        # llama_tiny on Shakespeare, CPU, ~10 minutes
    python train.py norm=layernorm wandb.group=norms       # one component switched back to 2017
    python train.py hydra.run.dir=outputs/run1 train.resume=true train.max_steps=600
    torchrun --nproc_per_node=4 train.py train.batch_size=64

Outputs go to the Hydra run dir: ckpt/ (weights, model config, tokenizer, train_state.pt),
metrics.jsonl, config.yaml (resolved), summary.json and wandb/.
Exit codes: 0 done; 1 the loss went NaN/inf; 2 a bad setting, data or checkpoint (one `error:`
line); 130/143 stopped by SIGINT/SIGTERM after saving a checkpoint. In a multirun (-m) only a signal
ends the sweep.
"""
import math
import os
import signal
import sys
import time
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

from data import DataError, eval_batches, get_batch, prepare_data
from generation.engine import Engine
from model.config import ConfigError
from model.transformer import Transformer
from storage.checkpoint import CheckpointError
from storage.files import atomic_symlink
from training.budget import TimeBudget, parse_duration
from training.config import autocast_for, check_train_config, model_config, resolve_device
from training.diagnostics import layer_stats
from training.distributed import (agree_on_step, from_master, master_first, setup_distributed,
                                  teardown_distributed, world_size)
from training.evaluate import evaluate, next_token_loss, unigram_bpb
from training.optim import lr_at, lr_at_fraction, make_optimizer
from training.run_lock import run_dir_lock
from training.settings import check_command_line
from training.signals import StopRequest
from training.state import (Progress, checkpoint_to_resume, resume_training, save_training_checkpoint,
                            step_generator)
from training.tracking import Tracker, default_run_name, wandb_mode


@hydra.main(config_path="configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        with ExitStack() as held:  # what the run holds until it ends: the run dir's lock, the progress bar
            exit_code = train(cfg, held)
    except (ConfigError, DataError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        exit_code = 2
    except OSError as e:  # a full disk, a read-only or forbidden path: the previous checkpoint is intact
        print(f"error: cannot write {e.filename or HydraConfig.get().runtime.output_dir}: {e.strerror or e}",
              file=sys.stderr)
        exit_code = 2
    # In a multirun, a run that diverged or was misconfigured is recorded (its summary.json says why)
    # and the sweep goes on; a signal stops the sweep too. No sys.exit(0): it would end a multirun.
    if exit_code and (HydraConfig.get().mode == RunMode.RUN or exit_code > 2):
        sys.exit(exit_code)


def train(cfg: DictConfig, held: ExitStack) -> int:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    tcfg = cfg.train

    # -------- settings: everything that can be checked without data fails here, in a second
    setup_clock = time.perf_counter()
    model_cfg = model_config(cfg)
    micro_batch, accum_steps = check_train_config(tcfg, world_size())
    budget_s = parse_duration(tcfg.time_budget)
    max_steps = tcfg.max_steps or math.inf  # null only with a time budget
    device = resolve_device(tcfg.device)
    tracking_mode = wandb_mode(cfg.wandb.mode)

    # -------- the run dir is this run's alone from here on (DDP's other ranks write nothing of their own there)
    if int(os.environ.get("RANK", 0)) == 0:
        held.enter_context(run_dir_lock(run_dir))
        if cfg.latest_link:
            atomic_symlink(Path(cfg.latest_link).expanduser(), run_dir)
    resume_from = checkpoint_to_resume(run_dir, tcfg.resume)
    T = model_cfg.context_length

    # -------- processes, data, model, optimizer
    ddp = setup_distributed(device)
    with master_first(ddp):  # rank 0 builds the tokenizer and token caches; the others then load them
        data = prepare_data(cfg.data, T, micro_batch)
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
    # softmax over the vocabulary is fused too (1.08x compiling the model alone; docs/performance.md)
    loss_of = torch.compile(next_token_loss) if tcfg.compile else next_token_loss
    autocast = autocast_for(ddp.device)  # bf16 autocast on CUDA, fp32 on CPU

    name = cfg.wandb.name or default_run_name(hydra_cfg.runtime.choices)
    if ddp.master:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        group = cfg.wandb.group or (hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else None)
        tracker = Tracker(run_dir, cfg, tracking_mode, name, group, progress.wandb_id,
                          summary={"num_params": raw_model.num_params(),
                                   "kv_cache_bytes_per_token": raw_model.kv_cache_bytes_per_token(),
                                   "vocab_size": model_cfg.vocab_size, "name": name,
                                   "unigram_val_bpb": unigram_bpb(data.train, data.val, model_cfg.vocab_size,
                                                                  data.bytes_per_token["val"])},
                          resume_step=last_saved_step)
        val_batches = eval_batches(data.val, micro_batch, T, tcfg.eval_batches, ddp.device)
        engine = Engine(raw_model, data.tokenizer)
        print(f"{name}: {raw_model.num_params() / 1e6:.2f} M parameters | {tcfg.batch_size} sequences x {T} tokens "
              f"per step = {ddp.world_size} processes x {accum_steps} accumulation x {micro_batch} | "
              f"{ddp.device} | {run_dir}" + (f" | time budget {budget_s:g} s" if budget_s else "")
              + (f" | resumed at step {progress.step}" if resume_from else ""))

    # -------- the loop: one optimizer step per iteration
    stop = StopRequest()
    tokens_per_step = tcfg.batch_size * T
    stop_reason, exit_code, last_record = "completed", 0, {}  # stop_reason: completed, diverged, a signal
    session_tokens, session_s = 0, 0.0  # this process's training, for the mean tokens/s in summary.json
    window_tokens, window_s = 0, 0.0  # since the last logged step, for tokens_per_s in metrics.jsonl
    # A time budget counts the training loop's wall time (training/budget.py); the eval, sample and
    # checkpoint after the last step are reserved inside it.
    budget = (TimeBudget(budget_s, tcfg.sample_tokens, tcfg.eval_batches / accum_steps / 2, raw_model.num_params())
              if budget_s else None)
    setup_s, first_step_s = time.perf_counter() - setup_clock, None
    elapsed_before, clock = progress.elapsed_s, time.perf_counter()
    # closed with the run however it ends, so that an `error:` line printed after it stays the last line
    bar = held.enter_context(tqdm(total=tcfg.max_steps, initial=progress.step, disable=not ddp.master, unit="step",
                                  desc=name))
    while progress.step < max_steps:
        # the step after which another would not fit in the budget is the last, and runs at the floor
        last = progress.step + 1 == max_steps or (budget is not None and budget.is_last_step(progress.elapsed_s))
        if budget is not None and first_step_s is None and from_master(ddp, [budget.spent(progress.elapsed_s)])[0]:
            break  # resumed with its budget spent
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
        train_loss, signum = agree_on_step(ddp, loss_sum / accum_steps, stop.signum)
        if budget is None:
            lr = lr_at(progress.step, tcfg)
        else:  # by rank 0's clock, so that every process takes the same step
            done, step = (1.0, 0.0) if last else budget.fraction(progress.elapsed_s, time.perf_counter() - step_start)
            lr, last = from_master(ddp, [lr_at_fraction(done, step, tcfg.warmup_fraction, tcfg), float(last)])
            last = bool(last)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip or math.inf).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # NaN guard, before anything is saved: a NaN/inf loss or gradient, or weights that AdamW pushed
        # to inf (its decay term with a huge lr) end the run and leave the last checkpoint as it is.
        # The weights are the same on every process, so all of them reach the same verdict.
        weights_finite = torch.stack([p.isfinite().all() for p in raw_model.parameters()]).all().item()
        if not (math.isfinite(train_loss) and math.isfinite(grad_norm) and weights_finite):
            stop_reason, exit_code = f"diverged at step {progress.step + 1}", 1
            if ddp.master:
                kept = (f"the last good checkpoint is {run_dir / 'ckpt'} (step {last_saved_step})"
                        if last_saved_step is not None else "no checkpoint had been saved yet")
                tqdm.write(f"error: training diverged at step {progress.step + 1} (train loss {train_loss:.4g}, "
                           f"grad norm {grad_norm:.4g}, weights {'finite' if weights_finite else 'not finite'}); "
                           f"try a lower train.lr={tcfg.lr}. Stopped; {kept}", file=sys.stderr)
            break

        progress.step += 1
        progress.tokens += tokens_per_step
        step_s = time.perf_counter() - step_start
        first_step_s = first_step_s or step_s  # with train.compile=true, the compile
        session_tokens, session_s = session_tokens + tokens_per_step, session_s + step_s
        window_tokens, window_s = window_tokens + tokens_per_step, window_s + step_s
        progress.elapsed_s = elapsed_before + time.perf_counter() - clock
        if budget is not None:
            budget.record("step", step_s)
        if signum:
            stop_reason, exit_code = signal.Signals(signum).name, 128 + signum
        if not ddp.master:
            if signum or last:
                break
            continue

        # -------- rank 0: progress bar, eval, metrics, samples, checkpoints
        bar.update()
        bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_step / step_s:,.0f}")
        val = {}
        if progress.step % tcfg.eval_interval == 0 or last:
            started = time.perf_counter()
            val = evaluate(raw_model, val_batches, autocast, data.bytes_per_token["val"])
            if tcfg.diagnostics:  # per-layer stats on the first val batch (training/diagnostics.py)
                val |= layer_stats(raw_model, *val_batches[0])
            progress.last_val = val
            progress.best_val_loss = min(val["val_loss"], progress.best_val_loss or math.inf)
            tqdm.write(f"step {progress.step}: val loss {val['val_loss']:.4f} | bpb {val['val_bpb']:.4f} | "
                       f"ppl {val['val_ppl']:.1f}")
            if budget is not None:
                budget.record("eval", time.perf_counter() - started)
        if val or last or signum or progress.step % tcfg.log_interval == 0:
            last_record = {"step": progress.step, "tokens": progress.tokens, "train_loss": train_loss, "lr": lr,
                           "grad_norm": grad_norm, "tokens_per_s": window_tokens / window_s,
                           "elapsed_s": progress.elapsed_s, **val}
            if budget is not None:
                last_record["budget_fraction"] = progress.elapsed_s / budget.seconds
            tracker.log(last_record)
            window_tokens, window_s = 0, 0.0
        if progress.step % tcfg.sample_interval == 0 or last:
            started = time.perf_counter()
            text = engine.complete(tcfg.sample_prompt, tcfg.sample_tokens, tcfg.sample_temperature, seed=tcfg.seed)
            if budget is not None:
                budget.record("sample", time.perf_counter() - started)
            tqdm.write(f"---- sample at step {progress.step} ----\n{text}\n----")
            tracker.log_sample(progress.step, text)
        if progress.step % tcfg.ckpt_interval == 0 or last or signum:
            started = time.perf_counter()
            progress.elapsed_s = elapsed_before + time.perf_counter() - clock  # the eval and sample count
            save_training_checkpoint(run_dir / "ckpt", raw_model, data.tokenizer.model_file, optimizer, progress)
            last_saved_step = progress.step
            if budget is not None:
                budget.record("ckpt", time.perf_counter() - started)
        progress.elapsed_s = elapsed_before + time.perf_counter() - clock
        if signum:
            tqdm.write(f"{stop_reason}: stopped after step {progress.step} and saved {run_dir / 'ckpt'}; continue with "
                       f"python train.py hydra.run.dir={run_dir} train.resume=true", file=sys.stderr)
            break
        if last:
            break

    if ddp.master:
        # the final metrics: the last logged line, the latest eval, and this session's mean tokens/s
        budget_record = {"time_budget_s": budget.seconds, "budget_fraction": progress.elapsed_s / budget.seconds,
                         "steps": progress.step} if budget else {}
        if stop_reason == "completed":  # which limit ended it
            budget_record["ended_by"] = "max_steps" if progress.step >= max_steps else "time_budget"
        tracker.finish({**last_record, **progress.last_val, "best_val_loss": progress.best_val_loss,
                        "tokens_per_s": session_tokens / session_s if session_s else None,
                        "elapsed_s": progress.elapsed_s, "setup_s": setup_s, "first_step_s": first_step_s,
                        **budget_record, "stop_reason": stop_reason})
    teardown_distributed(ddp)
    return exit_code


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
