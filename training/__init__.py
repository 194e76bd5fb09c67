"""The helpers that keep train.py a top-down read (the settings' schema and compose_config(): settings.py).

config.py       train.* range checks, gradient accumulation arithmetic, device and precision, the model config
optim.py        AdamW or Muon + AdamW (optim=muon): the parameter groups (which decay, which Muon takes), the lr schedule
muon.py         Muon: orthogonalised momentum for weight matrices, each matrix stacked in one weight on its own
evaluate.py     the next-token loss; val loss, perplexity and bits per byte
step.py         one step's forward and backward over its micro-batches: gradients, train_loss and the auxiliary losses
state.py        resumable checkpoints (train_state.pt) and the per-step batch generator
budget.py       train.time_budget: the duration, the reserve for the run's end (at most a quarter), the last step that fits
horizon.py      the limits that end a run (train.max_steps, train.time_budget): each step's lr, the last step
tracking.py     metrics.jsonl, summary.json and W&B, fed the same numbers
distributed.py  torchrun/DDP set-up and the per-step agreement between processes
signals.py      SIGINT/SIGTERM: stop after the current step, checkpoint, exit 130/143
endings.py      how a run ends: at its horizon, or early (a signal, a divergence, a lost process), each with its line
run_lock.py     one writer per run dir: an fcntl lock the OS releases when the process dies
diagnostics.py  train.diagnostics=true: per-layer stream/branch rms, position cosine, attention entropy, grad norms
"""
