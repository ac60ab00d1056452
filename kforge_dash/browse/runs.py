"""Runs under a runs root: discovery, ingest status, colours and the config diff (runs_table.py: the runs table).

Every Parquet file in browse/ is scanned with glob=False: run names carry brackets and stars
(`sweep[lr=3e-4]`, `**bold**`), and a path is never a pattern.

Plain functions (no Streamlit) so the dashboard's data preparation is testable on its own.
Every file the dashboard reads is reached through `run_dir()`, which confines names to the root.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from kforge_dash import text
from kforge_dash.contract import INGESTED_DIR, STEPS_FILE, SUMMARY_FILE, read_summary_file
from kforge_record.regular_file import NotRegularFile, check_regular_file
from kforge_record.schema import RANK_PREFIX

ROOT_ENV = "KFORGE_DASH_ROOT"  # how kforge-dash hands the runs root to the Streamlit script
ONLY_RUN_ENV = "KFORGE_DASH_RUN"  # `kforge-dash RUN_DIR`: the root is its parent, only this run listed

INGESTED = "ingested"
STALE = "stale"  # shards newer than the last ingest
NOT_INGESTED = "not ingested"
BROKEN = "unreadable"  # ingested/summary.json exists but cannot be read


class RunPathError(ValueError):
    """A run name that would leave the runs root (or is not a plain directory name)."""


def default_runs_root() -> Path:
    """The repo's bundled sample_runs/ (editable install), else ./sample_runs."""
    bundled = Path(__file__).resolve().parent.parent / "sample_runs"
    return bundled if bundled.is_dir() else Path.cwd() / "sample_runs"


def runs_root_from_env() -> Path:
    return Path(os.environ.get(ROOT_ENV) or default_runs_root()).resolve()


def only_run_from_env() -> str | None:
    """The one run `kforge-dash RUN_DIR` shows, or None (every run under the root)."""
    return os.environ.get(ONLY_RUN_ENV) or None


def is_run_folder(path: str | os.PathLike) -> bool:
    """A run directory itself (ingested, or with rank shards), not a root holding runs."""
    p = Path(path)
    return p.is_dir() and ((p / INGESTED_DIR / SUMMARY_FILE).is_file() or _has_shards(p))


def run_dir(root: str | os.PathLike, name: str) -> Path:
    """The directory of run `name` under `root`; refuses anything that would leave `root`.

    A run name is one plain path component: no separators, no '..', not absolute, not hidden.
    A symlinked run whose target lies outside the root is refused too.
    """
    if not isinstance(name, str) or not name:
        raise RunPathError(f"run name {name!r}: must be a non-empty string")
    if name in (".", "..") or name.startswith(".") or "/" in name or "\\" in name or "\x00" in name or os.path.isabs(name):
        raise RunPathError(f"run name {name!r}: not a plain directory name under the runs root")
    root_real = Path(os.path.realpath(root))
    target = Path(os.path.realpath(root_real / name))
    if target.parent != root_real:
        raise RunPathError(f"run name {name!r}: resolves to {target}, outside the runs root {root_real}")
    return target


def ingested_file(run_path: Path, name: str) -> Path:
    """RUN/ingested/NAME, resolved; refused (RunPathError) when a symlink takes it out of the run."""
    run_real = Path(os.path.realpath(run_path))
    target = Path(os.path.realpath(run_real / INGESTED_DIR / name))
    if not target.is_relative_to(run_real):
        # The target is not echoed: where a symlink points outside the root is not the viewer's to see.
        raise RunPathError(f"{run_path.name}/{INGESTED_DIR}/{name}: a link that leads outside the run directory; not read")
    try:
        check_regular_file(target)  # a FIFO would block the page's reader for ever
    except NotRegularFile as e:
        raise RunPathError(f"{run_path.name}/{INGESTED_DIR}/{name}: {e}") from None
    except OSError:
        pass  # missing: the caller's reader says so
    return target


@dataclass
class RunInfo:
    name: str
    path: Path
    status: str
    summary: dict | None = None
    error: str | None = None
    tags: list[str] = field(default_factory=list)

    @property
    def ingested(self) -> bool:
        """True when ingested outputs can be shown (possibly stale)."""
        return self.summary is not None

    def file(self, name: str) -> Path:
        return ingested_file(self.path, name)

    def source(self):
        """What the compare view and the export read from this run."""
        from kforge_dash.browse.series import RunSource

        return RunSource(self.name, self.file(STEPS_FILE), self.summary or {})


