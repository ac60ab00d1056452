"""Numbers as a person reads them: MFU in %, durations as h:mm:ss, memory in GiB, "—" for missing.

Plain functions shared by the pages, the runs table and kforge-report.
"""

from __future__ import annotations

import math

MISSING = "—"
NOT_SET = "(not set)"  # a config key a run does not have (JSON null shows as null)
GIB = 2**30


def _known(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def hms(seconds) -> str:
    """12345.6 -> '3:25:46'; None/NaN -> '—'."""
    if not _known(seconds):
        return MISSING
    s = int(round(seconds))
    sign, s = ("-", -s) if s < 0 else ("", s)
    return f"{sign}{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def duration(seconds) -> str:
    """One format for every duration a page shows: '44.2 s' under 100 s, else as hms ('1:02:05')."""
    if not _known(seconds):
        return MISSING
    return f"{seconds:.1f} s" if abs(seconds) < 100 else hms(seconds)


def wall_times(summary: dict) -> tuple[float | None, float | None]:
    """(training time, job wall clock) of a run's summary.json, each None where unknown.

    Training time = the sum of the kept steps' times (`wall_time_s`); job wall clock = the first
    launch's start to the last record, startup and downtime between launches included (`goodput.total_s`).
    """
    train = summary.get("wall_time_s")
    g = summary.get("goodput")
    clock = g.get("total_s") if isinstance(g, dict) else None
    return (train if _known(train) else None, clock if _known(clock) else None)


TRAINING_TIME = "training time"
JOB_WALL_CLOCK = "job wall clock"
MFU_HELP = ("mean MFU: the mean of the kept steps' MFU (their own step times only); the MFU waterfall's "
            "achieved MFU is the FLOPs done over the whole job wall clock, incl. startup, downtime and stalls, "
            "so it is the lower of the two")
WALL_TIMES_HELP = ("training time: the kept steps' periods added up, from each launch's first step's start to its last "
                   "step's end (time between steps included; no startup, no downtime between launches); job wall clock: "
                   "from the first launch's start to the last record, incl. startup, downtime between launches and "
                   "recomputed steps")


def percent(fraction, digits: int = 1) -> str:
    return f"{100 * fraction:.{digits}f} %" if _known(fraction) else MISSING


def gib(n_bytes, digits: int = 2) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB" if _known(n_bytes) else MISSING


def number(v, fmt: str = "{:,.6g}") -> str:
    if v is None:
        return MISSING
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # nan / inf are facts about the run, not missing
    return fmt.format(v)


def device_label(summary: dict) -> str:
    """'NVIDIA H100 80GB HBM3 ×8', 'CPU ×2' (the recorder names a CPU by its architecture), or '—'."""
    dev = summary.get("device") or {}
    n = summary.get("world_size")
    name = "CPU" if dev.get("type") == "cpu" else dev.get("name")
    if not name:
        return MISSING
    return f"{name} ×{n}" if isinstance(n, int) and not isinstance(n, bool) else str(name)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 run', '2 runs' (`plural` for a noun that does not take an s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _origin(value: str | None, what: str, source) -> str:
    """'7.4e+08 FLOPs/token from table', '... FLOPs/token' (no source known), 'FLOPs/token unknown'."""
    if value is None:
        return f"{what} unknown"
    return f"{value} {what}" + (f" from {source}" if source else "")


def flops_origin(summary: dict) -> str:
    """Where FLOPs/token and the peak came from, in one line (both are in summary.json); a value not
    known reads "unknown" (a sentence, not a table: no dash)."""
    fpt, peak = summary.get("flops_per_token"), summary.get("peak_tflops")
    f = _origin(None if fpt is None else number(fpt, "{:.4g}"), "FLOPs/token", summary.get("flops_source"))
    p = "peak TFLOPS unknown" if peak is None else "peak " + _origin(number(peak, "{:g}"), "TFLOPS/GPU",
                                                                      summary.get("peak_source"))
    return f"{f}; {p}"


def md_text(s) -> str:
    """A name, tag or warning from disk as literal text inside Streamlit Markdown (alerts, captions).

    The characters Markdown (and Streamlit's extensions: math, colour directives) acts on are
    backslash-escaped, and line breaks become spaces (no line of a name can start a heading or a
    list), so `![pix](https://…)`, `**bold**`, `<img>`, `$x$` and `:red[x]` show as typed.
    """
    flat = str(s).replace("\r", " ").replace("\n", " ")
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in flat)


_MD_SPECIAL = frozenset("\\`*_[]<>#!$~|{}&:@")  # ":" and "@": no autolinks (https://, user@host)


def with_missing_as_dash(rows: list[dict], formats: dict) -> list[dict]:
    """Table rows where each column of `formats` that has a missing value becomes text: the value
    formatted, "—" where missing, left-padded with spaces to one width so that text still sorts
    as the numbers do (for values of one sign). Columns without a gap are left as numbers."""
    out = [dict(r) for r in rows]
    for col, fmt in formats.items():
        if not any(r.get(col) is None for r in rows):
            continue
        texts = [MISSING if r.get(col) is None else fmt(r[col]) for r in rows]
        width = max(len(t) for t in texts)
        for r, t in zip(out, texts):
            r[col] = t if t == MISSING else t.rjust(width)
    return out


def frame_missing_as_dash(df, fmt=lambda v: f"{v:.6g}"):
    """A polars frame for display: its columns with a null as text ("—" there, numbers via `fmt`)."""
    import polars as pl

    formats = {c: (fmt if df[c].dtype.is_numeric() else str) for c in df.columns}
    rows = with_missing_as_dash(df.to_dicts(), formats)
    return pl.DataFrame(rows, schema={c: (pl.String if df[c].null_count() else df[c].dtype) for c in df.columns})


def _short_json(text: str | None) -> str | None:
    """A JSON float to 6 significant digits (0.10822273790836334 -> 0.108223); anything else as it is."""
    import json

    try:
        v = json.loads(text) if text is not None else None
    except ValueError:
        return text
    return f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else text


def config_diff_text(diff):
    """browse.runs.config_diff for display: a key a run lacks (null there) reads "(not set)", so the
    table never mixes Python's None with JSON's null (a key set to null); floats read to 6
    significant digits, unless that would make two differing values of a key look the same."""
    import polars as pl

    if diff.width <= 1:
        return diff
    rows = []
    for key, *vals in diff.iter_rows():
        short = [_short_json(v) for v in vals]
        shown = short if len(set(short)) == len(set(vals)) else vals
        rows.append([key, *(NOT_SET if v is None else v for v in shown)])
    return pl.DataFrame(rows, schema={c: pl.String for c in diff.columns}, orient="row")
