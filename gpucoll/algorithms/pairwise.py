"""Pairwise-exchange all-to-all: p - 1 sendrecv steps, step s sends to rank + s and receives
from rank - s, so every link carries one message per step and nothing waits in a queue."""
from functools import lru_cache

from .steps import RECVBUF, SCRATCH, SENDBUF, StepBuilder, check_args


@lru_cache(maxsize=1024)
def alltoall(rank, size, count, inplace=True):
    """All-to-all of `count` elements per peer: block j of buffer 0 goes to rank j, block j of
    buffer 1 comes from rank j.

    With ``inplace`` (the default) the schedule is correct when buffers 0 and 1 are the same
    memory: a block that arrives before this rank has sent the block it would overwrite
    (steps s <= p - s) waits in scratch, floor(p/2) * count elements, and is copied into place
    right after that send. Pass ``inplace=False`` when the buffers are distinct to skip it."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    p = size
    scratch = (p // 2) * count if inplace and p > 1 else 0
    if count:
        b.copy(SENDBUF, rank * count, RECVBUF, rank * count, count)
        for s in range(1, p):
            to, frm = (rank + s) % p, (rank - s) % p
            staged = inplace and s <= p - s
            into = (SCRATCH, (s - 1) * count) if staged else (RECVBUF, frm * count)
            b.step(send=(to, SENDBUF, to * count, count), recv=(frm, *into, count))
            t = p - s                  # the step whose arrival overwrites the block just sent
            if inplace and t <= s:
                b.copy(SCRATCH, (t - 1) * count, RECVBUF, to * count, count)
    return b.build("alltoall", "pairwise", count, send_count=p * count, recv_count=p * count,
                   scratch_count=scratch if count else 0)
