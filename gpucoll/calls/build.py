"""From a collective's arguments to a checked Call: one builder per kind, and their checks.

Every builder takes the calling rank and the communicator's size first, then the method's
arguments as the user passed them, and either returns a `Call` (gpucoll/base/call.py) or
raises `InvalidUsageError` saying what was wrong and what to do; nothing is sent before.
The communicator (gpucoll/api/comm.py) calls them once it knows it is usable::

    call = build.allreduce(comm.rank, comm.size, gpucoll.IN_PLACE, x, gpucoll.SUM)
"""
import operator

import numpy as np

from ..base import ops as _ops
from ..base.call import IN_PLACE, Call
from ..base.dtypes import name as _dtype_name
from ..base.errors import InvalidUsageError
from ..engines.p2p.host import TAG_UB
from .buffers import host_buffer


def allreduce(rank, size, sendbuf, recvbuf, op):
    op = _ops.as_op(op)
    recv = host_buffer(recvbuf, "recvbuf", writable=True)
    send = recv if sendbuf is IN_PLACE else host_buffer(sendbuf, "sendbuf")
    same_shape(send, recv, "sendbuf", "recvbuf", "Allreduce")
    no_overlap(send, recv, 0, "Allreduce")
    op.check(recv.code)
    return Call("allreduce", send, recv, recv.count, recv.code, op)


def bcast(rank, size, buf, root):
    root = checked_root(root, size)
    b = host_buffer(buf, "buf", writable=rank != root)
    return Call("bcast", b, b, b.count, b.code, root=root)


def reduce(rank, size, sendbuf, recvbuf, op, root):
    op = _ops.as_op(op)
    root = checked_root(root, size)
    if rank == root:
        recv = host_buffer(recvbuf, "recvbuf", writable=True)
        send = recv if sendbuf is IN_PLACE else host_buffer(sendbuf, "sendbuf")
        same_shape(send, recv, "sendbuf", "recvbuf", "Reduce")
        no_overlap(send, recv, 0, "Reduce")
    else:
        if sendbuf is IN_PLACE:
            raise InvalidUsageError("Reduce: IN_PLACE is only allowed on the root")
        send = host_buffer(sendbuf, "sendbuf")
        recv = None
    op.check(send.code)
    return Call("reduce", send, recv, send.count, send.code, op, root)


def allgather(rank, size, sendbuf, recvbuf):
    recv = host_buffer(recvbuf, "recvbuf", writable=True, blocks=size)
    divisible(recv, size, "Allgather", "recvbuf")
    block = recv.count // size
    if sendbuf is IN_PLACE:
        send = None
    else:
        send = host_buffer(sendbuf, "sendbuf")
        block_fits(send, recv, block, size, "Allgather", "sendbuf", "recvbuf")
        no_overlap(send, recv, rank * send.nbytes, "Allgather")
    return Call("allgather", send, recv, block, recv.code)


def reduce_scatter_block(rank, size, sendbuf, recvbuf, op):
    op = _ops.as_op(op)
    # MPI: with IN_PLACE the input is the whole recvbuf, the result lands in its first block.
    blocks = size if sendbuf is IN_PLACE else 1
    recv = host_buffer(recvbuf, "recvbuf", writable=True, blocks=blocks)
    if sendbuf is IN_PLACE:
        divisible(recv, size, "Reduce_scatter_block", "recvbuf")
        block = recv.count // size
        send = None
    else:
        send = host_buffer(sendbuf, "sendbuf", blocks=size)
        block = recv.count
        block_fits(recv, send, block, size, "Reduce_scatter_block", "recvbuf", "sendbuf")
        no_overlap(recv, send, 0, "Reduce_scatter_block")
    op.check(recv.code)
    return Call("reduce_scatter", send, recv, block, recv.code, op)


