"""What the host point-to-point scripts (p2p_native.py, p2p_shared.py) share."""
import numpy as np


def pattern(nbytes, seed):
    """nbytes of a pattern that differs with seed and along the buffer (a shifted copy shows)."""
    return ((np.arange(nbytes, dtype=np.int64) * 7 + seed) % 251).astype(np.uint8)


def error_of(fn):
    """None when fn() returns, else the exception it raised as its type and text."""
    try:
        fn()
    except Exception as exc:  # reported as its type and text
        return {"type": type(exc).__name__, "message": str(exc)}
    return None
