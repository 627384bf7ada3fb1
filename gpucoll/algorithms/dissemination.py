"""Dissemination barrier: ceil(log2 p) rounds of zero-length messages.

In round k (k = 1, 2, 4, ...) rank r signals r + k and waits for r - k; after the last round
every rank has heard, directly or through others, from every rank. The messages carry no data
but are real messages: a step with count 0 still sends and receives one."""
from functools import lru_cache

from .steps import RECVBUF, StepBuilder, check_args


@lru_cache(maxsize=256)
def barrier(rank, size, count=0):
    """Dissemination barrier (count is ignored)."""
    check_args(rank, size, 0)
    b = StepBuilder(rank, size, keep_empty=True)
    k = 1
    while k < size:
        # Zero elements of buffer 1: nothing is read or written (buffer 1 may not even exist).
        b.step(send=((rank + k) % size, RECVBUF, 0, 0), recv=((rank - k) % size, RECVBUF, 0, 0))
        k <<= 1
    return b.build("barrier", "dissemination", 0)
