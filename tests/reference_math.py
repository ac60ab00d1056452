"""Expected values for tests, written as plain loops independent of the code under test."""

import math


def ema_loop(values, alpha):
    """The contract's EMA: the first finite value starts it, then a·x + (1−a)·ema; NaN/inf/None hold it."""
    out, ema = [], None
    for v in values:
        if v is not None and math.isfinite(v):
            ema = v if ema is None else alpha * v + (1 - alpha) * ema
        out.append(ema)
    return out
