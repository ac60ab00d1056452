"""One run in detail: findings, goodput, ranks, memory, phases, restarts, non-finite steps, warnings. Render only."""

import streamlit as st

from kforge_dash import column_registry as reg
from kforge_dash import text
from kforge_dash.browse import detail as prep_detail
from kforge_dash.browse import diagnosis as prep_diagnosis
from kforge_dash.browse import figures as prep_figures
from kforge_dash.browse import findings as prep_findings
from kforge_dash.browse import findings_figures, tables
from kforge_dash.browse import lineage as prep_lineage
from kforge_dash.browse import ranks as prep_ranks
from kforge_dash.browse.views import chart, common, hang_card
from kforge_dash.contract import RANKS_FILE, STEPS_FILE
from kforge_dash.run_view import run_view
from kforge_dash.text import md_text

MAX_OPEN_FINDINGS = 6  # shown at once; the rest in an expander
MAX_FINDINGS = 100  # a diverged run can have hundreds: the page shows this many (most severe first)


def _go_to_run():
    st.session_state["run"] = st.session_state["other_run"]  # the bound widget puts it in the URL


def _open_focus(value: str):
    st.session_state["focus"] = value
    st.session_state["scroll_to_focus"] = True  # a finding's button: move the page to the charts it opened


# Scrolls the page to the focus section, again for 2 s while the charts above it still take their
# height, until the user scrolls. An inline script (no network); NONCE makes each request a new element.
_SCROLL_TO_FOCUS = """<script>/* NONCE */ (() => {
  let stop = false, tries = 0;
  for (const ev of ["wheel", "touchstart", "keydown"]) document.addEventListener(ev, () => { stop = true; }, {once: true});
  (function go() {
    const el = document.querySelector(".st-key-focus_section");
    if (stop || tries++ > 20) return;
    if (el && Math.abs(el.getBoundingClientRect().top) > 2) el.scrollIntoView({block: "start"});
    setTimeout(go, 100);
  })();
})();</script>"""


st.title("Run detail")
root = common.runs_root()
listing = common.load_runs(root)
# The run picker's value (also set by "pick another run" below), else the URL's ?run= on a session's first page.
wanted = st.session_state.get("run") or st.query_params.get("run")
if prep_detail.listing_is_stale(root, listing, wanted):  # deleted, re-ingested or new since the cached listing
    common.clear_listing()
    listing = common.load_runs(root)
choice = prep_detail.choose_run(root, listing, wanted)
runs = {r.name: r for r in listing if r.ingested}
if choice.run is None:
    (st.warning if choice.ingest is not None or not runs else st.error)(md_text(choice.problem))
    if choice.ingest is not None:
        common.ingest_panel(root, [choice.ingest])
    if runs:
        st.selectbox("Run", list(runs), index=None, key="other_run", on_change=_go_to_run,
                     placeholder="pick another run")
    st.stop()
name = st.selectbox("Run", list(runs), key="run", bind="query-params")
run = runs[name]
s = run.summary
hang_card.render(s)  # a hung job: what the person paged reads first

view = run_view(s)  # the same words and text as the CLI screen and kforge-report
for names in (("steps", "world_size", "mean_mfu", "final_loss"),
              ("wall_time_s", "goodput.total_s", "goodput.fraction", "restarts")):
    for col, field in zip(st.columns(4), names):
        raw = f"; here {s.get(field)!r}" if field == "final_loss" else ""  # the value as recorded (nan, 15 digits)
        col.metric(reg.label(field), view.text(field), help=reg.help_of(field) + raw)
# Where MFU's two inputs came from: a wrong one makes every MFU figure quietly wrong.
# The device here, not as a metric: "NVIDIA H100 80GB HBM3 ×8" does not fit a metric's quarter of the page.
st.caption(f"{reg.label('device').capitalize()}: {md_text(view.device)} · MFU inputs: {md_text(view.mfu_inputs)}")

st.subheader("Findings")
cards = view.cards
if "findings" not in s:
    st.info("Ingested before findings existed: re-ingest the run (kforge-ingest) to see them.")
elif not cards:
    st.success("No findings: no spike, NaN, straggler, slow episode, GPU throttling, memory growth, data stall, "
               "restart, unrecorded or missing steps.")
