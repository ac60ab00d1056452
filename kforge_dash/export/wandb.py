"""W&B export: one offline run per kforge run in RUN/ingested/wandb/, and ``wandb sync`` on request.

* Run id: ``kf-`` + 16 hex of sha256(run name, first attempt id). The same on every re-ingest (the
  first launch never changes), and two different runs that reuse a directory name get two ids.
* The run is written into a temp dir beside ``wandb/`` and swapped in after ``finish()``, so there is
  only ever one offline run to sync. (Between the two renames ``wandb/`` is briefly absent; a
  leftover ``.wandb-*.tmp`` from a crash is removed by the next export.)
* History: one ``run.log(row, step=step)`` per step, the row holding only that step's non-null values
  and ``_timestamp`` = the recorded step time (W&B keeps it as the point's wall time). W&B keeps only
  steps >= 0: steps below 0 are left out with a RuntimeWarning, and ``points`` counts the rows logged.
* Non-finite values: logged as they are (the .wandb file keeps NaN/inf; the W&B charts skip them), and
  the summary carries ``nonfinite/<tag>`` = how many NaN/inf points that metric has, so a diverged
  run is visible in the runs table even where the chart shows a gap.
* Config: the hyperparameters at top level (as ``wandb.init(config=hparams)`` would), plus ``model``,
  ``world_size``, ``device``; a hyperparameter with one of those names wins and kforge's value moves
  to ``kforge/<name>``. The rest of summary.json (attempts, restarts, FLOPs and peak sources,
  warnings, ...) is config ``kforge`` (one nested dict), except ``exports``.
* Summary: only what a W&B user compares across runs, as ``kforge/<key>`` (namespaced: a user
  scalar may be called ``tokens``): ``final_loss, best_loss, mean_mfu, mean_tokens_per_sec, tokens,
  steps, wall_time_s, restarts`` (how many), ``goodput`` (summary ``goodput.fraction``) and
  ``findings`` (how many), when summary.json has them; plus ``nonfinite/<tag>``.
* Time: the run's start is the training's (the first launch's ``start_time``), and its runtime
  the training's wall span (last step's time - start), written into the run record, so the W&B
  "Relative Time (Wall)" axis and the run's start are the training's; each history row's
  ``_timestamp`` is the step's recorded time. The SDK has no public way to set either: ``wandb.init``
  overwrites ``settings.x_start_time`` with the export's clock, so kforge sets the ``Run``'s start
  time and runtime just before its run record is built (``_start_time``, ``_start_runtime``: wandb
  internals, checked to exist; without them the run keeps the export's time, with a warning). What
  cannot be set at all: ``_runtime`` in each history row and the summary's ``_wandb.runtime``
  and the exit record's runtime are wandb-core's own clock of the export process (about a second).
* Offline only, no console capture, no system stats, no code, no git, no requirements file.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from urllib.parse import urlparse

from kforge_dash.contract import WANDB_DIR, ingested_dir
from kforge_dash.export.history import History
from kforge_dash.export.tb_findings import lineage_text
from kforge_dash.optional import require
from kforge_dash.run_view import run_view

DEFAULT_PROJECT = "kforge"
DEFAULT_BASE_URL = "https://api.wandb.ai"
_RESERVED_CONFIG = ("model", "world_size", "device")


def run_id_for(summary: dict) -> str:
    """Deterministic W&B run id of a kforge run: run name + the first launch's (smallest) attempt id."""
    attempts = summary.get("attempts") or []
    first = min(attempts, key=lambda a: a.get("attempt", 0)) if attempts else {}
    ids = sorted(str(i) for i in (first.get("attempt_ids") or []))
    key = f"{summary.get('run_name') or ''}\n{ids[0] if ids else ''}"
    return "kf-" + hashlib.sha256(key.encode()).hexdigest()[:16]


# summary.json keys a W&B user compares across runs (the runs table); the rest goes to config.
SUMMARY_KEYS = ("final_loss", "best_loss", "mean_mfu", "mean_tokens_per_sec", "tokens", "steps", "wall_time_s")


