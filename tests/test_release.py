"""Releases and generated reference (issue 30 points 4 and 5): one version, printed by every command and
headed in the changelog; the CLI reference lists every console script; the hand-written option table
of docs/ingest.md is gone."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _hook():
    spec = importlib.util.spec_from_file_location("generated_pages", ROOT / "docs" / "hooks" / "generated_pages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_version_has_one_source_and_heads_the_changelog():
    from setuptools.config.pyprojecttoml import read_configuration

    from kforge_record.version import __version__

    assert read_configuration(ROOT / "pyproject.toml", expand=True)["project"]["version"] == __version__
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", text, flags=re.M)
    assert versions[0] == __version__ and versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))),
                                                             reverse=True)
    # one short line per change, each with the page that says more (sqlite-utils / datasette style)
    top = text.split(f"## {__version__}", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in top.splitlines() if x.startswith("- ")]
    assert lines and all(len(x) <= 300 and re.search(r"\]\(docs/[\w/-]+\.md", x) for x in lines), lines


def test_the_cli_reference_lists_every_console_script():
    hook = _hook()
    scripts = hook.console_scripts()
    text = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert set(scripts) == set(re.findall(r"^([\w-]+) =", text, flags=re.M)) and "kforge-ingest" in scripts
    page = hook.cli_reference(scripts)
    for prog, target in scripts.items():
        module, command = target.split(":")
        assert f":module: {module}\n    :command: {command}\n    :prog_name: {prog}\n" in page
    assert hook.MARKER in (ROOT / "docs" / "reference" / "cli.md").read_text()


def test_ingest_page_has_no_hand_written_option_table():
    text = (ROOT / "docs" / "ingest.md").read_text()
    assert not re.search(r"^\| `--", text, flags=re.M)
    assert "reference/cli.md#kforge-ingest" in text


def test_changelog_page_is_the_changelog_with_links_for_docs():
    hook = _hook()
    assert hook.changelog("see [ingest](docs/ingest.md#x)") == "see [ingest](ingest.md#x)"
    assert (ROOT / "docs" / "changelog.md").read_text().strip() == hook.CHANGELOG_MARKER
