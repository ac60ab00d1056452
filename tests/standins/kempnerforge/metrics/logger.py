"""KempnerForge's log line as documented: ``[rank R] INFO     [step N] key=value | key=value`` on
stdout, from rank 0 only (no colour when stdout is not a terminal)."""

from __future__ import annotations

import logging
import os
import sys


class _Stdout(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if os.environ.get("RANK", "0") == "0":
            sys.stdout.write(f"[rank 0] {record.levelname:<8} {record.getMessage()}\n")


_root = logging.getLogger("kempnerforge")
if not _root.handlers:
    _root.setLevel(logging.DEBUG)
    _root.propagate = False
    _root.addHandler(_Stdout())


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"kempnerforge.{name}")


def format_metrics(step: int, metrics: dict) -> str:
    def text(v) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    return f"[step {step}] " + " | ".join(f"{k}={text(v)}" for k, v in metrics.items())
