"""Runs table (one row per run, sortable) and the config diff of selected runs. Render only."""

import pandas as pd
import streamlit as st

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.browse import runs as prep_runs
from kforge_dash.browse import runs_table, tables
from kforge_dash.browse.views import common
from kforge_dash.text import md_text

st.title("Runs")
root = common.runs_root()
runs = common.load_runs(root)
common.ingest_panel(root, runs)
if not runs:
    st.info(md_text(prep_runs.no_runs_message(root, runs)))
    st.stop()

cfg = st.column_config
# Columns without a gap stay numbers (they sort as numbers; the Styler only says how they read);
# a column with a gap is shown as text with "—" (Streamlit would print "None").
# The table fits a 1400 px window: the page's side margins narrowed, columns that say the same on every
# row said once above it (runs_table.table_columns), findings and warnings next to the names.
# The sidebar holds only the page links here: narrower, so the table's last column (tags) fits 1280 px too.
st.html("<style>.stMainBlockContainer { padding-left: 1.5rem; padding-right: 1.5rem; }\n"
        "section[data-testid='stSidebar'] { width: 240px !important; min-width: 240px !important; }</style>")
data = runs_table.runs_table(runs)
if (note := runs_table.runs_table_note(data)) is not None:
    st.caption(md_text(note))
formats = runs_table.formats(data)  # the column registry's: the same text as kforge-report's runs table
rows = tables.with_missing_as_dash(data.to_dicts(), formats)
table = pd.DataFrame(rows, columns=data.columns)
numeric = {c: f for c, f in formats.items() if c in table and pd.api.types.is_numeric_dtype(table[c])}
shown = table.style.format(numeric, na_rep=text.MISSING)
st.dataframe(
    # every run on the page up to 30 (Streamlit's default shows 10 and scrolls inside the table), then a tall table
    shown, hide_index=True, key="runs_table", column_order=runs_table.table_columns(data),
    height="content" if len(table) <= 30 else 1000,
    # labels and tooltips from the column registry, as kforge-report's
    column_config={c: cfg.Column(reg.label(c), help=reg.help_of(c)) for c in data.columns},
)

st.subheader("Config diff")
ingested = [r for r in runs if r.ingested]
names = st.multiselect("Runs to diff", [r.name for r in ingested], default=[r.name for r in ingested],
                       key="diff_runs")
# Each picked run wears its own colour, the one it has on every chart (runs claim colours oldest first).
styles = prep_runs.run_styles(prep_runs.claim_order(runs))
st.html("<style>\n" + "\n".join(common.tag_rules([styles[n] for n in names], "diff_runs")) + "\n</style>")
if len(names) < 2:
    st.info("Pick at least two runs to see what differs.")
    st.stop()
diff = prep_runs.config_diff([r for r in ingested if r.name in names])
if diff.is_empty():
    st.success("These runs have the same configuration.")
else:
    st.caption(f"{text.counted(len(diff), 'key')} {text.agrees(len(diff), 'differs', 'differ')}; "
               "keys with the same value everywhere are hidden. "
               f"Values as JSON; {text.NOT_SET}: the run has no such key.")
    st.dataframe(tables.config_diff_text(diff, prep_runs.launch_changes([r for r in ingested if r.name in names])),
                 hide_index=True, key="config_diff")
