"""Numbers and counts as a person reads them, one format for each, for every front end.

The `kforge-ingest` screen, the dashboard's pages, kforge-report, the TensorBoard/W&B text and
ingest's finding messages all format through here (no heavy imports: any layer may import it):

- missing: one character, MISSING ("—"), never "-", "None" or 0;
- percents: "12.3 %" (a space before the sign), small values to two significant digits
  ("0.0049 %", not "0.0 %");
- durations: "44.2 s" under 100 s (significant digits under 1 s: "0.042 s"), h:mm:ss from 100 s;
- counts in words: counted(3, "rank") -> "3 ranks" (the one plural rule);
- rank lists ("ranks 0–3, 7") and step ranges ("steps 151–400").
"""

from __future__ import annotations

import math

MISSING = "—"
NOT_SET = "(not set)"  # a config key a run does not have (JSON null shows as null)
GIB = 2**30
DASH_RANGE = "–"  # en dash between the ends of a range (steps 151–400)


def known(v) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _decimals(v: float, *, at_least: int, sig: int = 2, most: int = 8) -> int:
    """Decimals that show ``sig`` significant digits of ``v`` (a non-zero value under 1), at least ``at_least``."""
    return min(most, max(at_least, sig - 1 - math.floor(math.log10(abs(v)))))


def fixed(v, digits: int = 1) -> str:
    """``v`` to ``digits`` decimals; under 1, to at least two significant digits (0.0049 -> "0.0049",
    not "0.0"; 0.49 -> "0.49"); MISSING when unknown."""
    if not known(v):
        return MISSING
    d = digits if v == 0 or abs(v) >= 1 else _decimals(v, at_least=digits)
    return f"{v:,.{d}f}"


def percent(fraction, digits: int = 1) -> str:
    """0.1234 -> "12.3 %"; 4.9e-5 -> "0.0049 %"; None -> "—"."""
    return f"{fixed(100 * fraction, digits)} %" if known(fraction) else MISSING


def hms(seconds) -> str:
    """12345.6 -> '3:25:46'; None/NaN -> '—'."""
    if not known(seconds):
        return MISSING
    s = int(round(seconds))
    sign, s = ("-", -s) if s < 0 else ("", s)
    return f"{sign}{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def duration(seconds) -> str:
    """One format for every duration: '44.2 s' under 100 s ('0.042 s' under 0.1 s), else as hms ('1:02:05')."""
    if not known(seconds):
        return MISSING
    return f"{fixed(seconds)} s" if abs(seconds) < 100 else hms(seconds)


def gib(n_bytes, digits: int = 2) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB" if known(n_bytes) else MISSING


def number(v, fmt: str = "{:,.6g}") -> str:
    """A value with ``fmt``; MISSING for None; NaN and inf as they are (facts about the run, not missing)."""
    if v is None:
        return MISSING
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return fmt.format(v)


def count(n) -> str:
    """1234 -> "1,234" (1234.0 too: a count in a float column); None -> "—"."""
    return number(int(n) if isinstance(n, float) and n.is_integer() else n, "{:,}")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 run', '2 runs', '1,024 ranks' (`plural` for a noun that does not take an s). The one plural rule."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def agrees(n: int, one: str, many: str) -> str:
    """The verb for a count: agrees(1, "differs", "differ") -> "differs"."""
    return one if n == 1 else many


def _runs_of(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def rank_list(ranks) -> str | None:
    """"rank 3", "ranks 1, 3", "ranks 0–7, 12" (three or more consecutive ranks as a range); None
    for no ranks. Ranks that are not integers are listed as they are."""
    rs = list(ranks or [])
    if not rs:
        return None
    if all(isinstance(r, int) and not isinstance(r, bool) for r in rs):
        parts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}{DASH_RANGE}{b}" for a, b in _runs_of(rs)]
        many = len(set(rs)) > 1
    else:
        parts, many = [str(r) for r in rs], len(rs) > 1
    return f"{'ranks' if many else 'rank'} {', '.join(parts)}"


def step_range(first, last=None) -> str | None:
    """"step 5", "steps 151–400"; None when ``first`` is unknown."""
    if not isinstance(first, int):
        return None
    last = last if isinstance(last, int) else first
    return f"step {first}" if last == first else f"steps {first}{DASH_RANGE}{last}"


def span(first, last) -> str:
    """The ends of a range of steps without the word: "0–400"; MISSING when unknown."""
    if not isinstance(first, int) or not isinstance(last, int):
        return MISSING
    return f"{first}{DASH_RANGE}{last}"