for i, card in enumerate(cards[:MAX_FINDINGS]):
    box = st.container(border=True) if i < MAX_OPEN_FINDINGS else None
    if box is None:
        if i == MAX_OPEN_FINDINGS:
            more = st.expander(f"{text.counted(len(cards) - MAX_OPEN_FINDINGS, 'more finding', 'more findings')}")
        box = more.container(border=True)
    badge = prep_findings.SEVERITY_BADGE.get(card.severity) or md_text(card.severity)
    box.markdown(f"{badge} **{md_text(card.kind)}** · {md_text(card.facts)}")
    box.markdown(md_text(card.message))  # in full, wrapped: never cut at a table's width
    if card.focus is not None:  # under the message, its own width: a sixth of the card cut "Open steps 10…"
        box.button(f"Open {card.steps}", key=f"open_{i}", on_click=_open_focus, args=(card.focus,),
                      help="Loss, grad norm and step time around these steps, below")
if len(cards) > MAX_FINDINGS:
    more.caption(f"{len(cards) - MAX_FINDINGS:,} more, the least severe: every finding is in "
                 f"{md_text(run.name)}/ingested/summary.json and in kforge-report.")
if view.what_if:  # from summary.json what_if: the run without its stragglers
    st.info(md_text(view.what_if), icon=":material/timer:")  # host names: as text
waterfall, mfu_fall = prep_findings.goodput_waterfall(s), prep_diagnosis.mfu_waterfall(s)
left, right = st.columns(2) if mfu_fall is not None else (st.container(), None)
if waterfall is not None:
    chart.chart(left, findings_figures.waterfall_figure(waterfall), key="goodput")
if mfu_fall is not None:
    chart.chart(right, findings_figures.mfu_waterfall_figure(mfu_fall), key="mfu_waterfall")

try:  # a damaged ingested file, or one leading outside the run: name it, keep the app up
    steps_path, ranks_path = run.file(STEPS_FILE), run.file(RANKS_FILE)
    # The buttons above and this box set the same ?focus=FIRST-LAST: a URL reproduces the view.
    options = prep_findings.focus_options(s)
    section = st.container(key="focus_section")  # what a finding's button scrolls to
    picked = section.selectbox("Open the steps of a finding (first-last)", options, index=None, key="focus",
                               bind="query-params", placeholder="pick a finding's steps") if options else None
    focus = prep_findings.parse_focus(picked)
    if focus is not None:
        chart.chart(section, findings_figures.focus_figure(prep_findings.focus_steps(steps_path, *focus), *focus),
                    key="focus_chart")
    # Scroll there after a button (the charts open ~900 px below it) or a new focus (also from the URL).
    asked = st.session_state.pop("scroll_to_focus", False)
    if focus is not None and (asked or st.session_state.get("focus_shown") != picked):
        st.session_state["focus_scrolls"] = st.session_state.get("focus_scrolls", 0) + 1
        st.html(_SCROLL_TO_FOCUS.replace("NONCE", str(st.session_state["focus_scrolls"])), unsafe_allow_javascript=True)
    st.session_state["focus_shown"] = picked
    st.subheader("Per rank")  # above its controls
    left, right = st.columns([1, 2])
    rank_metrics = prep_ranks.rank_metrics(ranks_path)
    shows = prep_findings.default_rank_metric(s, rank_metrics)  # where the straggler shows
    if shows is not None and st.session_state.get("metric_for") != name:
        st.session_state["metric"], st.session_state["metric_for"] = shows, name
    metric = left.selectbox(
        "per-rank metric", rank_metrics, key="metric",
        format_func=lambda m: prep_ranks.metric_label(m)[0])
    relative = right.toggle("relative to the median rank of each window", value=True, key="relative")
    d = prep_ranks.run_detail(steps_path, ranks_path, s, relative=relative, metric=metric)
except ValueError as e:
    st.error(md_text(e))
    st.stop()

if d.heatmap is None:
    st.info(f"{md_text(ranks_path)} is missing: re-ingest the run for per-rank views.")
else:
    chart.chart(st, prep_figures.heatmap_figure(d.heatmap), key="heatmap")
