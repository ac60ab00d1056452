"""numpy loaded with its OpenBLAS threads told to sleep as soon as they are idle (on import).

Ingest makes no BLAS call, yet OpenBLAS starts a thread per core as numpy loads, and each spins
~0.1 s before it sleeps (and again after every BLAS call): ~0.1 CPU-s of a 3-4 CPU-s ingest.
OPENBLAS_THREAD_TIMEOUT (read once, as the library loads) ends the spin at once; the threads stay,
so a caller's own matrix products run on as many cores as before. Only when numpy is not loaded
yet and the variable is unset; the environment is left as it was. Imported first by every way
into ingest that loads numpy (ingest/run.py, and pipeline.py, whose exporters' polars load numpy
before run.py is reached).
"""

from __future__ import annotations

import os
import sys


def _import_numpy_with_idle_blas_threads() -> None:
    if "numpy" in sys.modules or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"  # the least OpenBLAS takes: 2^4 cycles of spinning
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass  # the caller's own check (optional.require) says what is missing
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]


_import_numpy_with_idle_blas_threads()
