"""What every command shares: a parser whose bad flag is one `error: ...` line and exit 2, not argparse's usage
block, and the one place that turns input that cannot be used (UsageError) into that line."""
import argparse
import sys
from typing import Callable

from errors import UsageError
from parsing import decimal_number, signed_number


def integer(text: str) -> int:
    """An integer flag's type: ASCII digits, or a negative number, which the flag's own check refuses with its range."""
    if (number := signed_number(text)) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer written in ASCII digits")
    return number


def decimal(text: str) -> float:
    if (number := decimal_number(text)) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number written in ASCII digits")
    return number


def ascii_numbers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser, its type=int and type=float flags reading ASCII digits only (parsing.py: Python's own read any
    script's digits). The registry is argparse's hook for a type's converter, which argument groups share."""
    parser.register("type", int, integer)
    parser.register("type", float, decimal)
    return parser


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ascii_numbers(self)

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
