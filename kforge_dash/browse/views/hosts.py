"""Hosts across the runs: which machines keep straggling, throttling, costing time. Render only."""

import streamlit as st

from kforge_dash.browse import hosts as prep_hosts
from kforge_dash.browse import units
from kforge_dash.browse.units import md_text
from kforge_dash.browse.views import common

st.title("Hosts")
root = common.runs_root()
runs = common.load_runs(root)
table = prep_hosts.hosts_table(runs)
if table.is_empty():
    st.info(f"No hosts known under {md_text(root)}: ingest the runs (kforge-ingest) first.")
    st.stop()
st.caption("One row per host across the ingested runs, most costly first (click a header to sort). cost: the "
           "what-if seconds its ranks cost (the run without its stragglers), summed over the runs that know it.")
cfg = st.column_config
st.dataframe(
    units.frame_missing_as_dash(table, lambda v: f"{v:,.1f}"), hide_index=True, key="hosts",
    column_config={"straggler_runs": cfg.Column("straggling in (runs)"), "throttle_runs": cfg.Column("throttled in (runs)"),
                   "cost_s": cfg.Column("cost (s)"), "cost_runs": cfg.Column("cost known in (runs)"),
                   "findings": cfg.LinkColumn("findings", display_text="its findings")},
)
host = st.selectbox("Findings of host", table["host"].to_list(), index=None, key="host", bind="query-params",
                    placeholder="pick a host")
if host is not None:
    found = prep_hosts.host_findings(runs, host)
    if found.is_empty():
        st.success(f"No finding names {md_text(host)}.")
    else:
        st.dataframe(found, hide_index=True, key="host_findings",
                     column_config={"open": cfg.LinkColumn("steps", display_text="open steps")})
