"""Numbers read from a setting's or a flag's text: ASCII decimal digits, as the documentation writes them.

Python reads more than that: int() and float() take any script's decimal digits (int('٣') is 3), signs, spaces
and underscores, and str.isdigit() is true of superscripts ('²') that int() then refuses with a traceback. So
model.window_pattern's N:1, evaluate.py's --lengths, train.time_budget and every numeric flag (cli.Parser) read
their numbers here, and each caller names its setting and value in one error line where a number is not one.
Nothing here imports anything but the standard library.
"""
import re

WHOLE = re.compile(r"[0-9]+")  # not \d: re's \d is any script's digit too
SIGNED = re.compile(r"-?[0-9]+")
# a float as a flag writes one: 0.8, .5, 1e-3, -2; inf and nan are read, and each flag's own range refuses them
DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|infinity|nan)",
                     re.IGNORECASE)


def whole_number(text: str) -> int | None:
    """ASCII decimal digits as an int (no sign, space or other script's digit), else None."""
    return int(text) if isinstance(text, str) and WHOLE.fullmatch(text) else None


def whole_numbers(text: str, separator: str = ",") -> list[int] | None:
    """`128,256,512` as [128, 256, 512]; None where any part is not whole_number's (an empty one included)."""
    numbers = [whole_number(part) for part in text.split(separator)] if isinstance(text, str) else [None]
    return None if None in numbers else numbers


def signed_number(text: str) -> int | None:
    """whole_number's, or its negative (-5), else None."""
    return int(text) if isinstance(text, str) and SIGNED.fullmatch(text) else None


def decimal_number(text: str) -> float | None:
    """A float written in ASCII (0.8, .5, 1e-3, -2, inf, nan), else None."""
    return float(text) if isinstance(text, str) and DECIMAL.fullmatch(text) else None
