"""Options kept with a run: what was decided at ingest sticks.

An option that decides the outputs (IngestOptions.given: alpha, peak_tflops, flops_per_token, the
findings thresholds), once given, is written to RUN/ingested/options.json (atomically, under the
run's ingest lock) and used by every later ingest of the run (the CLI on the root or the run,
``--watch``, the dashboard's Ingest button, ``--dask``) until given again or dropped with
``reset_options``. Only given values are kept, never defaults: a default that changes in a new
version applies to the runs that never chose it.
"""

from __future__ import annotations

import json
import os

from kforge_dash.contract import OPTIONS_FILE
from kforge_dash.findings.thresholds import FindingsOptions
from kforge_dash.ingest.options import (
    DEFAULT,
    DEFAULT_ALPHA,
    GIVEN,
    INGEST_SPECS,
    KEPT,
    KEPT_OPTIONS,
    DecidedOptions,
    IngestOptions,
)
from kforge_record.atomic import write_json_atomic

__all__ = ["decide", "read_kept", "save_kept"]


def read_kept(out_dir: str, warnings: list[str]) -> dict:
    """RUN/ingested/options.json as written by save_kept; {} when there is none. A value that is not
    valid (edited by hand) is dropped with a warning naming the file and the value."""
    path = os.path.join(out_dir, OPTIONS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.append(f"{path}: unreadable ({e}); the kept options are ignored")
        return {}
    if not isinstance(raw, dict):
        warnings.append(f"{path}: not a JSON object; the kept options are ignored")
        return {}
    kept: dict = {}
    for k, v in raw.items():
        try:
            if k in KEPT_OPTIONS:
                INGEST_SPECS[k].check(k, v)
                kept[k] = v
            elif k == "findings" and isinstance(v, dict):
                kept[k] = {n: x for n, x in v.items() if _threshold_ok(n, x, path, warnings)}
            elif k == "findings":
                warnings.append(f"{path}: findings: must be an object of thresholds, got {v!r}; ignored")
            else:
                warnings.append(f"{path}: unknown option {k!r} ignored")
        except ValueError as e:
            warnings.append(f"{path}: {e}; ignored")
    return kept


def _threshold_ok(name: str, v, path: str, warnings: list[str]) -> bool:
    try:
        FindingsOptions.from_dict({name: v})
    except (ValueError, TypeError) as e:
        warnings.append(f"{path}: {e}; ignored")
        return False
    return True


def decide(opts: IngestOptions, kept: dict) -> DecidedOptions:
    """The options this ingest uses: given now (``opts``), else kept (``kept``, unless
    ``opts.reset_options``), else the default; and where each came from."""
    kept = {} if opts.reset_options else kept
    given = opts.given()
    sources: dict[str, str] = {}
    values: dict = {}
    for k in KEPT_OPTIONS:
        values[k], sources[k] = _pick(k, given, kept, DEFAULT_ALPHA if k == "alpha" else None)
    g_f, k_f = given.get("findings", {}), kept.get("findings", {})
    thresholds = {}
    for name, default in FindingsOptions().to_dict().items():
        thresholds[name], sources[f"findings.{name}"] = _pick(name, g_f, k_f, default)
    new_kept = {**{k: v for k, v in kept.items() if k != "findings"}, **{k: v for k, v in given.items() if k != "findings"}}
    if k_f or g_f:
        new_kept["findings"] = {**k_f, **g_f}
    return DecidedOptions(alpha=values["alpha"], peak_tflops=values["peak_tflops"], flops_per_token=values["flops_per_token"],
                          findings=FindingsOptions.from_dict(thresholds), sources=sources, kept=new_kept)


def _pick(name: str, given: dict, kept: dict, default):
    if name in given:
        return given[name], GIVEN
    if name in kept:
        return kept[name], KEPT
    return default, DEFAULT


def save_kept(out_dir: str, decided: DecidedOptions, before: dict) -> None:
    """Write RUN/ingested/options.json when what is kept changed (``before``: as read)."""
    if dict(decided.kept) != before:
        write_json_atomic(os.path.join(out_dir, OPTIONS_FILE), dict(decided.kept))
