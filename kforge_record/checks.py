"""One check per kind of option value, shared by every option of kforge: the Recorder's keywords,
IngestOptions, FindingsOptions, DaskOptions and the command lines made from them
(kforge_dash/cli/options.py). The same bad value gets the same one-line error everywhere:
``NAME: must be WHAT, got VALUE``. A bool is never a number. Pure Python (the recorder imports it)."""

from __future__ import annotations

import math


def _fail(name: str, what: str, v) -> ValueError:
    return ValueError(f"{name}: must be {what}, got {v!r}")


def is_number(v) -> bool:
    """An int or float, not a bool (True is an int to Python, never a number to kforge)."""
    return not isinstance(v, bool) and isinstance(v, (int, float))


def check_int(name: str, v, lo: int) -> None:
    """An integer >= ``lo``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _fail(name, f"an integer >= {lo}", v)


def check_positive(name: str, v, what: str = "a positive finite number", *, finite: bool = True) -> None:
    """A number > 0 (finite unless ``finite=False``)."""
    if not is_number(v) or (finite and not math.isfinite(v)) or not v > 0:
        raise _fail(name, what, v)


def check_fraction(name: str, v) -> None:
    """A number in (0, 1]."""
    if not is_number(v) or not 0 < v <= 1:
        raise _fail(name, "a number in (0, 1]", v)


def check_seconds(name: str, v) -> None:
    """A number of seconds >= 0 (0: do not wait)."""
    if not is_number(v) or not v >= 0 or math.isnan(v):
        raise _fail(name, "a number of seconds >= 0", v)


def check_globs(name: str, v) -> None:
    """A tuple of non-empty glob patterns (strings)."""
    if not isinstance(v, tuple) or not all(isinstance(p, str) and p.strip() for p in v):
        raise _fail(name, "a tuple of non-empty glob patterns", v)


def check_flag(name: str, v) -> None:
    """True or False (a TypeError: a value of the wrong kind, as a flag's)."""
    if not isinstance(v, bool):
        raise TypeError(str(_fail(name, "True or False", v)))
