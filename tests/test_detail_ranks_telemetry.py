"""The run page's per-rank view shows the recorder's GPU telemetry (hw/* columns) beside step time and
phases: a throttled GPU's SM clock reads below the median rank's at the finding's steps, in MHz."""

import json

from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse import ranks as prep_ranks


def test_a_throttled_gpus_clock_shows_by_rank_in_mhz(sample_runs_copy):
    run = sample_runs_copy / "throttled" / "ingested"
    ranks_path = run / "ranks.parquet"
    metrics = prep_ranks.rank_metrics(ranks_path)
    assert metrics[0] == "step_time_s" and {"hw/sm_clock_mhz", "hw/gpu_temp_c"} <= set(metrics)
    assert "hw/throttle_reasons" not in metrics  # a bitmask has no mean
    summary = json.loads((run / "summary.json").read_text())
    (throttle,) = [f for f in summary["findings"] if f["kind"] == "hw_throttle"]
    (rank,) = throttle["ranks"]

    h = prep_ranks.rank_heatmap(ranks_path, relative=True, metric="hw/sm_clock_mhz")
    assert h.value == "SM clock / median rank" and h.unit == "MHz"
    inside = [i for i, (a, b) in enumerate(zip(h.window_start, h.window_end))
              if a >= throttle["first_step"] and b <= throttle["last_step"]]
    row = h.z[h.ranks.index(rank)]
    slow = [row[i] for i in inside if row[i] is not None]
    assert slow and max(slow) < 0.9  # the throttled clock, against the median rank's
    before = [v for i, v in enumerate(row) if h.window_end[i] < throttle["first_step"] and v is not None]
    assert before and min(before) > 0.95

    absolute = prep_figures.heatmap_figure(prep_ranks.rank_heatmap(ranks_path, metric="hw/sm_clock_mhz"))
    assert "MHz" in absolute.data[0].hovertemplate and "MHz" in absolute.data[0].colorbar.title.text
    assert prep_ranks.metric_label("hw/sm_clock_mhz") == ("SM clock", "MHz")
    assert prep_ranks.metric_label("time/data_s") == ("data phase", "s")


def test_a_run_with_only_a_throttle_finding_opens_on_the_clock():
    summary = {"findings": [{"kind": "hw_throttle", "metric": "hw/sm_clock_mhz", "severity": "warning"}]}
    assert prep_findings.default_rank_metric(summary, ["step_time_s", "hw/sm_clock_mhz"]) == "hw/sm_clock_mhz"
    summary["findings"].append({"kind": "straggler", "metric": "time/data_s", "severity": "warning"})
    assert prep_findings.default_rank_metric(summary, ["step_time_s", "time/data_s", "hw/sm_clock_mhz"]) == "time/data_s"


def test_a_straggler_caused_by_a_throttled_gpu_opens_on_the_clock():
    """The throttled sample (its straggler's cause is the throttle: same rank, same steps) opened on the
    optimizer phase, not the SM clock its finding is about (issue 27, point 5)."""
    throttle = {"kind": "hw_throttle", "metric": "hw/sm_clock_mhz", "severity": "warning", "ranks": [1],
                "first_step": 100, "last_step": 175}
    straggler = {"kind": "straggler", "metric": "time/optimizer_s", "severity": "warning", "ranks": [1],
                 "first_step": 100, "last_step": 179}
    metrics = ["step_time_s", "time/optimizer_s", "hw/sm_clock_mhz"]
    assert prep_findings.default_rank_metric({"findings": [throttle, straggler]}, metrics) == "hw/sm_clock_mhz"
    elsewhere = {**straggler, "ranks": [3]}  # a straggler the throttle does not explain: its own phase
    assert prep_findings.default_rank_metric({"findings": [throttle, elsewhere]}, metrics) == "time/optimizer_s"
