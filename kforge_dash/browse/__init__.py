"""Browse: the Streamlit app (app.py, views/ that only render), kforge-report, and the plain functions they call.

    runs.py       the runs root: which runs, their status, colours, config diff
    runs_table.py the runs table of the Runs page and kforge-report (columns and words: the column registry)
    series.py     compare charts' data: x axes, downsampling, markers, zoomed step ranges
    smoothing.py  each series smoothed by its own density
    groups.py     groups of runs: mean line and min-max / ±std band
    zoom.py       a box dragged on a chart as a step range to re-read
    lineage.py    a run's lineage: segments of launches and rollbacks, superseded steps as faint branches
    ranks.py      the run-detail page's data: heatmaps, per-rank phases and memory
    figures.py    plotly figures from that data (names escaped as plotly text)
    tables.py     tables for display: a missing value as "—", the config diff as text (numbers: kforge_dash/text.py)
    downloads.py  CSV / Parquet downloads of the full-resolution series
    report.py     kforge-report: one self-contained HTML file
"""
