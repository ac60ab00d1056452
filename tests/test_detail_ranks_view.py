"""The run detail page's per-rank views: the relative heatmap's colours show the straggler the finding
reports, the per-rank phase table follows the phase shares' rule (a phase that did not run is 0 s),
with numbers to one format, and captions name the run's own phases. Expected values are read from
summary.json and the Parquet files with pyarrow, not from the prep code."""

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from chart_specs import chart_specs
from dash_fixtures import detail_page, lab, write_run

from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import ranks as prep_ranks
from kforge_dash.browse.rank_metrics import phase_label
from kforge_dash.findings.finding import Phases


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from dash_fixtures import copy_and_ingest_sample_runs

    return copy_and_ingest_sample_runs(tmp_path_factory.mktemp("ranks_view") / "runs")


def _rgb(c: str) -> tuple[float, ...]:
    if c.startswith("#"):
        return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))
    return tuple(float(v) for v in c[c.index("(") + 1:c.index(")")].split(",")[:3])


def _shown_colour(trace, v: float) -> str:
    """The colour plotly paints a cell of value v: its position between zmin and zmax (plotly's own
    data range where they are not set), clamped, then interpolated in RGB along the colour scale."""
    z = np.array(trace.z, dtype=float)
    lo = trace.zmin if trace.zmin is not None else np.nanmin(z)
    hi = trace.zmax if trace.zmax is not None else np.nanmax(z)
    pos = min(max((v - lo) / (hi - lo), 0.0), 1.0)
    scale = [(float(p), _rgb(c)) for p, c in trace.colorscale]
    for (p0, c0), (p1, c1) in zip(scale, scale[1:]):
        if p0 <= pos <= p1:
            f = 0.0 if p1 == p0 else (pos - p0) / (p1 - p0)
            return "#" + "".join(f"{round(a + f * (b - a)):02x}" for a, b in zip(c0, c1))
    raise AssertionError(f"position {pos} outside the colour scale")


def _delta_e(a: str, b: str) -> float:
    return math.dist(lab(a), lab(b))


def test_relative_heatmap_shows_the_straggler_in_every_window_the_finding_names(root):
    """four-ranks-stall: rank 2's data phase is ~230x the median rank's (0.35 ms) before step 100 and
    1.4x after (0.28 s vs 0.20 s); a colour scale sized for 230x painted the 1.4x the colour of every
    other rank, as if rank 2 had recovered at step 100 while the finding says steps 1-160."""
    run = root / "four-ranks-stall" / "ingested"
    finding = next(f for f in json.loads((run / "summary.json").read_text())["findings"] if f["kind"] == "straggler")
    assert finding["ranks"] == [2] and finding["metric"] == "time/data_s"
    h = prep_ranks.rank_heatmap(run / "ranks.parquet", relative=True, metric=finding["metric"])
    trace = prep_figures.heatmap_figure(h).data[0]
    z = np.array(trace.z, dtype=float)
    row = {r: i for i, r in enumerate(trace.y)}
    # Independently (pyarrow): after step 100 rank 2's data phase is ~1.4x the others', a modest straggler.
    t = pq.read_table(run / "ranks.parquet", columns=["step", "rank", "time/data_s"]).to_pydict()
    after = {r: np.mean([v for s, rr, v in zip(t["step"], t["rank"], t["time/data_s"]) if rr == r and s > 110])
             for r in set(t["rank"])}
    assert 1.3 < after[2] / np.median(list(after.values())) < 1.5
    windows = [w for w, start in enumerate(trace.x) if finding["first_step"] <= start <= finding["last_step"]]
    assert len(windows) > 50
    for w in windows:  # the slowest colour in every window the finding names
        assert all(z[row[2], w] >= z[row[r], w] for r in (0, 1, 3)), trace.x[w]
    late = [w for w in windows if trace.x[w] > 100]
    assert len(late) > 20
    for w in late:  # and, where it is 1.4x, visibly another colour than every other rank
        straggler = _shown_colour(trace, z[row[2], w])
        for r in (0, 1, 3):
            d = _delta_e(straggler, _shown_colour(trace, z[row[r], w]))
            assert d > 20, (trace.x[w], r, z[row[2], w], z[row[r], w], d)  # was ~1 (Viridis from 0 to 250)
    # The median rank reads 1x: the colour bar's ticks say so, and rank 0 after step 110 sits by it.
    ticks = dict(zip(trace.colorbar.ticktext, trace.colorbar.tickvals))
    one = _shown_colour(trace, ticks["1×"])
    late_w = [w for w, start in enumerate(trace.x) if start > 110]
    assert np.median([_delta_e(one, _shown_colour(trace, z[row[0], w])) for w in late_w]) < 5
    assert _delta_e(one, _shown_colour(trace, z[row[2], late_w[0]])) > 20
    # The hover still tells the true ratio and seconds, not the clipped colour value.
    text = dict(zip(trace.y, trace.text))[2]
    assert float(text[0].rstrip("×")) > 10 and 1.3 < float(text[-1].rstrip("×")) < 1.5


