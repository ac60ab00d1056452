"""Hosts across the runs: which machines keep straggling, throttling, costing time. Render only."""

import streamlit as st

from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse import hosts_prep as prep_hosts
from kforge_dash.browse import tables
from kforge_dash.browse.views import common
from kforge_dash.text import md_text

MAX_FINDINGS = 100  # of one host, across the runs; every finding is in each run's page and summary.json


def _pick_row():
    rows = st.session_state["hosts"].selection.rows
    if rows:  # the row's host in the box below (and the URL's ?host=)
        st.session_state["host"] = hosts[rows[0]]


st.title("Hosts")
root = common.runs_root()
runs = common.load_runs(root)
table = prep_hosts.hosts_table(runs)
if table.is_empty():
    st.info(f"No hosts known under {md_text(root)}: ingest the runs (kforge-ingest) first.")
    st.stop()
hosts = table["host"].to_list()
st.caption("One row per host across the ingested runs, most costly first (click a header to sort; click a row, or pick "
           "a host below, for the findings that name it). cost: the what-if seconds its ranks cost (the run without "
           "its stragglers) where a straggler finding names them or the cost is material, summed over the runs that "
           "know it.")
cfg = st.column_config
shown = tables.frame_missing_as_dash(table, lambda v: f"{v:,.1f}")  # a gap: text, formatted there
cost = cfg.NumberColumn("cost (s)", format=prep_hosts.COST_FORMAT) if shown["cost_s"].dtype.is_numeric() \
    else cfg.TextColumn("cost (s)")
st.dataframe(
    shown, hide_index=True, key="hosts", on_select=_pick_row, selection_mode="single-row",
    column_config={"straggler_runs": cfg.Column("straggling in (runs)"), "throttle_runs": cfg.Column("throttled in (runs)"),
                   "divergence_runs": cfg.Column("replicas diverged in (runs)"),
                   "cost_s": cost, "cost_runs": cfg.Column("cost known in (runs)")},
)
host = st.selectbox("Findings of host", hosts, index=None, key="host", bind="query-params", placeholder="pick a host")
if host is not None:
    found = prep_hosts.host_findings(runs, host)
    if not found:
        st.success(f"No finding names {md_text(host)}.")
    for item in found[:MAX_FINDINGS]:
        card = item.card
        with st.container(border=True):
            badge = prep_findings.SEVERITY_BADGE.get(card.severity) or md_text(card.severity)
            st.markdown(f"**{md_text(item.run)}** · {badge} **{md_text(card.kind)}** · {md_text(card.facts)}")
            st.markdown(md_text(card.message))  # in full, wrapped: never cut at a table's width
            if card.focus is not None:  # a real link: the run page with these steps open (?run=&focus=)
                st.page_link("views/run_detail.py", label=f"Open {card.steps} of {md_text(item.run)}",
                             icon=":material/arrow_forward:", query_params={"run": item.run, "focus": card.focus})
    if len(found) > MAX_FINDINGS:
        st.caption(f"{len(found) - MAX_FINDINGS:,} more: each run's page lists all of its findings.")