load_summary = read_summary_file  # kept under the name the dashboard uses


def newest_shard_mtime(path: Path) -> float | None:
    """Newest mtime of the run's rank and attempt folders, or None without shards.

    The recorder only ever adds files by renaming them into an attempt folder (and a new launch
    adds an attempt folder), which updates that folder's mtime: so folders are enough, and a
    run with thousands of part files costs one stat per rank and attempt, not per file.
    """
    newest = None
    for rank in os.scandir(path):
        if not (rank.name.startswith(RANK_PREFIX) and rank.is_dir(follow_symlinks=False)):
            continue
        m = rank.stat(follow_symlinks=False).st_mtime
        newest = m if newest is None or m > newest else newest
        for attempt in os.scandir(rank.path):
            if attempt.is_dir(follow_symlinks=False):
                m = attempt.stat(follow_symlinks=False).st_mtime
                newest = m if m > newest else newest
    return newest


def shards_newer(r: RunInfo) -> bool:
    """Whether the run's shards changed after its last ingest (read now, not from the listing)."""
    try:
        newest = newest_shard_mtime(r.path)
        return newest is not None and newest > ingested_file(r.path, SUMMARY_FILE).stat().st_mtime
    except (OSError, RunPathError):
        return False


def _has_shards(path: Path) -> bool:
    with os.scandir(path) as entries:  # (closed when any() stops early)
        return any(e.name.startswith(RANK_PREFIX) and e.is_dir() for e in entries)


def list_runs(root: str | os.PathLike, *, only: str | None = None) -> list[RunInfo]:
    """Every run directory directly under `root` (sorted by name) with its ingest status; `only`: that run alone."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"{root}: runs root is not a directory")
    runs = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_dir() or (only is not None and entry.name != only):
            continue
        try:
            path = run_dir(root, entry.name)
        except RunPathError:
            continue  # a symlink leaving the root is not a run of this root
        try:
            summary_path = ingested_file(path, SUMMARY_FILE)
        except RunPathError:  # leads outside the run, or no regular file (a FIFO): never read; its shards may be
            summary_path = None
        has_summary = summary_path is not None and summary_path.is_file()
        if not has_summary and not _has_shards(path):
            continue  # not a run directory
        info = RunInfo(entry.name, path, NOT_INGESTED)
        if has_summary:
            try:
                info.summary = load_summary(summary_path)
                info.tags = [str(t) for t in info.summary.get("tags") or []]
                newest = newest_shard_mtime(path)
                stale = newest is not None and newest > summary_path.stat().st_mtime
                info.status = STALE if stale else INGESTED
            except ValueError as e:
                info.status, info.error = BROKEN, str(e)
        runs.append(info)
    return runs


def no_runs_message(root: str | os.PathLike, runs: list[RunInfo]) -> str:
    """What a page says when the root has nothing to show (plain text; the page escapes it): with no
    run at all, how to record one and ingest it; with runs waiting, that they need an ingest."""
    if runs:
        return (f"No ingested runs under {root} yet: {text.counted(len(runs), 'run')} recorded there "
                f"{text.agrees(len(runs), 'waits', 'wait')} for an ingest. "
                f"Press the Ingest button above, or run: kforge-ingest {root}")
    return (f"No runs under {root} yet. Record one from your training loop: "
            f"rec = kforge_record.Recorder('{root}/my-run'); each step rec.start_step() ... "
            "rec.end_step(step, loss=loss, tokens=n); rec.close(). "
            f"Then ingest it: kforge-ingest {root} (this page shows it at once; or try the bundled "
            "runs: kforge-ingest sample_runs && kforge-dash sample_runs).")


def filter_runs(runs: list[RunInfo], *, query: str = "", tags: list[str] = ()) -> list[RunInfo]:
    """Runs whose name or a tag contains `query` (case-insensitive) and that carry every tag in `tags`."""
    q = query.strip().lower()
    out = []
    for r in runs:
        if q and q not in r.name.lower() and not any(q in t.lower() for t in r.tags):
            continue
        if any(t not in r.tags for t in tags):
            continue
        out.append(r)
    return out


def selectable(matching: list[str], selected: list[str], known: list[str]) -> list[str]:
    """Options of the run picker: the runs matching the search, plus runs already selected
    (still known), so a search that hides them does not drop them from the selection."""
    return matching + [n for n in selected if n in known and n not in matching]


def run_started(r: RunInfo) -> float | None:
    """When the run's first launch started (from its summary), or None."""
    starts = [a.get("start_time") for a in (r.summary or {}).get("attempts") or []]
    starts = [t for t in starts if isinstance(t, (int, float))]
    return min(starts) if starts else None


