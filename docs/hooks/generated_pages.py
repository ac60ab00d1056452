"""mkdocs hook: the pages made from something else, so they cannot drift from it.

- docs/reference/cli.md: every console script of pyproject.toml's ``[project.scripts]`` gets a
  ``::: mkdocs-click`` block, so a new command is in the reference as soon as it is a script (no line
  to add here), and every option, default and help text is click's own ``--help``.
- docs/changelog.md: CHANGELOG.md, its ``docs/PAGE.md`` links made relative to docs/ (they are
  written for the repository's root, where CHANGELOG.md lives)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = "reference/cli.md"
MARKER = "<!-- the commands: [project.scripts] of pyproject.toml -->"
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CHANGELOG_PAGE = "changelog.md"
CHANGELOG_MARKER = "<!-- CHANGELOG.md -->"


def console_scripts(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """``{"kforge-ingest": "kforge_dash.cli.ingest:main", ...}`` in the file's order."""
    section = pyproject.read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^\s*([\w.-]+)\s*=\s*"([\w.]+:\w+)"', section, flags=re.M))


def cli_reference(scripts: dict[str, str]) -> str:
    """The mkdocs-click blocks of ``scripts``, one section per command."""
    blocks = []
    for prog, target in scripts.items():
        module, command = target.split(":")
        blocks.append(f"::: mkdocs-click\n    :module: {module}\n    :command: {command}\n    :prog_name: {prog}\n"
                      "    :depth: 1\n    :style: plain\n")
    return "\n".join(blocks)


def changelog(text: str) -> str:
    """CHANGELOG.md for docs/: ``](docs/ingest.md#x)`` -> ``](ingest.md#x)``."""
    return re.sub(r"\]\(docs/", "](", text)


def _fill(markdown: str, page: str, marker: str, content: str) -> str:
    if marker not in markdown:
        raise ValueError(f"{page}: the marker {marker!r} is gone; the page would be empty")
    return markdown.replace(marker, content)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == PAGE:
        return _fill(markdown, PAGE, MARKER, cli_reference(console_scripts()))
    if page.file.src_uri == CHANGELOG_PAGE:
        return _fill(markdown, CHANGELOG_PAGE, CHANGELOG_MARKER, changelog((ROOT / "CHANGELOG.md").read_text()))
    return markdown
