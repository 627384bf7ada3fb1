"""Binomial-tree schedules: ceil(log2 p) rounds, for small and medium messages.

Ranks are renumbered relative to the root (vr = (rank - root) % p). Relative rank vr > 0 has
parent vr - lowbit(vr) and children vr + m for m = 1, 2, 4, ... < lowbit(vr) (the root: m < p).
A reduction combines children in increasing m, always as ``own OP incoming``, so every result
element has one fixed combination order whichever rank asks.
"""
from functools import lru_cache

from .steps import RECVBUF, SCRATCH, SENDBUF, StepBuilder, check_args, lowbit


def _span(vr, p):
    """Relative ranks in the subtree of vr: [vr, vr + span)."""
    return p if vr == 0 else min(lowbit(vr), p - vr)


def _children(vr, p):
    """Children of vr in increasing distance (smallest subtree first)."""
    limit = p if vr == 0 else lowbit(vr)
    out, m = [], 1
    while m < limit and vr + m < p:
        out.append(vr + m)
        m <<= 1
    return out


def _real(vr, root, p):
    return (vr + root) % p


def _parent(vr):
    return vr - lowbit(vr)


def binomial_reduce(b, root, buf, count):
    """Reduce `buf` (holding this rank's contribution) towards the root along the tree."""
    p = b.size
    vr = (b.rank - root) % p
    for child in _children(vr, p):
        b.recv(_real(child, root, p), buf, 0, count, reduce=True)
    if vr:
        b.send(_real(_parent(vr), root, p), buf, 0, count)


def binomial_bcast(b, root, buf, count):
    """Broadcast `buf` from the root along the tree (largest subtree first)."""
    p = b.size
    vr = (b.rank - root) % p
    if vr:
        b.recv(_real(_parent(vr), root, p), buf, 0, count)
    for child in reversed(_children(vr, p)):
        b.send(_real(child, root, p), buf, 0, count)


def binomial_scatter(b, root, buf, edges):
    """Scatter inside one buffer: relative rank j ends with [edges[j], edges[j + 1]) (the root
    holds everything); each rank receives its subtree's blocks at their final offsets."""
    p = b.size
    vr = (b.rank - root) % p
    if vr:
        end = vr + _span(vr, p)
        b.recv(_real(_parent(vr), root, p), buf, edges[vr], edges[end] - edges[vr])
    for child in reversed(_children(vr, p)):
        end = child + _span(child, p)
        b.send(_real(child, root, p), buf, edges[child], edges[end] - edges[child])


@lru_cache(maxsize=1024)
def allreduce(rank, size, count):
    """Tree all-reduce: binomial reduce to rank 0, then binomial broadcast, in the receive buffer."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    if count:
        b.copy(SENDBUF, 0, RECVBUF, 0, count)
        binomial_reduce(b, 0, RECVBUF, count)
        binomial_bcast(b, 0, RECVBUF, count)
    return b.build("allreduce", "tree", count, send_count=count, recv_count=count)


@lru_cache(maxsize=1024)
def bcast(rank, size, count, root):
    """Binomial broadcast of buffer 1 (the root's holds the data)."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    if count:
        binomial_bcast(b, root, RECVBUF, count)
    return b.build("bcast", "tree", count, root, recv_count=count)


@lru_cache(maxsize=1024)
def reduce(rank, size, count, root):
    """Binomial reduce into the root's buffer 1. Inner ranks combine in scratch; leaves send
    their send buffer as it is; non-root ranks never touch buffer 1."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    vr = (rank - root) % size
    leaf = not _children(vr, size)
    work = RECVBUF if vr == 0 else SENDBUF if leaf else SCRATCH
    if count:
        if work != SENDBUF:
            b.copy(SENDBUF, 0, work, 0, count)
        binomial_reduce(b, root, work, count)
    return b.build("reduce", "tree", count, root, send_count=count,
                   recv_count=count if vr == 0 else 0,
                   scratch_count=count if work == SCRATCH else 0)


@lru_cache(maxsize=1024)
def gather(rank, size, count, root):
    """Binomial gather of `count` elements per rank into the root's size * count.

    A subtree's blocks travel together in relative-rank order; the root rotates them into rank
    order at the end (root 0 needs no rotation and gathers straight into buffer 1)."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    p = size
    vr = (rank - root) % p
    span = _span(vr, p)
    kids = _children(vr, p)
    if vr == 0:
        work = RECVBUF if root == 0 else SCRATCH
    else:
        work = SCRATCH if kids else SENDBUF
    scratch = span * count if work == SCRATCH else 0
    if count:
        if work != SENDBUF:
            b.copy(SENDBUF, 0, work, 0, count)      # root 0 with IN_PLACE: the same memory
        for child in kids:
            n = min(child - vr, p - child)          # the child's span
            b.recv(_real(child, root, p), work, (child - vr) * count, n * count)
        if vr:
            b.send(_real(_parent(vr), root, p), work, 0, span * count)
        elif root:
            # Position j of scratch holds rank (root + j) % p.
            head = (p - root) * count
            b.copy(SCRATCH, 0, RECVBUF, root * count, head)
            b.copy(SCRATCH, head, RECVBUF, 0, root * count)
    return b.build("gather", "tree", count, root, send_count=count,
                   recv_count=p * count if vr == 0 else 0, scratch_count=scratch if count else 0)


@lru_cache(maxsize=1024)
def scatter(rank, size, count, root):
    """Binomial scatter of the root's size * count elements, `count` to each rank.

    A root other than 0 first rotates its input into relative-rank order in scratch; inner
    ranks receive their subtree's blocks into scratch, leaves straight into buffer 1."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    p = size
    vr = (rank - root) % p
    span = _span(vr, p)
    kids = _children(vr, p)
    if vr == 0:
        work = SENDBUF if root == 0 else SCRATCH
    else:
        work = SCRATCH if kids else RECVBUF
    scratch = span * count if work == SCRATCH else 0
    if count:
        if vr == 0 and root:
            head = (p - root) * count
            b.copy(SENDBUF, root * count, SCRATCH, 0, head)
            b.copy(SENDBUF, 0, SCRATCH, head, root * count)
        if vr:
            b.recv(_real(_parent(vr), root, p), work, 0, span * count)
        for child in reversed(kids):
            n = min(child - vr, p - child)
            b.send(_real(child, root, p), work, (child - vr) * count, n * count)
        if work != RECVBUF:
            # Last, so that IN_PLACE at the root (buffer 1 inside buffer 0) is read before written.
            b.copy(work, 0, RECVBUF, 0, count)
    return b.build("scatter", "tree", count, root, send_count=p * count if vr == 0 else 0,
                   recv_count=count, scratch_count=scratch if count else 0)
