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


def size(n_bytes) -> str:
    """Bytes in binary units: 512 -> "512 B"; 290_000_000 -> "277 MiB"; 3 << 30 -> "3.00 GiB"."""
    if not known(n_bytes):
        return MISSING
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            v = n_bytes / scale
            return f"{v:.2f} {unit}" if unit == "GiB" or v < 10 else f"{v:,.0f} {unit}"
    return f"{int(n_bytes)} B"


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
    many = len(set(rs)) > 1 if _all_ints(rs) else len(rs) > 1
    return f"{'ranks' if many else 'rank'} {rank_runs(rs)}"


def rank_runs(ranks) -> str:
    """The ranks without the word: "0–7, 12" (three or more consecutive ranks as a range); "" for none."""
    rs = list(ranks or [])
    if not _all_ints(rs):
        return ", ".join(str(r) for r in rs)
    return ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}{DASH_RANGE}{b}" for a, b in _runs_of(rs))


def _all_ints(rs: list) -> bool:
    return all(isinstance(r, int) and not isinstance(r, bool) for r in rs)


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


def loss(v) -> str:
    """A loss (or any metric of that kind) to 5 significant digits: 2.3456; NaN as nan."""
    return number(v, "{:.5g}")


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
