"""Runs table (one row per run, sortable) and the config diff of selected runs. Render only."""

import streamlit as st

from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse.views import common

st.title("Runs")
root = common.runs_root()
runs = common.load_runs(root)
common.ingest_panel(root, runs)
if not runs:
    st.info(f"No runs under {root}.")
    st.stop()

cfg = st.column_config
st.dataframe(
    prep_runs.runs_table(runs), hide_index=True, key="runs_table",
    column_config={
        "wall_time_h": cfg.NumberColumn("wall time (h)", format="%.3f"),
        "final_loss": cfg.NumberColumn("final loss", format="%.4f"),
        "best_loss": cfg.NumberColumn("best loss", format="%.4f"),
        "mean_mfu": cfg.NumberColumn("mean MFU", format="percent"),
        "peak_mem_gib": cfg.NumberColumn("peak mem (GiB)", format="%.2f"),
        "tokens": cfg.NumberColumn("tokens", format="compact"),
        "goodput": cfg.NumberColumn("goodput", format="percent", help="productive share of the wall clock"),
        "findings": cfg.NumberColumn("findings", help="spikes, NaNs, stragglers ... (Run detail lists them)"),
    },
)

st.subheader("Config diff")
ingested = [r for r in runs if r.ingested]
names = st.multiselect("Runs to diff", [r.name for r in ingested], default=[r.name for r in ingested],
                       key="diff_runs")
if len(names) < 2:
    st.info("Pick at least two runs to see what differs.")
    st.stop()
diff = prep_runs.config_diff([r for r in ingested if r.name in names])
if diff.is_empty():
    st.success("These runs have the same configuration.")
else:
    st.caption(f"{len(diff)} key(s) differ; keys with the same value everywhere are hidden.")
    st.dataframe(diff, hide_index=True, key="config_diff")
