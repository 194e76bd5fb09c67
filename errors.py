"""The errors a user's input causes: a setting, a flag, a file or a directory that cannot be used as given.

Each message names the setting and its value. The scripts catch UsageError in one place (cli.run_command;
train.py's run()), which prints `error: <message>` as one line and exits 2; a subclass exists where a caller must
tell one kind apart.
Nothing here imports anything, so every layer (model/ included) can raise them.
"""


class UsageError(Exception):
    """Input that cannot be used as given; the message says which and why, in one line."""


class ConfigError(UsageError):
    """A setting (model.*, train.*, wandb.*, data.*) or a run dir that the run cannot start with."""