def wandb_config(summary: dict) -> dict:
    hparams = dict(summary.get("hparams") or {})
    ours = {"model": summary.get("model"), "world_size": summary.get("world_size"), "device": summary.get("device")}
    for k, v in ours.items():
        hparams[f"kforge/{k}" if k in hparams else k] = v
    rest = {k: v for k, v in summary.items() if k not in (*SUMMARY_KEYS, *ours, "hparams", "exports")}
    hparams["kforge/summary" if "kforge" in hparams else "kforge"] = rest
    return hparams


def wandb_summary(history: History) -> dict:
    """What a W&B user compares across runs: numbers (W&B sorts and plots them), the same values the runs table
    of the dashboard and kforge-report shows (run_view.py: a list as its count)."""
    summary = history.summary
    out = {f"kforge/{k}": summary[k] for k in SUMMARY_KEYS if k in summary}
    values = run_view(summary).values
    for key, name in (("restarts", "restarts"), ("goodput", "goodput.fraction"), ("findings", "findings")):
        if values[name] is not None and (key != "restarts" or isinstance(summary.get("restarts"), list)):
            out[f"kforge/{key}"] = values[name]
    if isinstance(summary.get("restarts"), list) and (lineage := lineage_text(summary)) is not None:
        out["kforge/lineage"] = lineage  # the restarts as text: the history is the kept line
    out.update({f"nonfinite/{tag}": n for tag, n in history.nonfinite_counts().items()})
    return out


def training_span(history: History) -> tuple[float | None, int | None]:
    """(start time, whole seconds from it to the last step's end) of the training, or Nones."""
    if not history.n_steps:
        return None, None
    starts = [a.get("start_time") for a in history.summary.get("attempts") or [] if isinstance(a, dict)]
    starts = [float(t) for t in starts if isinstance(t, (int, float)) and math.isfinite(t)]
    first, last = float(history.frame["time"][0]), float(history.frame["time"][-1])
    start = min(starts) if starts else first
    start = min(start, first)
    return start, int(round(last - start))


_INIT_LOCK = threading.Lock()


@contextlib.contextmanager
def _run_record_time(start: float | None, runtime: int | None):
    """Have the next wandb.init put ``start``/``runtime`` in its run record (module doc: "Time")."""
    try:
        from wandb.sdk.interface.interface import InterfaceBase
    except ImportError:
        InterfaceBase = None
    make = getattr(InterfaceBase, "_make_run", None)
    if start is None or make is None:
        if start is not None:
            warnings.warn("this wandb has no InterfaceBase._make_run: the W&B run keeps the export's start time",
                          RuntimeWarning, stacklevel=3)
        yield
        return

    def make_run(self, run):
        if hasattr(run, "_start_time") and hasattr(run, "_start_runtime"):
            run._start_time, run._start_runtime = start, runtime or 0
        else:
            warnings.warn("this wandb's Run has no _start_time/_start_runtime: the W&B run keeps the export's "
                          "start time", RuntimeWarning, stacklevel=2)
        return make(self, run)

    with _INIT_LOCK:
        InterfaceBase._make_run = make_run
        try:
            yield
        finally:
            InterfaceBase._make_run = make


def _wandb():
    return require("wandb", extra="ingest", purpose="W&B export")


