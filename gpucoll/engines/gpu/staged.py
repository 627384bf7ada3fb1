"""GPU collectives through host memory, pipelined in chunks.

Where the ranks' GPUs cannot reach each other (P2P off or missing, ranks sharing a GPU, ranks
on other hosts), a GPU call runs as host collectives on host copies of its data. All-reduce,
broadcast and reduce are element-wise, so they go in chunks of GPUCOLL_GPU_HOST_CHUNK bytes
through two pinned buffers: while the host collective works on one chunk, the copy engine
brings the next one up and takes the previous one back down, all on the call's stream (so
the call stays ordered with the caller's work on it). The other kinds, whose per-rank blocks
interleave, and every kind with GPUCOLL_GPU_HOST_CHUNK=0, go whole through pageable copies.
Every rank cuts the same chunks: they depend only on the call, never on the rank.
"""
import ctypes

import numpy as np

from ..._native import cuda
from ...base import config, dtypes
from ...base.call import HostBuffer

PIPELINED = frozenset({"allreduce", "bcast", "reduce"})


class HostStaging:
    """The pinned buffers and events of one communicator's staged GPU calls."""

    def __init__(self):
        self.chunk_bytes = config.GPU_HOST_CHUNK.get()  # read once, when the communicator is made
        self._hosts = ()   # two pinned host addresses
        self._nbytes = 0   # bytes of each
        self._events = ()

    def close(self):
        for addr in self._hosts:
            cuda.free_host(addr)
        for event in self._events:
            cuda.event_destroy(event)
        self._hosts, self._events, self._nbytes = (), (), 0

    def chunks(self, call):
        """How many host collectives the call becomes: 0 when it does not go in chunks."""
        if call.kind not in PIPELINED or not self.chunk_bytes:
            return 0
        step = max(1, self.chunk_bytes // dtypes.ITEMSIZE[call.code])
        return -(-call.count // step)

    def run(self, call, stream, rank, run_host):
        """Run GPU `call` on `stream` through host memory; run_host(send, recv, count) runs one
        host collective (HostBuffers, recv None where the rank gets no result) and blocks.
        Returns when the result is in the call's GPU buffer."""
        if self.chunks(call):
            self._pipelined(call, stream, rank, run_host)
        else:
            _whole(call, stream, run_host)

    def _pipelined(self, call, stream, rank, run_host):
        itemsize = dtypes.ITEMSIZE[call.code]
        step = max(1, self.chunk_bytes // itemsize)
        pieces = [(lo, min(call.count, lo + step)) for lo in range(0, call.count, step)]
        views = self._views(min(call.count, step) * itemsize, dtypes.numpy_dtype(call.code))
        # Which copies this rank needs: a broadcast's non-roots bring nothing up and its root
        # takes nothing back; a reduce's non-roots get no result.
        up = call.send is not None and (call.kind != "bcast" or rank == call.root)
        down = call.recv is not None and not (call.kind == "bcast" and rank == call.root)
        gets_result = call.recv is not None

        def bring_up(i):
            lo, hi = pieces[i]
            if up:
                cuda.memcpy_async(self._hosts[i % 2], call.send.addr + lo * itemsize, (hi - lo) * itemsize, stream)
            cuda.event_record(self._events[i % 2], stream)

        try:
            for i in range(min(2, len(pieces))):
                bring_up(i)
            for i, (lo, hi) in enumerate(pieces):
                cuda.event_synchronize(self._events[i % 2])
                host = HostBuffer(views[i % 2][:hi - lo], call.code, self._hosts[i % 2])
                run_host(host, host if gets_result else None, hi - lo)
                if down:
                    cuda.memcpy_async(call.recv.addr + lo * itemsize, self._hosts[i % 2], (hi - lo) * itemsize,
                                      stream)
                if i + 2 < len(pieces):
                    bring_up(i + 2)  # after piece i went down, on the same stream: the buffer is free
        finally:
            cuda.stream_synchronize(stream)  # no copy may still touch the buffers once we return

    def _views(self, nbytes, npdt):
        """The two pinned buffers as arrays of `nbytes` bytes (a multiple of npdt's size)."""
        if nbytes > self._nbytes:
            self.close()
            size = -(-nbytes // 4096) * 4096
            self._hosts = tuple(cuda.host_alloc_mapped(size)[0] for _ in range(2))
            self._events = tuple(cuda.event_create() for _ in range(2))
            self._nbytes = size
        return [np.frombuffer((ctypes.c_char * nbytes).from_address(addr), npdt) for addr in self._hosts]


def _whole(call, stream, run_host):
    """The whole call at once: pageable host copies, one host collective."""
    cuda.stream_synchronize(stream)
    npdt = dtypes.numpy_dtype(call.code)

    def to_host(buf):
        arr = np.empty(buf.count, npdt)
        addr = arr.__array_interface__["data"][0] if buf.count else 0
        if buf.count:
            cuda.memcpy_dtoh(addr, buf.addr, arr.nbytes)
        return HostBuffer(arr, call.code, addr)

    hrecv = to_host(call.recv) if call.recv is not None else None
    if call.send is None:
        hsend = None
    elif call.send is call.recv or (call.recv is not None and call.send.addr == call.recv.addr):
        hsend = hrecv
    else:
        hsend = to_host(call.send)
    run_host(hsend, hrecv, call.count)
    if hrecv is not None and hrecv.count:
        cuda.memcpy_htod(call.recv.addr, hrecv.addr, hrecv.array.nbytes)
