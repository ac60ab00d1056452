"""The recorder's one way to warn: once per kind of problem, and never by raising.

Test suites (and some jobs) run with ``warnings.simplefilter("error")``; there a warning becomes
an exception at the ``warnings.warn`` call, which inside the recorder would kill the writer thread
or raise into the training loop. So a warning that the filters turn into an error is written to
stderr instead, and recording goes on.
"""

from __future__ import annotations

import sys
import warnings


class Warner:
    """Warn once per kind of problem, so a failing disk does not flood the job's log."""

    def __init__(self, where: str):
        self.where = where
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if kind in self.seen:
            return
        self.seen.add(kind)
        text = f"kforge_record ({self.where}): {message}"
        try:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        except Exception:  # the filters made it an error: say it anyway, without raising
            try:
                sys.stderr.write(f"RuntimeWarning: {text}\n")
            except Exception:  # no usable stderr (closed, a broken pipe): nothing left to tell
                pass
