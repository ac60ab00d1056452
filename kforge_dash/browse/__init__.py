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
    columns.py    which charts the compare page opens with: the steps.parquet columns that hold a value
    preview.py    a static SVG of a compare chart, shown while plotly.js loads
    overlap.py    lines that would hide each other, drawn dashed
    live.py       whether a run is live (being written)
    detail.py     which run the run page shows for its ?run=, and what it says when it cannot
    rank_metrics.py  what the per-rank heatmap can show and how each is named
    findings.py   the findings and goodput of summary.json, prepared for the pages
    findings_figures.py  plotly figures of the findings and goodput
    diagnosis.py  the run's MFU waterfall, prepared for the run page
    hang.py       a hang finding as text lines, and the per-rank strip the run page draws
    launch_segments.py  the run page's restart chart: each launch's kept, re-run and unrecorded steps
    hosts_prep.py the Hosts page's data: the hosts across runs, the findings naming one host
    app.py        the Streamlit app: its pages, in views/
    views/        the pages (render only)
"""