if d.phase_by_rank is not None and d.phase_by_rank.width > 1:
    st.caption(md_text(prep_ranks.per_rank_caption(d.slowest.phases if d.slowest else (), d.phase_by_rank.columns)))
    # Numbers stay numbers (right-aligned), each column to 4 decimals; a phase that did not run is 0 s, not a gap.
    # Its headers are the column registry's words (ranks.phase_per_rank: rank_metrics.phase_label).
    st.dataframe(d.phase_by_rank, hide_index=True, key="phase_by_rank", column_config={
        "rank": reg.label("rank"),
        **{c: st.column_config.NumberColumn(c, format="%.4f") for c in d.phase_by_rank.columns if c != "rank"}})
left, right = st.columns(2)
if d.slowest is None and d.phase_by_rank is not None and not d.phases_known:
    left.info("Ingested by an older kforge, which did not record its phase classes: re-ingest the run to see "
              "which rank's own work was slowest.")
elif d.slowest is None:
    left.info("No phase timers of a rank's own work (data, forward, optimizer...): which rank is slowest cannot "
              "be told apart from waiting in the collective, so it is not drawn.")
else:
    # Short enough for a half-width column at 1280 px; the own-work phases are named in the caption above.
    chart.chart(left, prep_figures.bar_figure(
        d.slowest.counts["rank"].to_list(), d.slowest.counts["steps_slowest"].to_list(), x_title="rank",
        y_title="steps", title="steps where each rank's own work was slowest"), key="slowest")
if d.memory is None:
    right.info("No memory samples (CPU run, memory sampling off, or no ranks.parquet).")
else:
    ranks, values, label = d.memory
    chart.chart(right, prep_figures.bar_figure(ranks, [v / text.GIB for v in values], x_title="rank", y_title="GiB",
                                                title=f"max {label} per rank"), key="memory")

st.subheader("Phase breakdown")
if d.phases.is_empty():
    st.info("No phase timers recorded in this run.")
else:
    chart.chart(st, prep_figures.phase_figure(d.phases), key="phases")
    st.caption("Share of the average rank's step time. A phase that did not run in a step (a checkpoint every "
               "N steps) counts 0 s there; 'other' is the step time no timer covered.")
    if d.phase_totals.note:
        st.info(md_text(d.phase_totals.note))
    st.dataframe(d.phase_totals.table, hide_index=True, key="phase_totals", column_config=common.registry_columns(
        d.phase_totals.table, {"total_s": "%.3f", "mean_s": "%.5f", "share": "percent"}))

st.subheader("Restarts")
chart.chart(st, prep_figures.timeline_figure(d.timeline, s.get("restarts") or []), key="timeline")
# A column with a gap is text there ("—" for none): its numbers still right-aligned, as in the columns without.
shown_timeline = d.timeline.drop("attempt_ids")  # the ids below, as wrapped text: a table cell cut them at every width
# Headers and their tooltips: the column registry's (as every table of the page).
st.dataframe(tables.frame_missing_as_dash(shown_timeline, str), hide_index=True, key="restarts",
             column_config=common.registry_columns(shown_timeline))
st.caption("Attempt ids (the launches' folders): " + " · ".join(
    f"attempt {a}: {md_text(ids)}" for a, ids in zip(d.timeline["attempt"], d.timeline["attempt_ids"]) if ids))
lineage = prep_lineage.lineage_table(s)
if any(r.get("in_process") for r in s.get("restarts") or []) or lineage.height > 1:
    st.markdown("**Lineage**: each segment of the run's timeline, a launch or what followed a rollback in one")
    st.dataframe(tables.frame_missing_as_dash(lineage, str), hide_index=True, key="lineage",
                 column_config=common.registry_columns(lineage, {"wall_lost_s": "%.1f"}))
    srcs = common.sources({run.name: run}, [run.name])
    branch_data = common.compare_data(srcs, ["loss"], x_axis="step", smoothing=0.0) if srcs else None
    if branch_data is not None and branch_data.branches:
        chart.chart(st, prep_figures.metric_figure(branch_data, "loss", {run.name: "#1f77b4"}), key="lineage_chart")
        st.caption("The kept line, and faint the steps each restart superseded (hover: what superseded them).")

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
