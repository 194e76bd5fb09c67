"""The scripts' command-line parser: a bad flag is one `error: ...` line and exit 2, not argparse's usage block."""
import argparse

from errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)
