"""Buffered rows to an Arrow table, on the writer thread: the only place tensor values are read.

One value that cannot be converted (a meta-device tensor, an object whose ``__float__`` raises, a
string) becomes null with one warning; the rest of its window is kept.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from .schema import FIXED_COLUMNS, FIXED_NAMES
from .warn import Warner

_N_FIXED = len(FIXED_COLUMNS)
_FIXED_SET = frozenset(FIXED_NAMES)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Held:
    """A tensor kept by reference at end_step, with its version counter at that moment.

    Keeping a reference (not a copy) is what makes end_step free of syncs and kernel launches; the
    version counter tells us at flush time if the loop changed the tensor in place since.
    Inference-mode tensors have no version counter (``version`` is then None: nothing to compare).
    """

    __slots__ = ("tensor", "version")

    def __init__(self, tensor):
        self.tensor = tensor
        try:
            self.version = tensor._version
        except RuntimeError:  # "Inference tensors do not track version counter"
            self.version = None


def capture(v):
    """Keep a value without forcing a sync. Tensors are detached (no autograd graph is held) and
    kept by reference with their version counter; anything else passes through, to be converted
    (or nulled, with a warning) on the writer thread."""
    try:
        grad = getattr(v, "requires_grad", None)  # read once: 35 ns a tensor, 5 a step in a typical loop
        if grad is None:  # not a tensor
            return v
        return Held(v.detach() if grad else v)
    except Exception:  # an object whose attribute access raises: the writer nulls it
        return v


def capture_all(scalars: dict) -> None:
    """``capture`` every value of ``scalars`` that is not a float or None, in place."""
    for k, v in scalars.items():
        if v.__class__ is not float and v is not None:
            scalars[k] = capture(v)


def rows_to_table(rows: list[tuple], warn: Warner) -> pa.Table:
    """Rows as the recorder buffers them: the fixed columns, then the scalars (a dict or None),
    then the phase times (a list of (column, seconds) or None)."""
    fixed, extras = _to_host(rows, warn)
    arrays = [_column(values, name, typ == "int64", warn) for (name, typ), values in zip(FIXED_COLUMNS, fixed)]
    arrays += [_column(values, name, False, warn) for name, values in extras.items()]
    return pa.Table.from_arrays(arrays, names=list(FIXED_NAMES) + list(extras))


def _to_host(rows: list[tuple], warn: Warner) -> tuple[list[list], dict[str, list]]:
    """Columns of Python values from buffered rows; device tensors copied in one batch per dtype.

    ``torch.stack(...).cpu()`` here waits for the kernels that produced the values (blocking this
    thread, not the training thread).
    """
    fixed = [list(col) for col in zip(*[r[:_N_FIXED] for r in rows])] if rows else [[] for _ in FIXED_COLUMNS]
    extras = _extra_columns([r[_N_FIXED] if r[_N_FIXED + 1] is None else _with_phases(r[_N_FIXED + 1], r[_N_FIXED])
                             for r in rows])
    for name in [n for n in extras if n in _FIXED_SET]:
        warn(f"reserved:{name}", f"scalar name {name!r} is reserved for a fixed column; its values are dropped")
        del extras[name]
    torch = sys.modules.get("torch")
    if torch is not None:
        _resolve_tensors(torch, list(FIXED_NAMES) + list(extras), fixed + list(extras.values()), warn)
    return fixed, extras


def _with_phases(phases: list[tuple[str, float]], scalars: dict | None) -> dict:
    """One row's phase times summed per column, then its scalars (a scalar of the same name wins)."""
    extras: dict = {}
    for name, seconds in phases:
        extras[name] = extras.get(name, 0.0) + seconds
    if scalars:
        extras.update(scalars)
    return extras


def _extra_columns(dicts: list[dict | None]) -> dict[str, list]:
    """One list per scalar name over the rows (None where a row lacks it), in first-seen order."""
    keys = next((tuple(d) for d in dicts if d), ())
    if keys and all(d and tuple(d) == keys for d in dicts):
        # Every row holds the same names in the same order (a loop logging a fixed set): transpose
        # in C. 300 scalars a row is 300 Python steps a row on the general path below.
        return {name: list(col) for name, col in zip(keys, zip(*[d.values() for d in dicts]))}
    names: dict[str, None] = {}
    for d in dicts:
        if d:
            names.update(dict.fromkeys(d))
    extras = {name: [None] * len(dicts) for name in names}
    for i, d in enumerate(dicts):
        if d:
            for name, v in d.items():
                extras[name][i] = v
    return extras


def _resolve_tensors(torch, names: list[str], columns: list[list], warn: Warner) -> None:
    """Replace every Held in ``columns`` by its value (None where it has none)."""
    on_device: dict[tuple, list[tuple[list, int]]] = {}
    for name, col in zip(names, columns):
        if Held not in set(map(type, col)):  # C-level scan: most columns hold plain numbers
            continue
        for i, v in enumerate(col):
            if type(v) is Held:
                col[i] = _host_value(v, name, warn)
                if col[i] is v.tensor:  # on an accelerator: copied below, in batches
                    on_device.setdefault((v.tensor.device, v.tensor.dtype), []).append((col, i))
    _copy_to_host(torch, on_device, warn)


