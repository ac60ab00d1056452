"""One run in detail: ranks, memory, phases, restarts, non-finite steps, warnings. Render only."""

import streamlit as st

from kforge_dash import prep_figures, prep_ranks
from kforge_dash.pages import common

st.title("Run detail")
root = common.runs_root()
runs = {r.name: r for r in common.load_runs(root) if r.ingested}
if not runs:
    st.info(f"No ingested runs under {root} yet.")
    st.stop()
name = st.selectbox("Run", list(runs), key="run", bind="query-params")
run = runs[name]
s = run.summary
steps_path, ranks_path = run.file("steps.parquet"), run.file("ranks.parquet")

c = st.columns(5)
c[0].metric("steps", s.get("steps"))
c[1].metric("GPUs", s.get("world_size"))
c[2].metric("restarts", len(s.get("restarts") or []))
c[3].metric("final loss", None if s.get("final_loss") is None else f"{s['final_loss']:.5g}")
c[4].metric("device", (s.get("device") or {}).get("name") or "unknown")

st.subheader("Step time per rank")
if ranks_path.is_file():
    relative = st.toggle("relative to the median rank of each window", value=True, key="relative")
    heat = prep_ranks.rank_heatmap(ranks_path, relative=relative)
    st.plotly_chart(prep_figures.heatmap_figure(heat), key="heatmap")
else:
    st.info(f"{ranks_path} is missing: re-ingest the run for per-rank views.")
left, right = st.columns(2)
slow = prep_ranks.slowest_rank_counts(steps_path)
left.plotly_chart(prep_figures.bar_figure(slow["rank"].to_list(), slow["steps_slowest"].to_list(),
                                          x_title="rank", y_title="steps", title="how often each rank was the slowest"),
                  key="slowest")
if ranks_path.is_file():
    mem = prep_ranks.memory_per_rank(ranks_path)
    col = next((c for c in ("max_mem_peak_bytes", "max_mem_allocated_bytes") if c in mem.columns), None)
    if col is None or mem[col].null_count() == len(mem):
        right.info("No memory samples (CPU run, or memory sampling off).")
    else:
        right.plotly_chart(prep_figures.bar_figure(mem["rank"].to_list(), mem[col].to_list(), x_title="rank",
                                                   y_title="bytes", title=f"{col.removeprefix('max_')} per rank"),
                           key="memory")

st.subheader("Phase breakdown")
phases = prep_ranks.phase_breakdown(steps_path)
if phases.is_empty():
    st.info("No phase timers recorded in this run.")
else:
    st.plotly_chart(prep_figures.phase_figure(phases), key="phases")
    st.dataframe(prep_ranks.phase_totals(phases), hide_index=True, key="phase_totals",
                 column_config={"share": st.column_config.NumberColumn(format="percent")})

st.subheader("Restarts")
timeline = prep_ranks.restart_timeline(s)
st.plotly_chart(prep_figures.timeline_figure(timeline), key="timeline")
st.dataframe(timeline, hide_index=True, key="restarts")

st.subheader("Non-finite steps")
bad = prep_ranks.nonfinite_steps(steps_path)
if bad.is_empty():
    st.success("No NaN or inf in any metric.")
else:
    st.dataframe(bad, hide_index=True, key="nonfinite")

st.subheader("Warnings")
warnings = s.get("warnings") or []
for w in warnings:
    st.warning(w)
if not warnings:
    st.success("Ingest raised no warnings.")
