"""The scripts' command-line parser: a bad flag is one `error: ...` line and exit 2, not argparse's usage block."""
import argparse

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


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # type=int and type=float read ASCII digits only (parsing.py: Python's own read any script's digits); the
        # registry is argparse's hook for a type's converter, which argument groups share
        self.register("type", int, integer)
        self.register("type", float, decimal)

    def error(self, message):
        raise UsageError(message)
