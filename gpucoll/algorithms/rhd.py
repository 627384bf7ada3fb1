"""Recursive halving / doubling schedules: log2 p rounds, bandwidth-optimal for powers of two.

Rabenseifner's all-reduce is a reduce-scatter by recursive halving (each round a rank keeps half
of its window and combines it as ``own OP incoming``) followed by an all-gather by recursive
doubling. For p not a power of two, the usual fold: with p' = 2**floor(log2 p) and
rem = p - p', each even rank r < 2 rem hands its whole input to r + 1 and sits out; the
remaining p' ranks ("new ranks") run the power-of-two schedule and the odd ranks hand the
result back. Every element is still combined by one rank in one fixed order.

Recursive doubling (``rd``) is the latency-bound all-reduce: lg rounds, each exchanging the
whole vector with the partner, half the rounds of Rabenseifner's at small sizes (one round on
two ranks). Every rank combines every element, so each pair of partners computes the same
expression, ``lower OP higher`` (the lower new rank's partial first), and every rank ends with
the same bits, NaN payloads and MAX/MIN ties included.
"""
from functools import lru_cache

from .steps import RECVBUF, SCRATCH, SENDBUF, StepBuilder, check_args, partition, pow2_floor


class _Fold:
    """Rank numbering of the fold: new ranks 0..p'-1 and the real rank behind each."""

    def __init__(self, size):
        self.pof2 = pow2_floor(size)
        self.rem = size - self.pof2

    def new(self, rank):
        """New rank of `rank`, or None for an even rank that sits out."""
        if rank < 2 * self.rem:
            return rank // 2 if rank % 2 else None
        return rank - self.rem

    def real(self, new):
        return 2 * new + 1 if new < self.rem else new + self.rem

    def first(self, new):
        """Lowest real rank that new rank `new` stands for (itself, or the even rank it absorbed)."""
        return 2 * new if new < self.rem else new + self.rem


def recursive_halving(b, new, fold, buf, edge):
    """Reduce-scatter among new ranks: afterwards new rank n holds the reduction of
    [edge(n), edge(n + 1)) of `buf`."""
    lo, hi = 0, fold.pof2
    mask = fold.pof2 >> 1
    while mask:
        peer = fold.real(new ^ mask)
        mid = lo + mask
        keep, give = ((lo, mid), (mid, hi)) if new < mid else ((mid, hi), (lo, mid))
        b.step(send=(peer, buf, edge(give[0]), edge(give[1]) - edge(give[0])),
               recv=(peer, buf, edge(keep[0]), edge(keep[1]) - edge(keep[0])), reduce=True)
        lo, hi = keep
        mask >>= 1


def recursive_doubling(b, new, fold, buf, edge):
    """All-gather among new ranks: new rank n holds [edge(n), edge(n + 1)); afterwards all."""
    mask = 1
    while mask < fold.pof2:
        partner = new ^ mask
        peer = fold.real(partner)
        mine = new // mask * mask
        theirs = partner // mask * mask
        b.step(send=(peer, buf, edge(mine), edge(mine + mask) - edge(mine)),
               recv=(peer, buf, edge(theirs), edge(theirs + mask) - edge(theirs)))
        mask <<= 1


