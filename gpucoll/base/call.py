"""One collective call as data: what every layer below the API agrees on.

A leaf (it imports only dtypes, ops, errors and the native buffer exporter): the communicator builds a `Call` from the user's arguments,
the dispatcher numbers and routes it, an engine runs it. The table of collective kinds lives
here and nowhere else; the numbers are those of `GC_KIND_*` in cython_src/include/gc_direct.h
(tests/test_call.py compares them)::

    KINDS["bcast"].rooted            # True
    Call("allgather", send, recv, block, code).nbytes   # bytes of ONE rank's block
"""
from .._native.exporter import AddressConstant
from . import dtypes, ops
from .errors import InvalidUsageError


class Kind:
    """A collective kind: its number in call signatures (`GC_KIND_*`), whether it has a root,
    whether it reduces (takes an op), and whether its `count` is the per-rank block (True) or
    the whole buffer (False)."""

    __slots__ = ("name", "id", "rooted", "reducing", "per_rank")

    def __init__(self, name, id, rooted, reducing, per_rank):  # noqa: A002 - the C enum's word
        self.name, self.id, self.rooted, self.reducing, self.per_rank = name, id, rooted, reducing, per_rank

    def __repr__(self):
        return f"Kind({self.name!r}, {self.id})"


#                  name             id  rooted reducing per_rank
KINDS = {k.name: k for k in (
    Kind("allreduce",       1, False, True,  False),
    Kind("bcast",           2, True,  False, False),
    Kind("reduce",          3, True,  True,  False),
    Kind("allgather",       4, False, False, True),
    Kind("reduce_scatter",  5, False, True,  True),
    Kind("alltoall",        6, False, False, True),
    Kind("gather",          7, True,  False, True),
    Kind("scatter",         8, True,  False, True),
    Kind("barrier",         9, False, False, False),
    Kind("allgatherv",     10, False, False, False),
    Kind("alltoallv",      11, False, False, False),
    Kind("gatherv",        12, True,  False, False),
    Kind("scatterv",       13, True,  False, False),
)}
# Run only by gpucoll.MPI's vector collectives, straight on the direct group (no Call is made).
VECTOR_KINDS = frozenset({"allgatherv", "alltoallv", "gatherv", "scatterv"})
BY_ID = {k.id: k for k in KINDS.values()}
ROOTED = frozenset(k.name for k in KINDS.values() if k.rooted)


class _InPlace(AddressConstant):
    """Marker for mpi4py's IN_PLACE: the input is taken from the receive buffer. Like mpi4py's,
    it is int-like (the MPI ABI's address -1) and an empty buffer; layers test it with `is`."""

    name, address = "IN_PLACE", -1


IN_PLACE = _InPlace()


def check_host_stream(stream):
    """Host buffers take no stream= (the one message for every method that refuses one)."""
    if stream is not None:
        raise InvalidUsageError("stream= applies to GPU buffers only; these buffers are in host memory")


class Call:
    """One validated collective call.

    `count` is the per-rank block for the kinds whose `per_rank` is set (allgather,
    reduce_scatter, alltoall, gather, scatter), else the buffer's element count; `nbytes` is
    `count` in bytes, on the host path and the GPU path alike (logs, the cost table's key).
    `stream` is what the caller passed until the dispatcher resolves it (a cudaStream_t for
    GPU buffers; host buffers take none), which it does before it gives the call its
    sequence number `seq`, so that a call refused for its stream leaves the numbering alone."""

    __slots__ = ("kind", "send", "recv", "count", "code", "op", "root", "stream", "seq", "gpu")

    def __init__(self, kind, send, recv, count, code, op=None, root=0, stream=None):
        self.kind, self.send, self.recv = kind, send, recv
        self.count, self.code, self.op, self.root = count, code, op, root
        self.stream = stream
        self.seq = None
        buf = recv if recv is not None else send
        self.gpu = buf is not None and buf.is_gpu  # the GPU engine (gpucoll/engines/gpu) runs the call

    @property
    def nbytes(self):
        """Bytes of one rank's part: count x itemsize."""
        return self.count * dtypes.ITEMSIZE[self.code]

    def table_bytes(self, nranks):
        """The call's size in the cost table (gpucoll/algorithms/selector.py): NCCL's size, the
        whole nranks x block buffer for the per-rank kinds, else nbytes."""
        return self.nbytes * nranks if KINDS[self.kind].per_rank else self.nbytes

    def signature(self):
        """(kind id, count, dtype, op, root): what every rank's call must agree on."""
        op = self.op.code if self.op is not None else -1
        return (KINDS[self.kind].id, self.count, self.code, op, self.root)


def addresses(call, rank):
    """(buffer 0, buffer 1) addresses of a call on rank `rank`, with MPI's IN_PLACE aliasing
    (docs/internals.md): allgather and gather read this rank's (the root's) block of the
    receive buffer, scatter's root keeps its own block of the send buffer, the rest use one
    buffer."""
    send = 0 if call.send is None else call.send.addr
    recv = 0 if call.recv is None else call.recv.addr
    kind = call.kind
    if call.send is None and call.recv is not None:
        if kind == "allgather":
            send = recv + rank * call.nbytes
        elif kind == "gather":
            send = recv + call.root * call.nbytes
        elif kind != "scatter":
            send = recv
    elif call.recv is None and kind == "scatter" and rank == call.root:
        recv = send + call.root * call.nbytes
    return send, recv


class HostBuffer:
    """A contiguous host buffer: `array` is a 1-D NumPy view of the elements in memory order,
    `addr` its address (gpucoll/calls/buffers.py makes them from what the caller passed)."""

    __slots__ = ("array", "addr", "count", "code", "itemsize")
    is_gpu = False

    def __init__(self, array, code, addr):
        self.array = array
        self.addr = addr
        self.count = array.size
        self.code = code
        self.itemsize = array.itemsize

    @property
    def nbytes(self):
        return self.count * self.itemsize


def describe(signature):
    """A Call.signature() in words: 'bcast count=4 dtype=float32 op=- root=1'."""
    kind, count, code, op, root = signature
    op_name = ops.ALL[op].name if op >= 0 else "-"
    name = BY_ID[kind].name if kind in BY_ID else kind
    return f"{name} count={count} dtype={dtypes.name(code)} op={op_name} root={root}"
