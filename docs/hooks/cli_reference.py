"""mkdocs hook: the command-line reference (docs/reference/cli.md) made from the commands themselves.

Every console script of pyproject.toml's ``[project.scripts]`` gets a ``::: mkdocs-click`` block, so a
new command is in the reference as soon as it is a script (no line to add here), and every option,
default and help text is click's own: the reference cannot drift from ``--help``."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = "reference/cli.md"
MARKER = "<!-- the commands: [project.scripts] of pyproject.toml -->"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE}: the marker {MARKER!r} is gone; the commands would not be listed")
    return markdown.replace(MARKER, cli_reference(console_scripts()))