def _host_value(held: Held, name: str, warn: Warner):
    """The value of a held tensor when it can be had here; the tensor itself when it has to be
    copied from an accelerator; None (with a warning) when it has no usable value."""
    t = held.tensor
    try:
        if held.version is not None and t._version != held.version:
            warn(f"inplace:{name}", f"the tensor logged as {name!r} was modified in place after end_step; "
                 "those values are recorded as null (log a .clone() of tensors you update in place)")
            return None
        if t.numel() != 1:
            warn("shape", f"a tensor of shape {tuple(t.shape)} was logged as {name!r}; only 1-element tensors are recorded")
            return None
        kind = t.device.type
        if kind == "cpu":
            return t.item()
        if kind == "meta":
            warn(f"meta:{name}", f"the tensor logged as {name!r} is on the meta device (it has no value); recorded as null")
            return None
        return t
    except Exception as e:  # a tensor subclass or a broken device: only this value is lost
        warn(f"tensor:{name}", f"the tensor logged as {name!r} could not be read ({e!r}); recorded as null")
        return None


def _copy_to_host(torch, on_device: dict[tuple, list[tuple[list, int]]], warn: Warner) -> None:
    synced = set()
    for (device, dtype), places in on_device.items():
        if device not in synced:
            _synchronize(torch, device, warn)
            synced.add(device)
        try:
            # One kernel and one device-to-host copy per (device, dtype), whatever the row count.
            host = torch.stack([col[i].reshape(()) for col, i in places]).cpu().tolist()
        except Exception:  # one value spoils the batch: copy one by one, nulling only the bad ones
            host = [_one_to_host(col[i], warn) for col, i in places]
        for (col, i), value in zip(places, host):
            col[i] = value


def _one_to_host(t, warn: Warner):
    try:
        return t.reshape(()).cpu().item()
    except Exception as e:
        warn(f"copy:{t.device}", f"a tensor on {t.device} could not be copied to the host ({e!r}); recorded as null")
        return None


def _synchronize(torch, device, warn: Warner) -> None:
    """Wait for every stream of ``device``: the values may come from any stream of the loop, and this
    thread's stream would not wait for those. Blocks only this writer thread. Each backend syncs
    itself (torch.cuda for CUDA and ROCm, torch.xpu, torch.mps); never torch.cuda for another type."""
    backend = getattr(torch, device.type, None)
    sync = getattr(backend, "synchronize", None)
    if sync is None:
        return
    try:
        if device.type == "mps":
            sync()  # takes no device
        else:
            sync(device)
    except Exception as e:
        warn(f"sync:{device.type}", f"could not synchronise {device} before copying values ({e!r}); copying anyway")


def _float_or_none(v, name: str, warn: Warner):
    if v is None or type(v) is float:
        return v
    try:
        if isinstance(v, (str, bytes)):  # float("1.5") would parse it: a string is not a metric
            raise TypeError
        return float(v)
    except Exception:  # whatever __float__ raises: this value is null, the window stays
        warn(f"value:{name}", f"value {safe_repr(v)} for {name!r} is not a number; recorded as null")
        return None


def _int_or_none(v, name: str, warn: Warner):
    if v is None:
        return v
    try:
        if isinstance(v, (str, bytes)):
            raise TypeError
        if type(v) is int or isinstance(v, np.integer):
            i = int(v)
        else:
            f = float(v)
            if not f.is_integer():  # tokens=7.9 is a bug upstream, not 7 tokens
                raise ValueError
            i = int(f)
        if not _INT64_MIN <= i <= _INT64_MAX:
            raise OverflowError
        return i
    except Exception:
        warn(f"value:{name}", f"value {safe_repr(v)} for {name!r} is not a 64-bit integer; recorded as null")
        return None


def safe_repr(v) -> str:
    try:
        return repr(v)[:200]
    except Exception:
        return f"<{type(v).__name__} object>"


# Types pyarrow converts exactly as we want, a whole column at a time in C; anything else
# (strings, tensors that could not be resolved, floats in an integer column) goes value by value.
_INTS = frozenset({type(None), int, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32})
_FLOATS = _INTS | {float, bool, np.float64, np.float32, np.float16, np.bool_}


def _column(values: list, name: str, int64: bool, warn: Warner) -> pa.Array:
    typ = pa.int64() if int64 else pa.float64()
    if set(map(type, values)) <= (_INTS if int64 else _FLOATS):
        try:
            return pa.array(values, type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass  # a value out of range: sorted out one by one below
    conv = _int_or_none if int64 else _float_or_none
    return pa.array([conv(v, name, warn) for v in values], type=typ)
