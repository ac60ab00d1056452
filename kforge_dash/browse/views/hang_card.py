"""The run page's hang card (a hung launch, summary.json kind ``hang``): shown first. Render only;
the text and the per-rank strip come from browse/hang.py. Names from disk are shown as text."""

import streamlit as st

from kforge_dash.browse.hang import hang_lines, hang_of, rank_strip
from kforge_dash.text import md_text


def render(summary: dict) -> None:
    f = hang_of(summary)
    if f is None:
        return
    with st.container(border=True, key="hang_card"):
        st.error(md_text(f"Hung: {f.get('message')}"))
        cells = rank_strip(f)
        if cells:
            st.caption("Each rank: its role (outliers: the ranks the others wait for), last ended step and phase")
            st.dataframe({"rank": [c.rank for c in cells], "role": [c.role for c in cells],
                          "last step": [c.last_step for c in cells], "phase": [c.phase or "" for c in cells]},
                         hide_index=True, height=min(400, 38 + 35 * len(cells)))
        st.text("\n".join(hang_lines(f)))  # frames, groups, hosts: plain text, never Markdown
