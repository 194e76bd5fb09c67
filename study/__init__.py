"""Studies of training runs: reading run dirs and grouping them into named variants, compare.py's tables and plots,
learning-rate lines (Wortsman et al. 2023), and launching a study's runs as Hydra multiruns (sweep.py,
scripts/equal_time.py, scripts/long_context.py, scripts/window_lengths.py)."""
