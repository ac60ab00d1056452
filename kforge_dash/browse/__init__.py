"""Browse: the Streamlit app (app.py, views/ that only render) and the plain functions it calls.

    runs.py       the runs root: which runs, their status, colours, the runs table, config diff
    series.py     compare charts' data: smoothing, downsampling, markers
    ranks.py      the run-detail page's data: heatmaps, per-rank phases and memory
    figures.py    plotly figures from that data
    downloads.py  CSV / Parquet downloads of the full-resolution series
"""