def alltoall(rank, size, sendbuf, recvbuf):
    recv = host_buffer(recvbuf, "recvbuf", writable=True, blocks=size)
    divisible(recv, size, "Alltoall", "recvbuf")
    if sendbuf is IN_PLACE:
        send = None
    else:
        send = host_buffer(sendbuf, "sendbuf", blocks=size)
        same_shape(send, recv, "sendbuf", "recvbuf", "Alltoall")
        no_overlap(send, recv, 0, "Alltoall")
    return Call("alltoall", send, recv, recv.count // size, recv.code)


def gather(rank, size, sendbuf, recvbuf, root):
    root = checked_root(root, size)
    if rank == root:
        recv = host_buffer(recvbuf, "recvbuf", writable=True, blocks=size)
        divisible(recv, size, "Gather", "recvbuf")
        block = recv.count // size
        send = None if sendbuf is IN_PLACE else host_buffer(sendbuf, "sendbuf")
        if send is not None:
            block_fits(send, recv, block, size, "Gather", "sendbuf", "recvbuf")
            no_overlap(send, recv, root * send.nbytes, "Gather")
        code = recv.code
    else:
        if sendbuf is IN_PLACE:
            raise InvalidUsageError("Gather: IN_PLACE is only allowed on the root")
        send, recv = host_buffer(sendbuf, "sendbuf"), None
        block, code = send.count, send.code
    return Call("gather", send, recv, block, code, root=root)


def scatter(rank, size, sendbuf, recvbuf, root):
    root = checked_root(root, size)
    if rank == root:
        send = host_buffer(sendbuf, "sendbuf", blocks=size)
        divisible(send, size, "Scatter", "sendbuf")
        block = send.count // size
        recv = None if recvbuf is IN_PLACE else host_buffer(recvbuf, "recvbuf", writable=True)
        if recv is not None:
            block_fits(recv, send, block, size, "Scatter", "recvbuf", "sendbuf")
            no_overlap(recv, send, root * recv.nbytes, "Scatter")
        code = send.code
    else:
        if recvbuf is IN_PLACE:
            raise InvalidUsageError("Scatter: IN_PLACE is only allowed on the root")
        send, recv = None, host_buffer(recvbuf, "recvbuf", writable=True)
        block, code = recv.count, recv.code
    return Call("scatter", send, recv, block, code, root=root)


def barrier(rank, size):
    return Call("barrier", None, None, 0, 0)


# --- the checks --------------------------------------------------------------------------------
def checked_root(root, size):
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
        raise InvalidUsageError(f"root must be an integer rank, not {root!r} ({type(root).__name__})")
    if not 0 <= root < size:
        raise InvalidUsageError(f"root {root!r} is out of range for a communicator of size {size}")
    return int(root)


def user_tag(tag):
    """Tags of user messages are integers from 0 to TAG_UB, as in MPI (negative ones are gpucoll's own)."""
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag <= TAG_UB:
        raise InvalidUsageError(f"message tag {tag!r} is not allowed: use an integer from 0 to {TAG_UB}")
    return int(tag)


def integer(value):
    """value as an int when it is an integer (NumPy's included), else None."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def same_shape(a, b, an, bn, what):
    if a.count != b.count or a.code != b.code:
        raise InvalidUsageError(
            f"{what}: {an} ({a.count} x {_dtype_name(a.code)}) and {bn} ({b.count} x {_dtype_name(b.code)}) "
            "must have the same number of elements and the same dtype")


def no_overlap(part, whole, offset, what):
    """Overlapping send and receive buffers are an error, except in the one layout that
    means IN_PLACE: `part` starting exactly `offset` bytes into `whole`."""
    if part is whole or part.addr == whole.addr + offset:
        return
    if part.addr < whole.addr + whole.nbytes and whole.addr < part.addr + part.nbytes and part.nbytes:
        raise InvalidUsageError(f"{what}: sendbuf and recvbuf overlap in memory; pass gpucoll.IN_PLACE as "
                                "sendbuf to reuse the receive buffer, or use separate buffers")


def divisible(buf, size, what, name):
    if buf.count % size:
        raise InvalidUsageError(f"{what}: {name} has {buf.count} elements, not a multiple of the "
                                f"communicator size {size}")


def block_fits(block_buf, whole_buf, block, size, what, bn, wn):
    if block_buf.code != whole_buf.code:
        raise InvalidUsageError(f"{what}: {bn} is {_dtype_name(block_buf.code)} but {wn} is "
                                f"{_dtype_name(whole_buf.code)}")
    if block_buf.count * size != whole_buf.count or block_buf.count != block:
        raise InvalidUsageError(
            f"{what}: {wn} must hold size x {bn} = {size} x {block_buf.count} elements, "
            f"it holds {whole_buf.count}")
