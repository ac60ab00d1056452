"""One run as every front end shows it, built from its summary.json: the runs-table row, both wall times,
the what-if sentence, the MFU inputs and the finding cards.

The `kforge-ingest` screen, the run page, the dashboard's and kforge-report's runs table, the report's run
sections and TensorBoard's finding text render a RunView; none formats a summary field itself. Words and
formats come from the column registry (column_registry.py), numbers from text.py. Plain functions: no
polars, no Streamlit (the what-if's materiality rule is ingest's, ingest/straggler_costs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.ingest import straggler_costs

# The summary.json fields a page shows (the run header, the runs table): each has a registry entry.
SUMMARY_FIELDS = ("steps", "first_step", "last_step", "world_size", "ranks", "attempts", "restarts", "tokens",
                  "wall_time_s", "goodput.total_s", "goodput.fraction", "mean_tokens_per_sec", "mean_mfu",
                  "mfu_waterfall.parts.achieved", "final_loss", "best_loss", "peak_mem_bytes", "device",
                  "flops_per_token", "peak_tflops", "findings", "warnings", "tags")
_COUNTED = {"ranks": 0, "attempts": 0, "restarts": 0, "warnings": 0, "findings": None}  # a list: its length (absent: this)
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _at(summary: dict, path: str):
    v = summary
    for key in path.split("."):
        v = v.get(key) if isinstance(v, dict) else None
    return v


def _value(summary: dict, name: str):
    """The field's value as the registry formats it; None where missing or of the wrong type."""
    v = _at(summary, name)
    if name in _COUNTED:
        return len(v) if isinstance(v, list) else _COUNTED[name]
    if name == "device":
        dev = v if isinstance(v, dict) else {}
        return "CPU" if dev.get("type") == "cpu" else (str(dev["name"]) if dev.get("name") else None)
    if name == "tags":
        return [str(t) for t in v] if isinstance(v, list) and v else None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    if reg.REGISTRY[name].format == "count":
        return int(v) if text.known(v) and float(v).is_integer() else None
    return v


def wall_times(summary: dict) -> tuple[float | None, float | None]:
    """(training time, job wall clock), each None where unknown: the kept steps' times added up
    (`wall_time_s`), and the first launch's start to the last record (`goodput.total_s`)."""
    train, clock = _at(summary, "wall_time_s"), _at(summary, "goodput.total_s")
    return (train if text.known(train) else None, clock if text.known(clock) else None)


def achieved_mfu(summary: dict) -> float | None:
    """The MFU waterfall's achieved MFU (FLOPs over the job wall clock), None where unknown."""
    v = _at(summary, "mfu_waterfall.parts.achieved")
    return v if text.known(v) else None


def device_label(summary: dict) -> str:
    """'NVIDIA H100 80GB HBM3 ×8', 'CPU ×2' (the recorder names a CPU by its architecture), or '—'."""
    name, n = _value(summary, "device"), summary.get("world_size")
    if not name:
        return text.MISSING
    return f"{name} ×{n}" if isinstance(n, int) and not isinstance(n, bool) else name


def _origin(value: str | None, what: str, source) -> str:
    """'7.4e+08 FLOPs/token from table', '... FLOPs/token' (no source known), 'FLOPs/token unknown'."""
    if value is None:
        return f"{what} unknown"
    return f"{value} {what}" + (f" from {source}" if source else "")


def flops_origin(summary: dict) -> str:
    """Where FLOPs/token and the peak came from, in one line; a value not known reads "unknown"."""
    fpt, peak = summary.get("flops_per_token"), summary.get("peak_tflops")
    f = _origin(None if fpt is None else text.number(fpt, "{:.4g}"), reg.label("flops_per_token"), summary.get("flops_source"))
    p = "peak TFLOPS unknown" if peak is None else "peak " + _origin(text.number(peak, "{:g}"), "TFLOPS/GPU",
                                                                      summary.get("peak_source"))
    return f"{f}; {p}"


