"""The README is a front door that works: short, its links lead to pages that exist, its tutorial runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub and mkdocs' toc make it."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]


def test_readme_is_short_and_starts_with_the_set_up_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert "pip install -e '.[all]' && kforge-ingest sample_runs && kforge-dash sample_runs" in first_block
    assert "apt-get install -y chromium && pip install -e '.[test]' && python3 -m pytest -q" in first_block
    assert "python3 -m pytest -q\n" in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"


def test_readme_links_lead_to_files_and_headings_that_exist():
    links = [t for t in LINK.findall(README.read_text()) if not t.startswith(("http://", "https://"))]
    assert any(t.startswith("docs/") for t in links)
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        dest = ROOT / path
        if not dest.exists() or (anchor and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"README links to what does not exist: {broken}"


@pytest.mark.slow
def test_readme_tutorial_runs(tmp_path, clean_wandb_env):
    """The tutorial's snippet, run as the README says: it records 300 steps that ingest turns into a run."""
    from kforge_dash.browse.runs import list_runs

    section = _section(README.read_text(), "Tutorial")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shell = re.search(r"```bash\n(.*?)```", section, re.S).group(1).split("#")[0].strip()
    assert len(code.splitlines()) <= 15
    assert shell.split(" && ") == ["python3 train.py", "kforge-ingest runs/", "kforge-dash runs/"]
    (tmp_path / "train.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    run = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    trained = subprocess.run([sys.executable, "train.py"], **run)
    assert trained.returncode == 0, trained.stderr
    ingest = subprocess.run([sys.executable, "-c", "from kforge_dash.cli.ingest import main; main()", "runs/"], **run)
    assert ingest.returncode == 0, ingest.stderr + ingest.stdout
    steps = pl.read_parquet(tmp_path / "runs" / "demo" / "ingested" / "steps.parquet")
    assert steps["step"].to_list() == list(range(1, 301))
    assert steps["loss"].is_finite().all() and steps["tokens"].sum() == 300 * 32
    [demo] = list_runs(tmp_path / "runs")  # what kforge-dash runs/ lists
    assert demo.name == "demo" and demo.ingested and demo.summary["flops_per_token"] == 6 * 64 * 64
    assert demo.summary["tags"] == ["tutorial"]