@lru_cache(maxsize=1024)
def allreduce(rank, size, count):
    """Rabenseifner all-reduce (recursive halving, then recursive doubling) in buffer 1."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    fold = _Fold(size)
    new = fold.new(rank)
    if count and new is None:
        b.send(rank + 1, SENDBUF, 0, count)         # reads buffer 0 before buffer 1 is written
        b.recv(rank + 1, RECVBUF, 0, count)
    elif count:
        b.copy(SENDBUF, 0, RECVBUF, 0, count)
        if rank < 2 * fold.rem:
            b.recv(rank - 1, RECVBUF, 0, count, reduce=True)
        edges = partition(count, fold.pof2)
        recursive_halving(b, new, fold, RECVBUF, edges.__getitem__)
        recursive_doubling(b, new, fold, RECVBUF, edges.__getitem__)
        if rank < 2 * fold.rem:
            b.send(rank - 1, RECVBUF, 0, count)
    return b.build("allreduce", "rhd", count, send_count=count, recv_count=count)


@lru_cache(maxsize=1024)
def reduce_scatter_block(rank, size, count):
    """Reduce-scatter by recursive halving, `count` result elements per rank.

    Works in scratch (size * count) so that IN_PLACE input is read before buffer 1 is written.
    A new rank's window covers the blocks of the real ranks it stands for."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    fold = _Fold(size)
    new = fold.new(rank)
    total = size * count
    scratch = 0
    if count and size == 1:
        b.copy(SENDBUF, 0, RECVBUF, 0, count)
    elif count and new is None:
        b.send(rank + 1, SENDBUF, 0, total)
        b.recv(rank + 1, RECVBUF, 0, count)
    elif count:
        scratch = total
        b.copy(SENDBUF, 0, SCRATCH, 0, total)
        if rank < 2 * fold.rem:
            b.recv(rank - 1, SCRATCH, 0, total, reduce=True)
        recursive_halving(b, new, fold, SCRATCH, lambda n: fold.first(n) * count)
        if rank < 2 * fold.rem:
            b.send(rank - 1, SCRATCH, (rank - 1) * count, count)
        b.copy(SCRATCH, rank * count, RECVBUF, 0, count)
    return b.build("reduce_scatter_block", "rhd", count, send_count=total, recv_count=count,
                   scratch_count=scratch)


@lru_cache(maxsize=1024)
def allgather(rank, size, count):
    """All-gather in ceil(log2 p) rounds: recursive doubling in place for powers of two,
    Bruck's algorithm otherwise (in rotated order in scratch, rotated back at the end)."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    p = size
    scratch = 0
    if count and p & (p - 1) == 0:
        b.copy(SENDBUF, 0, RECVBUF, rank * count, count)   # IN_PLACE: the same memory
        recursive_doubling(b, rank, _Fold(p), RECVBUF, lambda n: n * count)
    elif count:
        # Position k of scratch holds the block of rank (rank + k) % p.
        scratch = p * count
        b.copy(SENDBUF, 0, SCRATCH, 0, count)
        k = 1
        while k < p:
            n = min(k, p - k)
            b.step(send=((rank - k) % p, SCRATCH, 0, n * count),
                   recv=((rank + k) % p, SCRATCH, k * count, n * count))
            k <<= 1
        head = (p - rank) * count
        b.copy(SCRATCH, 0, RECVBUF, rank * count, head)
        b.copy(SCRATCH, head, RECVBUF, 0, rank * count)
    return b.build("allgather", "rhd", count, send_count=count, recv_count=p * count,
                   scratch_count=scratch)


@lru_cache(maxsize=1024)
def allreduce_doubling(rank, size, count):
    """Recursive-doubling all-reduce in buffer 1 (scratch: one vector). Each round receives the
    partner's partial into the other of buffer 1 / scratch and combines the two there or here,
    whichever keeps ``lower OP higher``; the result is copied to buffer 1 if it ends in scratch."""
    check_args(rank, size, count)
    b = StepBuilder(rank, size)
    fold = _Fold(size)
    new = fold.new(rank)
    if count and new is None:
        b.send(rank + 1, SENDBUF, 0, count)         # reads buffer 0 before buffer 1 is written
        b.recv(rank + 1, RECVBUF, 0, count)
    elif count:
        b.copy(SENDBUF, 0, RECVBUF, 0, count)
        if rank < 2 * fold.rem:
            b.recv(rank - 1, RECVBUF, 0, count, reduce=True)
        cur, other = RECVBUF, SCRATCH
        mask = 1
        while mask < fold.pof2:
            b.step(send=(fold.real(new ^ mask), cur, 0, count), recv=(fold.real(new ^ mask), other, 0, count))
            if new & mask:                          # the partner is lower: its partial goes first
                b.combine(cur, 0, other, 0, count)
                cur, other = other, cur
            else:
                b.combine(other, 0, cur, 0, count)
            mask <<= 1
        if cur == SCRATCH:
            b.copy(SCRATCH, 0, RECVBUF, 0, count)
        if rank < 2 * fold.rem:
            b.send(rank - 1, RECVBUF, 0, count)
    return b.build("allreduce", "rd", count, send_count=count, recv_count=count,
                   scratch_count=count if new is not None and fold.pof2 > 1 else 0)