# What the headline numbers are (docs/CONTRACT.md, summary.json): the same label and help everywhere.
TRAINING_TIME = "training time"
JOB_WALL_CLOCK = "job wall clock"
MEAN_MFU = "mean MFU"
ACHIEVED_MFU = "achieved MFU"
FINAL_LOSS = "final loss"
BEST_LOSS = "best loss"
MFU_HELP = ("mean MFU: time-weighted, the kept steps' FLOPs over their step times added up (training time); "
            "achieved MFU (the MFU waterfall): the same FLOPs over the whole job wall clock, incl. startup, "
            "downtime and stalls, so it is the lower of the two")
ACHIEVED_HELP = ("achieved MFU: the kept steps' FLOPs over the whole job wall clock (startup, downtime, "
                 "recomputed steps and stalls included); mean MFU divides the same FLOPs by the training time only")
LOSS_HELP = ("final loss: the last kept step's loss, the mean over the ranks that recorded it (NaN shown as nan); "
             "best loss: the lowest finite one of those per-step means")
WALL_TIMES_HELP = ("training time: the kept steps' periods added up, from each launch's first step's start to its last "
                   "step's end (time between steps included; no startup, no downtime between launches); job wall clock: "
                   "from the first launch's start to the last record, incl. startup, downtime between launches and "
                   "recomputed steps")


def loss(v) -> str:
    """A loss (or any metric of that kind) to 5 significant digits: 2.3456; NaN as nan."""
    return number(v, "{:.5g}")


def achieved_mfu(summary: dict) -> float | None:
    """The MFU waterfall's achieved MFU (FLOPs over the job wall clock), None where unknown."""
    m = summary.get("mfu_waterfall")
    parts = m.get("parts") if isinstance(m, dict) else None
    v = parts.get("achieved") if isinstance(parts, dict) else None
    return v if known(v) else None


def headline(summary: dict) -> dict[str, str]:
    """A run's headline numbers as every front end shows them: label -> text (MISSING where unknown).

    The CLI screen, the run page's metrics, the report and the runs tables read their text here."""
    train_s, clock_s = wall_times(summary)
    g = summary.get("goodput")
    return {"steps": count(summary.get("steps")), "ranks": count(summary.get("world_size")),
            "tokens": count(summary.get("tokens")),
            "tokens/s": number(summary.get("mean_tokens_per_sec"), "{:,.0f}"),
            MEAN_MFU: percent(summary.get("mean_mfu")), ACHIEVED_MFU: percent(achieved_mfu(summary)),
            FINAL_LOSS: loss(summary.get("final_loss")), BEST_LOSS: loss(summary.get("best_loss")),
            TRAINING_TIME: duration(train_s), JOB_WALL_CLOCK: duration(clock_s),
            "goodput": percent(g.get("fraction") if isinstance(g, dict) else None)}


def wall_times(summary: dict) -> tuple[float | None, float | None]:
    """(training time, job wall clock) of a run's summary.json, each None where unknown.

    Training time = the sum of the kept steps' times (`wall_time_s`); job wall clock = the first
    launch's start to the last record, startup and downtime between launches included (`goodput.total_s`).
    """
    train = summary.get("wall_time_s")
    g = summary.get("goodput")
    clock = g.get("total_s") if isinstance(g, dict) else None
    return (train if known(train) else None, clock if known(clock) else None)


def device_label(summary: dict) -> str:
    """'NVIDIA H100 80GB HBM3 ×8', 'CPU ×2' (the recorder names a CPU by its architecture), or '—'."""
    dev = summary.get("device") or {}
    n = summary.get("world_size")
    name = "CPU" if dev.get("type") == "cpu" else dev.get("name")
    if not name:
        return MISSING
    return f"{name} ×{n}" if isinstance(n, int) and not isinstance(n, bool) else str(name)


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
    """A name, tag or warning from disk as literal text inside Markdown (Streamlit's alerts and
    captions, TensorBoard's text plugin).

    The characters Markdown (and Streamlit's extensions: math, colour directives) acts on are
    backslash-escaped, and line breaks become spaces (no line of a name can start a heading or a
    list), so `![pix](https://…)`, `**bold**`, `<img>`, `$x$` and `:red[x]` show as typed.
    """
    flat = str(s).replace("\r", " ").replace("\n", " ")
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in flat)


# ":" and "@": no autolinks (https://, user@host); "(", ")", "+", "-", ".": no list or link starts
_MD_SPECIAL = frozenset("\\`*_[]<>#!$~|{}&:@")
