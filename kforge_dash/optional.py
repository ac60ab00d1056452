"""The one helper for optional dependencies: import by name, or say which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependency(ImportError):
    """An optional package is not installed; the message names the pip extra that brings it."""


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """``import module``, or raise MissingDependency: "<purpose> needs <pkg>: pip install 'kforge[<extra>]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pkg = module.split(".", 1)[0]
        raise MissingDependency(f"{purpose} needs {pkg}: pip install 'kforge[{extra}]'") from e
