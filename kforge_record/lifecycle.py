"""What happens to live recorders at SIGTERM, at fork and when built off the main thread.

The recorders themselves close at exit (``atexit``, registered per recorder) and in ``close()``.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref

from .warn import Warner

LIVE: "weakref.WeakSet" = weakref.WeakSet()
_previous_sigterm = None
_sigterm_installed = False
_warn = Warner("process")


def _on_sigterm(signum, frame) -> None:
    prev = _previous_sigterm
    if callable(prev) or prev == signal.SIG_IGN:
        # The job handles SIGTERM itself (often: finish the step, checkpoint, exit): flush what we
        # have and keep recording; exit or close() will close.
        for rec in list(LIVE):
            rec.flush()
        if callable(prev):
            prev(signum, frame)
        return
    # Default action: the process dies of SIGTERM. Close every recorder first (also one whose
    # close() this signal interrupted), then die as the job would have, exit status and all.
    for rec in list(LIVE):
        rec._closed = True
        rec._finish("sigterm")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def install_sigterm_handler() -> None:
    """Install the flush-on-SIGTERM handler once per process. Python runs signal handlers on the
    main thread only, so a recorder built on another thread cannot install one: it says so, once."""
    global _previous_sigterm, _sigterm_installed
    if _sigterm_installed:
        return
    if threading.current_thread() is not threading.main_thread():
        _warn("sigterm-off-main", "Recorder built off the main thread: no SIGTERM handler was installed (Python "
              "handles signals on the main thread only), so on preemption the unflushed rows are lost. Call "
              "rec.close() from your own SIGTERM handling (or build the Recorder on the main thread), or pass "
              "install_sigterm_handler=False to silence this.")
        return
    try:
        _previous_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
    except (ValueError, OSError):
        pass


def _after_fork_in_child() -> None:
    # A forked child (DataLoader worker) must never write into its parent's shard: it keeps no
    # rows (each recorder drops them at its next hand-over), and gets fresh locks, since a lock
    # held by another thread at the fork would stay held in the child forever.
    for rec in list(LIVE):
        rec._forked()
    LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