def write_wandb(history: History, *, project: str | None = None, entity: str | None = None) -> tuple[str, str, int]:
    """Write the offline run; returns (offline run dir, run id, history rows)."""
    wandb = _wandb()
    ing = ingested_dir(history.run_dir)
    final = os.path.join(ing, WANDB_DIR)
    _remove_stale_temps(ing)
    tmp = tempfile.mkdtemp(prefix=".wandb-", suffix=".tmp", dir=ing)
    try:
        summary = history.summary
        run_id = run_id_for(summary)
        settings = wandb.Settings(
            mode="offline", console="off", silent=True, quiet=True, show_info=False, show_warnings=False,
            x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True, x_save_requirements=False,
            save_code=False, disable_git=True, disable_job_creation=True,
        )
        tags = [str(t)[:64] for t in (summary.get("tags") or [])]  # W&B caps a tag at 64 characters
        with _run_record_time(*training_span(history)):
            run = wandb.init(
                dir=tmp, id=run_id, name=summary.get("run_name"),
                project=project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                entity=entity or os.environ.get("WANDB_ENTITY") or None, config=wandb_config(summary), tags=tags,
                settings=settings, reinit="create_new",
            )
        try:
            keys = ("_timestamp",) + history.tags
            log = run.log
            n = below_zero = 0
            for row in history.rows(with_ranks=False):
                if row[0] < 0:  # W&B drops a step below 0 without a word: count it and say so
                    below_zero += 1
                    continue
                log({k: v for k, v in zip(keys, row[1:]) if v is not None}, step=row[0])
                n += 1
            run.summary.update(wandb_summary(history))
        finally:
            run.finish()
        runs = [d for d in os.listdir(os.path.join(tmp, WANDB_DIR)) if d.startswith("offline-run-")]
        if len(runs) != 1:
            raise RuntimeError(f"{tmp}: expected one offline run from wandb, found {runs}")
        _swap(os.path.join(tmp, WANDB_DIR), final, ing)
        if below_zero:
            warnings.warn(f"{history.run_dir}: W&B keeps only steps >= 0; {below_zero} step(s) below 0 were not "
                          f"exported to W&B ({n} were; TensorBoard and the dashboard have them all)",
                          RuntimeWarning, stacklevel=2)
        return os.path.join(final, runs[0]), run_id, n
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap(new: str, final: str, parent: str) -> None:
    old = None
    if os.path.exists(final):
        old = tempfile.mkdtemp(prefix=".wandb-old-", suffix=".tmp", dir=parent)
        os.rename(final, os.path.join(old, WANDB_DIR))
    os.rename(new, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temps(parent: str, *, older_than_s: float = 3600.0) -> None:
    # Only old ones: a young temp dir may belong to an export of this run running right now.
    now = time.time()
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        if name.startswith(".wandb-") and name.endswith(".tmp"):
            try:
                if now - os.path.getmtime(path) > older_than_s:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass


@dataclass(frozen=True)
class SyncOutcome:
    ok: bool
    error: str | None
    output: str  # the tail of wandb sync's output, for the log


def sync_wandb(offline_run: str, *, timeout_s: float = 600.0, probe_timeout_s: float = 5.0) -> SyncOutcome:
    """Run ``wandb sync`` on one offline run; never hangs past ``timeout_s``, never raises for a failure."""
    base_url = os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL
    proxied = any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"))
    if not proxied:  # with a proxy only the proxy can tell; then the timeout below decides
        unreachable = _probe(base_url, probe_timeout_s)
        if unreachable:
            return SyncOutcome(False, f"no network: cannot reach {base_url} ({unreachable}); "
                               f"copy {offline_run} to a machine with network and run `wandb sync` there", "")
    cmd = [sys.executable, "-m", "wandb", "sync", offline_run]
    proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.dirname(offline_run)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return SyncOutcome(False, f"wandb sync did not finish within {timeout_s:g}s (no network, or {base_url} "
                           f"is not answering); nothing is lost: re-run with --upload later", _tail(out))
    if proc.returncode == 0:
        return SyncOutcome(True, None, _tail(out))
    low = out.lower()
    if "api key" in low or "wandb login" in low or "not logged in" in low:
        return SyncOutcome(False, "not logged in to W&B: run `wandb login` or set WANDB_API_KEY, then re-run with --upload",
                           _tail(out))
    return SyncOutcome(False, f"wandb sync failed (exit {proc.returncode}): {_tail(out, 400)}", _tail(out))


def _probe(url: str, timeout_s: float) -> str | None:
    """None when a TCP connection to the URL's host opens, else why not."""
    u = urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "", port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"{u.hostname}:{port}: {e.strerror or e}"


def _kill_group(proc: subprocess.Popen) -> None:
    # wandb sync starts wandb-core as a child: end the whole session we started, by its id.
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(text: str | None, n: int = 2000) -> str:
    text = (text or "").strip()
    return text[-n:]

