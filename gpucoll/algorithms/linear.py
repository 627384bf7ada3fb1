"""Linear (flat-tree) gather and scatter: the root talks to every rank in turn.

p - 1 steps at the root but a single message per rank, straight between the final buffers:
no scratch, no forwarding. Better than a binomial tree once messages are large enough that
forwarding subtrees costs more than the extra start-ups."""
from functools import lru_cache

from .steps import RECVBUF, SENDBUF, StepBuilder, check_args


def _others(root, size):
    """Ranks other than the root, in a fixed order starting after the root."""
    return [(root + k) % size for k in range(1, size)]


@lru_cache(maxsize=1024)
def gather(rank, size, count, root):
    """Linear gather of `count` elements per rank into the root's size * count."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    if count and rank == root:
        b.copy(SENDBUF, 0, RECVBUF, root * count, count)   # IN_PLACE: the same memory
        for j in _others(root, size):
            b.recv(j, RECVBUF, j * count, count)
    elif count:
        b.send(root, SENDBUF, 0, count)
    return b.build("gather", "linear", count, root, send_count=count,
                   recv_count=size * count if rank == root else 0)


@lru_cache(maxsize=1024)
def scatter(rank, size, count, root):
    """Linear scatter of the root's size * count elements, `count` to each rank."""
    check_args(rank, size, count, root)
    b = StepBuilder(rank, size)
    if count and rank == root:
        for j in _others(root, size):
            b.send(j, SENDBUF, j * count, count)
        b.copy(SENDBUF, root * count, RECVBUF, 0, count)   # last: IN_PLACE reads before writing
    elif count:
        b.recv(root, RECVBUF, 0, count)
    return b.build("scatter", "linear", count, root, send_count=size * count if rank == root else 0,
                   recv_count=count)