def test_a_sub_millisecond_phase_does_not_blow_up_the_ratio(tmp_path):
    """A phase every rank spends ~0.3 ms in, one rank 0.6 ms, in 0.2 s steps: 2x of nothing is not a straggler."""
    import polars as pl

    path = tmp_path / "ranks.parquet"
    n = 20
    pl.DataFrame({"step": [s for s in range(1, n + 1) for _ in range(4)], "rank": list(range(4)) * n,
                  "step_time_s": [0.2] * 4 * n, "time/opt_s": [0.0003, 0.0003, 0.0006, 0.0003] * n}).write_parquet(path)
    h = prep_ranks.rank_heatmap(path, windows=5, relative=True, metric="time/opt_s")
    assert all(1.0 < v < 1.2 for v in h.z[2]) and all(v == pytest.approx(1.0) for v in h.z[0])
    assert h.seconds[2] == pytest.approx([0.0006] * 5)
    step = prep_ranks.rank_heatmap(path, windows=5, relative=True)  # step time: the plain ratio
    assert all(v == pytest.approx(1.0) for r in step.z for v in r)


def test_per_rank_phases_count_a_phase_that_did_not_run_as_zero(root):
    """straggler: rank 0 checkpoints 5 times in 250 steps. Its 'checkpoint (s)' was the mean of the 5
    (0.0172 s), while the phase shares (rightly) count 0 s in the other steps."""
    path = root / "straggler" / "ingested" / "ranks.parquet"
    t = pq.read_table(path).to_pydict()
    got = prep_ranks.phase_per_rank(path, Phases.from_summary(json.loads((path.parent / "summary.json").read_text())))
    phases = [c for c in t if c.startswith("time/") and c.endswith("_s")]
    labels = {c: next(x for x in got.columns if x in (phase_label(c), phase_label(c, waiting=True))) for c in phases}
    for rank in sorted(set(t["rank"])):
        ended = [i for i, (r, st) in enumerate(zip(t["rank"], t["step_time_s"])) if r == rank and st is not None]
        row = got.row(got["rank"].to_list().index(rank), named=True)
        for c in phases:
            expected = sum(t[c][i] or 0.0 for i in ended) / len(ended)
            assert row[labels[c]] == pytest.approx(expected, rel=1e-9), (rank, c)
        # a rank's phases add up to at most its step time (the sample run's timers do not overlap)
        assert sum(row[labels[c]] for c in phases) <= row[phase_label("step_time_s")] * (1 + 1e-6)
    ckpt = labels["time/checkpoint_s"]
    assert got[ckpt].null_count() == 0 and got[ckpt].max() < 0.002  # was 0.0172 (mean of the 5 steps it ran)
    # One rule with the phase shares: the ranks' mean checkpoint is the shares' per-step checkpoint.
    totals = prep_ranks.phase_totals(path).table
    assert got[ckpt].mean() == pytest.approx(totals.filter(totals["phase"] == "checkpoint")["mean_s"][0], rel=1e-9)


def _per_rank_table(at):
    return next(d for d in at.dataframe if phase_label("step_time_s") in d.value.columns)


def test_per_rank_table_is_numbers_with_one_format_per_column(root, monkeypatch):
    """preempted/straggler: 'checkpoint (s)' was left-aligned text ('0.0190', '—') while the other
    columns were numbers shown as they came ('0.13' beside '0.1294')."""
    for run in ("straggler", "preempted"):
        at = detail_page(root, monkeypatch, run)
        assert not at.exception
        table = _per_rank_table(at)
        config = json.loads(table.proto.columns)
        for col in table.value.columns:
            if col == "rank":
                continue
            assert table.value[col].dtype.kind == "f", (run, col)  # numbers: right-aligned, sortable
            assert config[col]["type_config"] == {"type": "number", "format": "%.4f"}, (run, col)
        assert not table.value.isna().any().any()


def test_captions_name_the_runs_own_phases(tmp_path, monkeypatch):
    """The caption said '(data, optimizer)' whatever the run timed: a run with no data phase."""
    import polars as pl

    run = write_run(tmp_path, "no-data", n=50, world_size=2)
    ranks = run / "ingested" / "ranks.parquet"
    pl.read_parquet(ranks).drop("time/data_s").write_parquet(ranks)
    at = detail_page(tmp_path, monkeypatch, "no-data")
    assert not at.exception
    caption = next(c.value for c in at.caption if "straggler shows" in c.value).replace("\\", "")
    assert "own work (optimizer)" in caption and "(data" not in caption and "data)" not in caption
    title = next(s["layout"]["title"]["text"] for s in chart_specs(at)
                 if s["layout"].get("title", {}).get("text", "").startswith("steps where"))
    assert "data" not in title and len(title) <= 45  # fits a half-width column (tested in Chromium)
