"""Ring schedules: bandwidth-optimal, p - 1 steps per phase, each rank talks to its two neighbours.

Rank r sends to r + 1 and receives from r - 1. In a reduce-scatter phase the block that ends on
rank r travels once round the ring and is combined in ring order, always as
``own OP incoming``, so each result element has one fixed combination order; the all-gather
phase only copies, which keeps results bitwise identical on every rank.
"""
from functools import lru_cache

from .steps import RECVBUF, SCRATCH, SENDBUF, StepBuilder, check_args, partition
from .tree import binomial_scatter


def ring_reduce_scatter(b, buf, edges, last):
    """Reduce-scatter over the blocks [edges[i], edges[i + 1]) of `buf`, which holds this rank's
    input. Afterwards this rank holds the full reduction of block (rank + last) % size."""
    r, p = b.rank, b.size
    nxt, prv = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out = (r + last - 1 - s) % p     # block that arrived last step (our own at s=0)
        into = (out - 1) % p
        b.step(send=(nxt, buf, edges[out], edges[out + 1] - edges[out]),
               recv=(prv, buf, edges[into], edges[into + 1] - edges[into]), reduce=True)


def ring_allgather(b, buf, edges, own):
    """All-gather: this rank holds block (rank + own) % size of `buf`; afterwards it holds all."""
    r, p = b.rank, b.size
    nxt, prv = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out = (r + own - s) % p
        into = (out - 1) % p
        b.step(send=(nxt, buf, edges[out], edges[out + 1] - edges[out]),
               recv=(prv, buf, edges[into], edges[into + 1] - edges[into]))


@lru_cache(maxsize=1024)
def allreduce(rank, size, count):
    """Ring all-reduce: reduce-scatter then all-gather, in the receive buffer."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    if count:
        b.copy(SENDBUF, 0, RECVBUF, 0, count)   # a no-op when IN_PLACE; buffer 0 is not read again
        edges = partition(count, size)
        ring_reduce_scatter(b, RECVBUF, edges, last=1)
        ring_allgather(b, RECVBUF, edges, own=1)
    return b.build("allreduce", "ring", count, send_count=count, recv_count=count)


@lru_cache(maxsize=1024)
def reduce_scatter_block(rank, size, count):
    """Ring reduce-scatter: `count` result elements per rank, input size * count.

    Works in scratch: with IN_PLACE the result lands on the first block of the input."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    total = size * count
    scratch = total if size > 1 else 0
    if count and size == 1:
        b.copy(SENDBUF, 0, RECVBUF, 0, count)
    elif count:
        b.copy(SENDBUF, 0, SCRATCH, 0, total)
        edges = [i * count for i in range(size + 1)]
        ring_reduce_scatter(b, SCRATCH, edges, last=0)
        b.copy(SCRATCH, rank * count, RECVBUF, 0, count)
    return b.build("reduce_scatter_block", "ring", count, send_count=total, recv_count=count,
                   scratch_count=scratch if count else 0)


@lru_cache(maxsize=1024)
def allgather(rank, size, count):
    """Ring all-gather of `count` elements per rank into size * count."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    if count:
        b.copy(SENDBUF, 0, RECVBUF, rank * count, count)   # IN_PLACE: the same memory
        ring_allgather(b, RECVBUF, [i * count for i in range(size + 1)], own=0)
    return b.build("allgather", "ring", count, send_count=count, recv_count=size * count)


@lru_cache(maxsize=1024)
def bcast(rank, size, count, root):
    """Broadcast for large messages (van de Geijn): binomial scatter, then ring all-gather.

    The data lives in buffer 1 on every rank. Blocks are indexed by rank relative to the root."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    if count and size > 1:
        edges = partition(count, size)
        binomial_scatter(b, root, RECVBUF, edges)
        ring_allgather(b, RECVBUF, edges, own=-root)
    return b.build("bcast", "ring", count, root, recv_count=count)


@lru_cache(maxsize=1024)
def reduce(rank, size, count, root):
    """Reduce for large messages: ring reduce-scatter, then every rank sends its block to the root.

    Non-root ranks work in scratch and never touch buffer 1."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    is_root = rank == root
    work = RECVBUF if is_root else SCRATCH
    if count:
        b.copy(SENDBUF, 0, work, 0, count)
        edges = partition(count, size)
        ring_reduce_scatter(b, work, edges, last=0)
        if is_root:
            for k in range(1, size):
                j = (root + k) % size
                b.recv(j, RECVBUF, edges[j], edges[j + 1] - edges[j])
        else:
            b.send(root, SCRATCH, edges[rank], edges[rank + 1] - edges[rank])
    return b.build("reduce", "ring", count, root, send_count=count,
                   recv_count=count if is_root else 0,
                   scratch_count=0 if is_root or not count else count)
