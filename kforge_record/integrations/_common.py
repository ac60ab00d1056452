"""What the adapters share: JSON-safe hyperparameters, a phase timer driven by two hooks, and the
import error that says which package to install."""

from __future__ import annotations

import importlib
import math


def need(module: str, package: str):
    """Import ``module`` or fail with the pip command that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"this kforge adapter needs {package}: pip install {package} ({e})") from None


def plain(d) -> dict:
    """A dict fit for meta.json: numbers, strings, booleans, None and lists of them as they are,
    nested dicts flattened into the same rules, anything else as its str()."""
    out = {}
    for k, v in dict(d or {}).items():
        out[str(k)] = _plain_value(v)
    return out


def _plain_value(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return plain(v)
    if isinstance(v, (list, tuple)) and all(x is None or isinstance(x, (bool, int, float, str)) for x in v):
        return [_plain_value(x) for x in v]
    item = getattr(v, "item", None)  # a numpy scalar or a 0-dim tensor in a config
    if callable(item) and getattr(v, "ndim", 1) == 0:
        try:
            return _plain_value(item())
        except Exception:
            pass
    return str(v)


class Phases:
    """Phase times from hook pairs, for frameworks whose hooks (not a ``with`` block) mark where a
    phase starts and ends. ``enter(name)`` ends the phase open now (if any) and opens ``name``;
    ``leave()`` ends it. Times add up within a step, like ``Recorder.phase``."""

    def __init__(self, rec):
        self._rec = rec
        self._open = None

    def enter(self, name: str) -> None:
        self.leave()
        self._open = self._rec.phase(name)
        self._open.__enter__()

    def leave(self) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None

    def restart(self) -> None:
        """Start the open phase again from now, dropping the time it had (an eval, a checkpoint)."""
        if self._open is not None:
            self._open.__enter__()


def number(v):
    """A logged value kforge can store (int, float, or a 1-element tensor/array), else None."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return v
    if getattr(v, "numel", None) is not None and v.numel() == 1:
        return v
    return None


def tokens_in(batch) -> int | None:
    """Token count of a batch of integer ids, host-side (``numel`` reads no data): a tensor, a dict
    with ``input_ids``, or a tuple/list whose first item is one. None when it cannot tell."""
    if isinstance(batch, dict):
        batch = batch.get("input_ids")
    elif isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    dtype = getattr(batch, "dtype", None)
    if dtype is None or getattr(dtype, "is_floating_point", True):
        return None
    return int(batch.numel())
