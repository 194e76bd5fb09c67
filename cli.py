"""What every command shares: a parser whose bad flag is one `error: ...` line and exit 2, not argparse's usage
block, and the one place that turns input that cannot be used (UsageError) into that line."""
import argparse
import sys
from typing import Callable

from errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def run_command(work: Callable[[], int | None]) -> int:
    """A command's exit status: what its work returns (0 for None), or 2 after one `error: <message>` line on
    stderr when the work raises a UsageError (a bad flag, setting or file, and a write that fails)."""
    try:
        return work() or 0
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
