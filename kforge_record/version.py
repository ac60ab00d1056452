"""The kforge version (its own module, so the recorder's modules read it without importing the package)."""

__version__ = "0.1.0"
