"""Click options made from the one definition of each option (kforge_dash/ingest/option_spec.py), and
``--version`` for every kforge command: the CLI cannot drift from the Python API, and a bad value gets
the Python API's own one-line message (``Invalid value for '--alpha': alpha: must be a number in (0, 1],
got 1.5``)."""

from __future__ import annotations

from collections.abc import Callable

import click

from kforge_dash.ingest.option_spec import OptionSpec


class SpecType(click.ParamType):
    """A command line's text, parsed and checked by an OptionSpec under its Python name."""

    def __init__(self, name: str, spec: OptionSpec):
        self.py_name, self.spec, self.name = name, spec, spec.metavar.lower()

    def convert(self, value, param, ctx):
        if not isinstance(value, str):  # a default, already a value
            return value
        parsed = self.spec.parse(value)
        try:
            self.spec.check(self.py_name, parsed)
        except (ValueError, TypeError) as e:
            self.fail(str(e), param, ctx)
        return parsed


def spec_options(specs: dict[str, OptionSpec], defaults: dict | None = None) -> Callable:
    """One click option per spec (``spike_k`` -> ``--spike-k``), default None (not given: the value kept
    with the run, else the default shown from ``defaults``)."""
    def decorate(f):
        for name, spec in reversed(list(specs.items())):
            shown = None if defaults is None or defaults.get(name) is None else _shown(defaults[name])
            f = click.option(spec.flag(name), name, type=SpecType(name, spec), default=None, metavar=spec.metavar,
                             help=spec.help + (f"  [default: {shown}]" if shown is not None else ""))(f)
        return f
    return decorate


def _shown(v) -> str:
    return ",".join(v) if isinstance(v, (tuple, list)) else f"{v:g}" if isinstance(v, float) else str(v)


def version_option(prog: str) -> Callable:
    """``--version``: the kforge version (kforge_record/version.py, the one place it is set)."""
    from kforge_record.version import __version__

    return click.version_option(__version__, "--version", prog_name=prog, message="%(prog)s %(version)s")
