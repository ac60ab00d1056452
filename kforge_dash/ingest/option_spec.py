"""One definition of each ingest option: its check, its help, how a command line spells it.

IngestOptions, FindingsOptions and DaskOptions validate with these specs on construction, and
``kforge-ingest``'s click options are made from them (kforge_dash/cli/options.py), so the same bad
value gets the same one-line error from Python and from the command line (``NAME: must be ...,
got VALUE``; the checks are kforge_record/checks.py, which the Recorder uses too)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kforge_record.checks import check_fraction, check_globs, check_int, check_positive, check_seconds


@dataclass(frozen=True, kw_only=True)
class OptionSpec:
    """An option: ``check(name, value)`` raises ValueError naming it; ``parse`` turns a command line's
    text into a value (then checked); ``help`` is the one sentence the CLI and the reference show."""

    check: Callable[[str, object], None]
    parse: Callable[[str], object]
    help: str
    metavar: str
    optional: bool = False  # None is a value (not given: the next source decides)

    def validate(self, name: str, value) -> None:
        if value is None and self.optional:
            return
        self.check(name, value)

    def flag(self, name: str) -> str:
        """The command line's spelling of ``name``: ``--spike-k``."""
        return "--" + name.replace("_", "-")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return text  # type: ignore[return-value]  (refused by the check, which names it)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return text  # type: ignore[return-value]


def globs_from_text(text: str) -> tuple[str, ...]:
    """``'fwd*, *bwd*'`` -> ``('fwd*', '*bwd*')``; ``''`` -> ``()`` (none: e.g. no phase holds a collective)."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def positive(help: str, *, metavar: str = "X", optional: bool = False) -> OptionSpec:
    return OptionSpec(check=check_positive, parse=_float, help=help, metavar=metavar, optional=optional)


def fraction(help: str, *, optional: bool = False) -> OptionSpec:
    return OptionSpec(check=check_fraction, parse=_float, help=help, metavar="X", optional=optional)


def integer(lo: int, help: str, *, metavar: str = "N") -> OptionSpec:
    return OptionSpec(check=lambda name, v: check_int(name, v, lo), parse=_int, help=help, metavar=metavar)


def seconds(help: str, *, positive_only: bool = False) -> OptionSpec:
    check = (lambda name, v: check_positive(name, v, "a positive number of seconds")) if positive_only else check_seconds
    return OptionSpec(check=check, parse=_float, help=help, metavar="SECONDS")


def globs(help: str) -> OptionSpec:
    return OptionSpec(check=check_globs, parse=globs_from_text, help=help, metavar="GLOBS")


def validate_all(obj, specs: dict[str, OptionSpec]) -> None:
    """Check every field of a frozen options dataclass against its spec."""
    for name, spec in specs.items():
        spec.validate(name, getattr(obj, name))


# kforge-ingest --dask-connect-timeout, DaskOptions.connect_timeout_s (kforge_dash/cluster.py)
CONNECT_TIMEOUT = seconds("Give up on an unreachable Dask scheduler after SECONDS.", positive_only=True)
