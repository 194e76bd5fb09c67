"""The scripts' command-line parser: a bad flag is one `error: ...` line and exit 2, not argparse's usage block."""
import argparse


class UsageError(Exception):
    """Bad command-line input; the script prints it as one `error: ...` line and exits 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)
