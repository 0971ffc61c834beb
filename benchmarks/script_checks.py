"""Checks the analysis scripts under benchmarks/ share (a module they import, not a script): a bad
command-line value or report field is refused in one line that names it, exit status 2, never
clamped or passed on.

- one_line_errors: a script's ArgumentParser says a bad argument as `<script>: error: ...` in one
  line (no usage block; --help still shows it);
- number, count, text: a report field that must be a finite number >= 0 (> 0 with positive=True),
  an integer >= 1 or a name, else ValueError naming the field (launch_gaps.py and byte_bounds.py
  turn it into their one-line error naming the report); finite: the figures computed from them.

The scripts import it from beside themselves (their folder is put on sys.path first, so this works
when a script is run and when it is loaded as a module by a test).
"""

from __future__ import annotations

import math


def one_line_errors(parser):
    """`parser` (an ArgumentParser, with prog set to the script's file name) with every error said
    in one line, `<script>: error: <message>`, exit status 2."""
    name = parser.prog.removesuffix(".py")

    def error(message):
        parser.exit(2, f"{name}: error: {' '.join(str(message).split())}\n")

    parser.error = error
    return parser


def number(value, what: str, *, unit: str = "seconds", positive: bool = False) -> float:
    """A finite number >= 0 (> 0 with `positive`) of a report field, as a float, or ValueError
    naming it (`what`) and what it must be (in `unit`). A bool is not a number here; an integer too
    large for a float is not finite."""
    bound = "> 0" if positive else ">= 0"
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an int past the float range
        ok = False
    if not ok or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} is {_shown(value)}, not a finite number of {unit} {bound}")
    return float(value)


def count(value, what: str) -> int:
    """An integer >= 1 of a report field (a context, a batch), or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} is {_shown(value)}, not an integer >= 1")
    return value


def text(value, what: str, *, optional: bool = False) -> str | None:
    """A name field of a report (a mode, run or trace): a string, or None where `optional`, else
    ValueError naming it."""
    if isinstance(value, str) or (optional and value is None):
        return value
    raise ValueError(f"{what} is {_shown(value)}, not a name" + (" or null" if optional else ""))


def finite(values, what: str) -> None:
    """ValueError unless every figure computed from a report is finite: values each finite but far
    outside what a report holds (1e308 seconds) overflow when added or divided."""
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} overflow to inf or nan: a value far outside what a profile holds")


def _shown(value) -> str:
    """The value for a message: its repr, cut short (a report may hold a huge string or number)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "an integer of more than 30 digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
