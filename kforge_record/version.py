"""The kforge version (its own module, so the recorder's modules read it without importing the package)."""

__version__ = "0.2.0"  # the package's version too (pyproject.toml reads it); CHANGELOG.md has a section per version
