"""What every tvjax command line shares: argparse types that refuse a bad value up front.

Each is a `type=` for `ArgumentParser.add_argument`: it returns the parsed value or raises
`argparse.ArgumentTypeError`, which `Parser` turns into the one line
`PROG: error: argument --FLAG: MESSAGE (see PROG --help)` and exit status 2, so the flag is always
named. Numbers are finite (`nan` and `inf` parse as floats in Python: they are refused here).
Paths are checked before the work they would receive. Imports nothing beyond the standard
library, like `tvjax._extras`, so every layer (the main job, the gate, the pool commands) can use it.
"""

import argparse
import math
import os
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage error is one line on stderr (no usage block, which can run to
    many lines) and exit status `error_status` (2, argparse's; the gate's 2 is a verdict)."""

    def __init__(self, *args, error_status=2, **kwargs):
        super().__init__(*args, **kwargs)
        self.error_status = error_status

    def error(self, message):
        self.exit(self.error_status, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_values(self, action, arg_strings):
        # argparse drops a "--" value (`--eps=--`) and, for a one-value option, sets it to []
        # without calling its type: refuse it as the missing value it is.
        if action.nargs is None and action.option_strings and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, got '--'")
        return super()._get_values(action, arg_strings)


MAX_SEED = 2**63 - 1  # jax.random.key and numpy's SeedSequence both take [0, 2**63 - 1]


def _interval(low, high, low_open, high_open) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    if low is None:
        return f"{'<' if high_open else '<='} {high:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def _integers(low, high) -> str:
    if high is None:
        return f">= {low}"
    if low is None:
        return f"<= {high}"
    return f"in [{low}, {high}]"


def real(low=None, high=None, *, low_open=True, high_open=True):
    """A finite float between low and high (open ends by default; None: unbounded on that side)."""
    where = "a finite number" + ("" if low is None and high is None else " " + _interval(low, high, low_open, high_open))

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        outside = not math.isfinite(value) or (
            low is not None and (value <= low if low_open else value < low)) or (
            high is not None and (value >= high if high_open else value > high))
        if outside:
            raise argparse.ArgumentTypeError(f"expected {where}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def integer(low=None, high=None):
    """An integer in [low, high] (None: unbounded on that side)."""
    where = "an integer" + ("" if low is None and high is None else " " + _integers(low, high))

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {where}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {where}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


probability = real(0.0, 1.0)  # eps, delta, tau: in (0, 1)
positive = real(0.0)  # budgets, rates: > 0
nonnegative = real(0.0, low_open=False)  # sigma, temperature: >= 0
count = integer(1)  # sizes, rounds, permutations: >= 1
random_seed = integer(0, MAX_SEED)


def scorer_pair(text):
    """'A,B' -> ("A", "B"): two non-empty scorer names."""
    pair = tuple(text.split(","))
    if len(pair) != 2 or not all(pair):
        raise argparse.ArgumentTypeError(f"expected two scorer names 'A,B', got {text!r}")
    return pair


def _writable_folder(folder: Path, text: str) -> None:
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {str(folder)!r} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {str(folder)!r} is not writable")


def output_file(text):
    """A file to write: not a folder, in an existing writable folder (an existing file is replaced)."""
    path = Path(text).expanduser()
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    parent = path.parent
    if not parent.exists():
        raise argparse.ArgumentTypeError(f"{text!r}: the folder {str(parent)!r} does not exist")
    _writable_folder(parent, text)
    return text


def output_folder(text):
    """A folder to write into: an existing folder, or a new one under the nearest existing (writable) folder."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    _writable_folder(existing, text)
    return text