def what_if_text(summary: dict | None) -> str | None:
    """"Without its stragglers this run would have taken 39.2 s instead of 49.9 s; rank 1 (vm) alone cost
    10.7 s". None when there is nothing to say (straggler_costs.worth_saying: no straggler finding and no
    material saving); the rank is named only when a finding or the clock supports it (costly_ranks)."""
    s = summary if isinstance(summary, dict) else {}
    if not straggler_costs.worth_saying(s):
        return None
    w = s["what_if"]
    out = (f"Without its stragglers this run would have taken {text.duration(w['without_stragglers_s'])} "
           f"instead of {text.duration(w['total_s'])}")
    top = (straggler_costs.costly_ranks(s) or [None])[0]
    if top is not None:
        host = f" ({top['host']})" if top.get("host") else ""
        out += f"; rank {top.get('rank')}{host} alone cost {text.duration(top['cost_s'])}"
    return out


def findings_of(summary: dict | None) -> list[dict]:
    """The summary's findings that are well-formed dicts, most severe first (as ingest sorted them)."""
    out = [f for f in (summary or {}).get("findings") or [] if isinstance(f, dict)]
    return sorted(out, key=lambda f: SEVERITY_ORDER.get(f.get("severity"), 3))


def finding_where(f: dict) -> list[str]:
    """Where a finding is, but its steps: its ranks, hosts and phase ("rank 1", "on vm", "phase data")."""
    hosts = [str(h) for h in f.get("hosts") or []]
    parts = [text.rank_list(f.get("ranks")), f"on {', '.join(hosts)}" if hosts else None,
             f"phase {f['phase']}" if f.get("phase") is not None else None]
    return [p for p in parts if p]


def finding_kind(f: dict) -> str:
    return str(f.get("kind") or "finding").replace("_", " ")


@dataclass(frozen=True)
class FindingCard:
    """One finding as a person reads it: every field, none cut or raw.

    `facts` holds only the fields the finding has (no "None"); `focus` is the ?focus= value of
    its steps (None without steps); `message` is shown in full, as text."""
    severity: str
    kind: str
    facts: str
    message: str
    focus: str | None
    steps: str | None


def finding_cards(summary: dict | None) -> list[FindingCard]:
    cards = []
    for f in findings_of(summary):
        first, last = f.get("first_step"), f.get("last_step")
        first = first if isinstance(first, int) else None
        last = last if isinstance(last, int) else first
        steps = text.step_range(first, last)
        cards.append(FindingCard(
            severity=str(f.get("severity") or "info"), kind=finding_kind(f),
            facts=" · ".join(x for x in [steps, *finding_where(f)] if x),
            message=str(f.get("message") or "") + (f" Cause: {f['cause']}." if f.get("cause") else ""),
            focus=None if first is None else f"{first}-{last}", steps=steps))
    return cards


@dataclass(frozen=True)
class RunView:
    """A run's summary.json as the front ends show it (run_view builds it)."""
    summary: dict
    values: dict  # SUMMARY_FIELDS name -> value (a list field: its count), None where unknown
    training_s: float | None
    job_wall_clock_s: float | None
    device: str  # "NVIDIA H100 80GB HBM3 ×8"
    mfu_inputs: str  # where FLOPs/token and the peak came from
    what_if: str | None
    cards: tuple[FindingCard, ...]

    def text(self, name: str) -> str:
        """A field's value in its registry format ("12.3 %", "1:02:05", "—")."""
        return reg.REGISTRY[name].text(self.values.get(name))

    def labelled(self, name: str) -> str:
        """"training time 44.2 s": the registry label, then the text."""
        return f"{reg.label(name)} {self.text(name)}"

    @property
    def wall_times(self) -> str:
        """Both wall times in one line: "training time 32.8 s · job wall clock 44.2 s"."""
        return f"{self.labelled('wall_time_s')} · {self.labelled('goodput.total_s')}"

    def row(self) -> dict:
        """The runs table's values of this run (column_registry.RUNS_TABLE but run and status); tags joined."""
        out = {c: self.values.get(c) for c in reg.RUNS_TABLE if c not in ("run", "status")}
        out["tags"] = ", ".join(out["tags"]) if out["tags"] else None
        return out


def run_view(summary: dict | None) -> RunView:
    s = summary if isinstance(summary, dict) else {}
    train, clock = wall_times(s)
    return RunView(s, {name: _value(s, name) for name in SUMMARY_FIELDS}, train, clock, device_label(s), flops_origin(s),
                   what_if_text(s), tuple(finding_cards(s)))