def claim_order(runs: list[RunInfo]) -> list[str]:
    """Run names oldest first (never-started ones last, by name): the order in which runs claim colours."""
    return [r.name for r in sorted(runs, key=lambda r: (run_started(r) is None, run_started(r) or 0.0, r.name))]


def recent_runs(runs: list[RunInfo], limit: int = 8) -> list[str]:
    """The `limit` most recently started ingested runs, newest first: the landing page's selection."""
    ingested = [r for r in runs if r.ingested]
    return list(reversed(claim_order(ingested)))[:limit]


# Okabe & Ito's colour-blind-safe set first (without its yellow and black, which read poorly on white),
# then Paul Tol's "muted" colours (without its grey): 13 hues, none a grey, the first 7 told apart
# under deuteranopia and protanopia too. Hex, so bands can add alpha.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#332288",
    "#999933", "#882255", "#44AA99", "#DDCC77", "#AA4499", "#117733",
)
# Past len(PALETTE) runs the colours come round again, each round with its own dash pattern.
DASHES = ("solid", "dash", "dot", "dashdot")


@dataclass(frozen=True)
class RunStyle:
    """How a run (or group) is drawn on every chart: its colour and its line's dash pattern."""
    colour: str
    dash: str = "solid"


def run_styles(names: list[str]) -> dict[str, RunStyle]:
    """One style per name, in order: the i-th name gets PALETTE[i % len(PALETTE)], and the rounds
    after the first a dash pattern, so up to len(PALETTE) * len(DASHES) names are told apart.

    Pass claim_order (oldest run first): a run then keeps its colour on every chart and page
    whatever is selected, a new run never moves one already there, and any len(PALETTE) runs
    started one after another (the landing page's most recent ones) have distinct colours.
    """
    n = len(PALETTE)
    return {name: RunStyle(PALETTE[i % n], DASHES[(i // n) % len(DASHES)]) for i, name in enumerate(names)}


def run_colours(names: list[str]) -> dict[str, str]:
    """The colour of each name's run_styles entry."""
    return {name: style.colour for name, style in run_styles(names).items()}


def _flatten(d, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def run_config(summary: dict) -> dict[str, object]:
    """The flat configuration of a run that a config diff compares (hparams first, then setup)."""
    cfg = _flatten(summary.get("hparams") or {}, "hparams.")
    cfg.update(_flatten(summary.get("model") or {}, "model."))
    return {**cfg, "world_size": summary.get("world_size"), "device": (summary.get("device") or {}).get("name"),
            "peak_tflops": summary.get("peak_tflops"), "flops_per_token": summary.get("flops_per_token"),
            "tags": sorted(summary.get("tags") or [])}


def launch_changes(runs: list[RunInfo]) -> dict[str, dict[str, list]]:
    """{run: {config key: [its JSON value per launch]}} of summary.json hparams_changed (a resume's changes)."""
    out = {}
    for r in runs:
        changed = (r.summary or {}).get("hparams_changed")
        if isinstance(changed, dict) and changed:
            out[r.name] = {f"hparams.{k}": [json.dumps(v, sort_keys=True) for v in vals]
                           for k, vals in changed.items() if isinstance(vals, list)}
    return out


def config_diff(runs: list[RunInfo]) -> pl.DataFrame:
    """Keys whose value differs between the runs, or between the launches of one (a resume that changed
    it, launch_changes): a `key` column, then one column per run.

    Values are JSON text (3e-4 and "3e-4" stay distinguishable); a key a run lacks is null in its column.
    """
    cfgs = {r.name: run_config(r.summary or {}) for r in runs}
    keys = sorted({k for c in cfgs.values() for k in c})
    resumed = {k for ch in launch_changes(runs).values() for k in ch}
    missing = object()  # distinguishes an absent key from a present null
    rows = []
    for k in keys:
        vals = [c.get(k, missing) for c in cfgs.values()]
        texts = [json.dumps(v, sort_keys=True) for v in vals if v is not missing]
        if len(texts) == len(vals) and len(set(texts)) <= 1 and k not in resumed:
            continue  # same everywhere
        rows.append({"key": k, **{n: (None if v is missing else json.dumps(v, sort_keys=True))
                                  for n, v in zip(cfgs, vals)}})
    schema = {"key": pl.String, **{n: pl.String for n in cfgs}}
    return pl.DataFrame(rows, schema=schema)
