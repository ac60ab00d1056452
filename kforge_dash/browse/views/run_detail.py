"""One run in detail: ranks, memory, phases, restarts, non-finite steps, warnings. Render only."""

import streamlit as st

from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse import findings_figures, units
from kforge_dash.browse import ranks as prep_ranks
from kforge_dash.browse.units import md_text
from kforge_dash.browse.views import common
from kforge_dash.contract import RANKS_FILE, STEPS_FILE

st.title("Run detail")
root = common.runs_root()
runs = {r.name: r for r in common.load_runs(root) if r.ingested}
if not runs:
    st.info(f"No ingested runs under {md_text(root)} yet.")
    st.stop()
name = st.selectbox("Run", list(runs), key="run", bind="query-params")
run = runs[name]
s = run.summary

c = st.columns(6)
c[0].metric("steps", units.number(s.get("steps"), "{:,}"))
c[1].metric("hardware", units.device_label(s))
c[2].metric("wall time", units.hms(s.get("wall_time_s")))
c[3].metric("mean MFU", units.percent(s.get("mean_mfu")))
c[4].metric("final loss", units.number(s.get("final_loss"), "{:.5g}"))
c[5].metric("restarts", len(s.get("restarts") or []))
# Where MFU's two inputs came from: a wrong one makes every MFU figure quietly wrong.
st.caption("MFU inputs: " + md_text(units.flops_origin(s)))

st.subheader("Findings")
found = prep_findings.findings_table(name, s)
if "findings" not in s:
    st.info("Ingested before findings existed: re-ingest the run (kforge-ingest) to see them.")
elif found.is_empty():
    st.success("No findings: no spike, NaN, straggler, slow episode, memory growth, data stall or restart.")
else:
    st.dataframe(found.drop("first_step", "last_step"), hide_index=True, key="findings",
                 column_config={"open": st.column_config.LinkColumn("steps", display_text="open steps")})
waterfall = prep_findings.goodput_waterfall(s)
if waterfall is not None:
    st.plotly_chart(findings_figures.waterfall_figure(waterfall), key="goodput")

try:  # a damaged ingested file, or one leading outside the run: name it, keep the app up
    steps_path, ranks_path = run.file(STEPS_FILE), run.file(RANKS_FILE)
    # The table's links and this box set the same ?focus=FIRST-LAST: a link reproduces the view.
    options = prep_findings.focus_options(s)
    # Options are the plain "FIRST-LAST" (a bound widget keeps its label in the URL); the table says what each is.
    picked = st.selectbox("Open the steps of a finding (first-last)", options, index=None, key="focus",
                          bind="query-params", placeholder="pick a finding's steps") if options else None
    focus = prep_findings.parse_focus(picked)
    if focus is not None:
        st.plotly_chart(findings_figures.focus_figure(prep_findings.focus_steps(steps_path, *focus), *focus),
                        key="focus_chart")
    left, right = st.columns([1, 2])
    rank_metrics = prep_ranks.rank_metrics(ranks_path)
    shows = prep_findings.default_rank_metric(s, rank_metrics)  # where the straggler shows
    if shows is not None and st.session_state.get("metric_for") != name:
        st.session_state["metric"], st.session_state["metric_for"] = shows, name
    metric = left.selectbox(
        "per-rank metric", rank_metrics, key="metric",
        format_func=lambda m: "step time" if m == "step_time_s" else prep_ranks.phase_name(m) + " phase")
    relative = right.toggle("relative to the median rank of each window", value=True, key="relative")
    d = prep_ranks.run_detail(steps_path, ranks_path, s, relative=relative, metric=metric)
except ValueError as e:
    st.error(md_text(e))
    st.stop()

st.subheader("Per rank")
if d.heatmap is None:
    st.info(f"{md_text(ranks_path)} is missing: re-ingest the run for per-rank views.")
else:
    st.plotly_chart(prep_figures.heatmap_figure(d.heatmap), key="heatmap")
if d.phase_by_rank is not None and d.phase_by_rank.width > 1:
    st.caption("Mean seconds per phase and rank. Under data parallelism all ranks share one step time; "
               "a straggler shows as the rank with the longest own work (data, fwd_bwd) while the others wait.")
    st.dataframe(units.frame_missing_as_dash(d.phase_by_rank, lambda v: f"{v:.4f}"), hide_index=True,
                 key="phase_by_rank")
left, right = st.columns(2)
left.plotly_chart(prep_figures.bar_figure(d.slowest["rank"].to_list(), d.slowest["steps_slowest"].to_list(),
                                          x_title="rank", y_title="steps", title="how often each rank was the slowest"),
                  key="slowest")
if d.memory is None:
    right.info("No memory samples (CPU run, memory sampling off, or no ranks.parquet).")
else:
    ranks, values, label = d.memory
    right.plotly_chart(prep_figures.bar_figure(ranks, [v / units.GIB for v in values], x_title="rank", y_title="GiB",
                                               title=f"max {label} per rank"), key="memory")

st.subheader("Phase breakdown")
if d.phases.is_empty():
    st.info("No phase timers recorded in this run.")
else:
    st.plotly_chart(prep_figures.phase_figure(d.phases), key="phases")
    st.dataframe(d.phase_totals, hide_index=True, key="phase_totals",
                 column_config={"share": st.column_config.NumberColumn(format="percent")})

st.subheader("Restarts")
st.plotly_chart(prep_figures.timeline_figure(d.timeline), key="timeline")
st.dataframe(units.frame_missing_as_dash(d.timeline, str), hide_index=True, key="restarts")

st.subheader("Non-finite steps")
if d.nonfinite.is_empty():
    st.success("No NaN or inf in any metric.")
else:
    st.dataframe(d.nonfinite, hide_index=True, key="nonfinite")

st.subheader("Warnings")
warnings = s.get("warnings") or []
for w in warnings:
    st.warning(md_text(w))
if not warnings:
    st.success("Ingest raised no warnings.")
