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


def install_sigterm_handler() -> bool:
    """Install the flush-on-SIGTERM handler once per process; False when called off the main thread
    (Python runs signal handlers, and lets them be installed, on the main thread only)."""
    global _previous_sigterm, _sigterm_installed
    if _sigterm_installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        _previous_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
    except (ValueError, OSError):
        pass
    return True


FIRST_CALLS = ("start_step", "phase", "end_step", "log")


def install_at_first_main_call(rec) -> None:
    """A Recorder built off the main thread (a setup thread) and used from the main thread's loop:
    its first call from the main thread installs the handler. Until then ``FIRST_CALLS`` go through
    a wrapper on the instance, which that call removes: no cost left on the hot path after it. A
    recorder only ever called from other threads keeps the wrapper (~0.1 µs a call) and is told once
    that it has no handler."""
    main = threading.main_thread().ident
    told = []

    def wrap(name):
        real = getattr(type(rec), name)

        def first_call(*args, **kwargs):
            if threading.get_ident() == main:
                install_sigterm_handler()
                for n in FIRST_CALLS:
                    rec.__dict__.pop(n, None)
            elif not told:
                told.append(True)
                _warn("sigterm-off-main", "Recorder built and called off the main thread: no SIGTERM handler yet "
                      "(Python handles signals on the main thread only; it is installed at the first call from the "
                      "main thread), so on preemption the unflushed rows are lost. Call rec.close() from your own "
                      "SIGTERM handling, or pass install_sigterm_handler=False to silence this.")
            return real(rec, *args, **kwargs)

        return first_call

    for n in FIRST_CALLS:
        setattr(rec, n, wrap(n))


def _after_fork_in_child() -> None:
    # A forked child (DataLoader worker) must never write into its parent's shard: it keeps no
    # rows (each recorder drops them at its next hand-over), and gets fresh locks, since a lock
    # held by another thread at the fork would stay held in the child forever.
    for rec in list(LIVE):
        rec._forked()
    LIVE.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
