"""Neighbourhood collectives of topology communicators (mixed into MPI.Topocomm).

Each is point-to-point messages along the topology's edges, posted at the call as the vector
collectives are (collectives.py, `_vector`): a block to every out-neighbour, a block from every
in-neighbour, in edge order. Two edges between the same pair of ranks (a periodic dimension of
size 1 or 2, a repeated graph edge) are told apart by that order: messages between two ranks
do not overtake each other. A PROC_NULL neighbour (off a non-periodic edge of a grid) sends
and receives nothing; its block of the receive buffer is left as it is.
"""
from ..base.mpi_constants import INTEGERS as _C
from . import message as _m
from .collectives import _wait_if, _wblocks
from .composite import VCOLL_TAG, Composite
from .request import Prequest, Request
from .staging import through_host

PROC_NULL = _C["PROC_NULL"]


def _blocks(msg, count):
    """count equal blocks of a Msg whose count is per block."""
    step = msg.count * msg.t.extent if msg.t is not None else 0
    return [msg.sub(k * step, msg.count) for k in range(count)]


class Neighborhood:
    """Neighbor_* collectives; the class supplies `inoutedges`, `_c()` and `_vector()`."""

    __slots__ = ()

    def _edges(self, what):
        self._c(what)
        return self.inoutedges

    def _post(self, what, sources, recvs, dests, sends, blocking):
        """sends[k] (packed bytes) to dests[k], recvs[k] (a Msg) from sources[k]; PROC_NULL skipped."""
        state = self._vector(what, [(d, b) for d, b in zip(dests, sends) if d != PROC_NULL],
                             [(s, m) for s, m in zip(sources, recvs) if s != PROC_NULL], None)
        return _wait_if(state, blocking)

    # --- all-gather ---------------------------------------------------------------------------
    @through_host
    def _neighbor_allgather(self, sendbuf, recvbuf, vector, blocking):
        what = "Neighbor_allgatherv" if vector else "Neighbor_allgather"
        sources, dests = self._edges(what)
        s = _m.simple(sendbuf, True, what=f"{what} sendbuf")
        if vector:
            r = _m.vector(recvbuf, False, 0, len(sources), what=f"{what} recvbuf")
            recvs = [r.block(k) for k in range(len(sources))]
        else:
            r = _m.simple(recvbuf, False, 0, len(sources), what=f"{what} recvbuf")
            recvs = _blocks(r, len(sources))
        data = s.data()
        return self._post(what, sources, recvs, dests, [data] * len(dests), blocking)

    def Neighbor_allgather(self, sendbuf, recvbuf):
        """Block k of recvbuf = the sendbuf of in-neighbour k."""
        self._neighbor_allgather(sendbuf, recvbuf, False, True)

    def Neighbor_allgatherv(self, sendbuf, recvbuf):
        self._neighbor_allgather(sendbuf, recvbuf, True, True)

    def Ineighbor_allgather(self, sendbuf, recvbuf):
        return Request._of(self._neighbor_allgather(sendbuf, recvbuf, False, False))

    def Ineighbor_allgatherv(self, sendbuf, recvbuf):
        return Request._of(self._neighbor_allgather(sendbuf, recvbuf, True, False))

    def Neighbor_allgather_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ineighbor_allgather(sendbuf, recvbuf))

    def Neighbor_allgatherv_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ineighbor_allgatherv(sendbuf, recvbuf))

    # --- all-to-all ---------------------------------------------------------------------------
    @through_host
    def _neighbor_alltoall(self, sendbuf, recvbuf, kind, blocking):
        what = {"": "Neighbor_alltoall", "v": "Neighbor_alltoallv", "w": "Neighbor_alltoallw"}[kind]
        sources, dests = self._edges(what)
        if kind == "w":
            sends = _wblocks(sendbuf, True, len(dests), f"{what} sendbuf")
            recvs = _wblocks(recvbuf, False, len(sources), f"{what} recvbuf")
        elif kind == "v":
            s = _m.vector(sendbuf, True, 0, len(dests), what=f"{what} sendbuf")
            r = _m.vector(recvbuf, False, 0, len(sources), what=f"{what} recvbuf")
            sends = [s.block(k) for k in range(len(dests))]
            recvs = [r.block(k) for k in range(len(sources))]
        else:
            s = _m.simple(sendbuf, True, 0, len(dests), what=f"{what} sendbuf")
            r = _m.simple(recvbuf, False, 0, len(sources), what=f"{what} recvbuf")
            sends, recvs = _blocks(s, len(dests)), _blocks(r, len(sources))
        return self._post(what, sources, recvs, dests, [m.data() for m in sends], blocking)

    def Neighbor_alltoall(self, sendbuf, recvbuf):
        """Block k of sendbuf goes to out-neighbour k; block k of recvbuf comes from in-neighbour k."""
        self._neighbor_alltoall(sendbuf, recvbuf, "", True)

    def Neighbor_alltoallv(self, sendbuf, recvbuf):
        self._neighbor_alltoall(sendbuf, recvbuf, "v", True)

    def Neighbor_alltoallw(self, sendbuf, recvbuf):
        self._neighbor_alltoall(sendbuf, recvbuf, "w", True)

    def Ineighbor_alltoall(self, sendbuf, recvbuf):
        return Request._of(self._neighbor_alltoall(sendbuf, recvbuf, "", False))

    def Ineighbor_alltoallv(self, sendbuf, recvbuf):
        return Request._of(self._neighbor_alltoall(sendbuf, recvbuf, "v", False))

    def Ineighbor_alltoallw(self, sendbuf, recvbuf):
        return Request._of(self._neighbor_alltoall(sendbuf, recvbuf, "w", False))

    def Neighbor_alltoall_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ineighbor_alltoall(sendbuf, recvbuf))

    def Neighbor_alltoallv_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ineighbor_alltoallv(sendbuf, recvbuf))

    def Neighbor_alltoallw_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ineighbor_alltoallw(sendbuf, recvbuf))

    # --- Python objects -------------------------------------------------------------------------
    def _neighbor_objects(self, what, objs):
        sources, dests = self._edges(what)
        p2p = self._c(what).seam.p2p
        recvs = [None if s == PROC_NULL else p2p.irecv_object(s, VCOLL_TAG) for s in sources]
        sends = [p2p.isend_object(obj, d, VCOLL_TAG) for d, obj in zip(dests, objs) if d != PROC_NULL]
        Composite(sends).Wait()
        return [None if r is None else r.wait() for r in recvs]

    def neighbor_allgather(self, sendobj):
        """[the object of each in-neighbour] (None for a PROC_NULL one)."""
        return self._neighbor_objects("neighbor_allgather", [sendobj] * len(self._edges("neighbor_allgather")[1]))

    def neighbor_alltoall(self, sendobj):
        """sendobj[k] goes to out-neighbour k; returns [the object from each in-neighbour]."""
        dests = self._edges("neighbor_alltoall")[1]
        objs = [None] * len(dests) if sendobj is None else list(sendobj)
        if len(objs) != len(dests):
            raise ValueError(f"neighbor_alltoall: {len(objs)} objects for {len(dests)} out-neighbours")
        return self._neighbor_objects("neighbor_alltoall", objs)
