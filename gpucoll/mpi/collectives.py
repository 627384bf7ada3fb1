"""The buffer collectives of MPI.Comm: mpi4py's messages -> gpucoll's engines.

Three paths, in order of preference:
  native     the message is gpucoll's own kind of buffer (a GPU array, or host memory of a
             dtype and op the engines reduce): the gpucoll Communicator runs the call as it is.
  bytes      data movement (Bcast, Gather, Scatter, Allgather, Alltoall) of any datatype: the
             engines move the packed bytes (a view when the layout is contiguous, else packed
             and unpacked around the call).
  composite  what the engines lack, built on them: reductions with other ops or types (LAND,
             MAXLOC, user ops, long double) gather every rank's data with the engines' all-gather
             (or gather) and combine it in rank order here; Scan/Exscan likewise; the vector
             collectives (Gatherv, Scatterv, Allgatherv, Alltoallv, Alltoallw) are point-to-point
             messages between the ranks, every one posted when the call is made.
Blocking calls wait; I* calls return a Request at once; *_init calls a persistent Prequest.
"""
import functools
import operator

import numpy as np

from ..api.comm import IN_PLACE
from ..base import dtypes as _dtypes
from ..base import ops as _core_ops
from ..base.call import KINDS, VECTOR_KINDS
from ..base.errors import GpucollError, InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from ..calls.buffers import host_buffer
from ..engines.p2p.host import MPIShortCalls
from . import message as _m
from .composite import VCOLL_TAG, VDIRECT_TAG, Composite, done
from .op import PREDEFINED as _OPS
from .op import as_op, check, combine
from .request import Prequest, Request
from .staging import staged, through_host

ERR_ROOT = _C["ERR_ROOT"]
_CORE_DTYPES = {np.dtype(n) for n in _dtypes.NAMES if n != "bfloat16"}
_SUM = _OPS["SUM"]


def check_root(core, root):
    """root as an int, or MPI.Exception(ERR_ROOT) on every rank that passed a bad one."""
    try:
        value = operator.index(root)
    except TypeError:
        raise InvalidUsageError(f"root must be an integer rank, not {root!r}", error_class=ERR_ROOT) from None
    if not 0 <= value < core.size:
        raise InvalidUsageError(f"root {value} is out of range for a communicator of size {core.size}",
                                error_class=ERR_ROOT)
    return value


def _issue(blocking, now, later, *args):
    """Run gpucoll's blocking method `now`, or start the nonblocking `later` and return its request."""
    if blocking:
        now(*args)
        return None
    return later(*args)


def _gpu_issue(blocking, now, later, name, msgs, *args):
    """_issue of a call on GPU messages, then the scatter back of those of derived datatypes
    (Msg.unpack: enqueued after the call, in stream order); a nonblocking call's request
    completes once they are back in place."""
    state = _issue(blocking, now, later, *args)
    unpacks = [m.unpack for m in msgs if m is not None and m.unpack is not None]
    if not unpacks:
        return state

    def unpack_all():
        for unpack in unpacks:
            unpack()
    return _then(state, unpack_all, blocking, name)


def _then(state, finish, blocking, name):
    """After `state` (a started gpucoll request, or None when it ran already): `finish`."""
    if blocking:
        if state is not None:
            state.Wait()
        return finish() if finish is not None else None
    if finish is None:
        return state if state is not None else done(name=name)
    return Composite([state] if state is not None else [], finish, name)


class _Landing:
    """Where the packed bytes of a received message go: its memory when contiguous, else a
    temporary that finish() unpacks."""

    def __init__(self, msg, nbytes=None):
        self.msg = msg
        self.direct = msg.dense()
        self.buf = msg.span() if self.direct else np.empty(msg.nbytes if nbytes is None else nbytes, np.uint8)

    def finish(self, nbytes=None):
        """Unpack what arrived (nbytes of it: a receive may get a shorter message)."""
        if not self.direct:
            self.msg.store(self.buf if nbytes is None else self.buf[:nbytes])


def _send_recv(sendbuf, recvbuf):
    """The (spec, writable, label) pairs of staging.staged for a call's sendbuf and recvbuf."""
    return [(sendbuf, False, "sendbuf"), (recvbuf, True, "recvbuf")]


def _gpu_folds(op, msg):
    """Whether gpucoll's GPU path reduces msg's elements with op (SUM, PROD, MAX, MIN, AVG, BAND,
    BOR, BXOR: the ops with a core op; complex elements only by SUM and AVG, which the kernels fold
    as pairs of reals); the rest goes through host memory, on every rank alike (op and datatype
    are the same on every rank)."""
    if op.core is None:
        return False
    element = msg.t.np if msg.t is not None else None
    if element is None:  # a derived datatype: the GPU path moves a packed copy of its elements
        element = getattr(msg.gpu, "dtype", None)
    return element is None or np.dtype(element).kind != "c" or op.core in (_core_ops.SUM, _core_ops.AVG)


def _native_reduction(msg, op):
    """The dtype view and core op when gpucoll's engines reduce this message with this op."""
    core = op.core
    if core is None or msg.gpu is not None:
        return None
    t = msg.t
    if t is None or t.code is None or not msg.dense() or t.np is None or t.np not in _CORE_DTYPES:
        return None
    return core


def _fold(chunks, op, datatype, upto):
    """chunks[0] op chunks[1] op ... op chunks[upto-1] (in that order), as a new array."""
    acc = chunks[upto - 1].copy()
    for k in range(upto - 2, -1, -1):
        combine(op, chunks[k], acc, datatype)
    return acc


class Collectives:
    """Buffer collectives (mixed into MPI.Comm, which supplies `_c()` and `rank`/`size`)."""

    __slots__ = ()

    # --- barrier ------------------------------------------------------------------------------
    Barrier = MPIShortCalls.Barrier  # native: the host fast path with no Python frame between

    def Ibarrier(self):
        return Request._of(self._c("Ibarrier").Ibarrier())

    def Barrier_init(self, info=None):
        return Prequest._persistent(self.Ibarrier)

    # --- broadcast ----------------------------------------------------------------------------
    def _bcast(self, buf, root, blocking):
        core = self._c("Bcast")
        root = check_root(core, root)
        msg = _m.simple(buf, core.rank == root, root, what="Bcast buf")
        if msg.gpu is not None:
            return _gpu_issue(blocking, core.Bcast, core.Ibcast, "Ibcast", (msg,), msg.gpu, root)
        if core.rank == root:
            return _issue(blocking, core.Bcast, core.Ibcast, msg.data(), root)
        land = _Landing(msg)
        return _then(_issue(blocking, core.Bcast, core.Ibcast, land.buf, root), land.finish, blocking, "Ibcast")

    def Bcast(self, buf, root=0):
        """Copy root's buf to every rank's buf."""
        plain = _plain(buf, writable=True)
        if plain is not None and self._s is not None:
            core = self._s.core
            core.Bcast(plain, check_root(core, root))
            return
        self._bcast(buf, root, True)

    def Ibcast(self, buf, root=0):
        return Request._of(self._bcast(buf, root, False))

    def Bcast_init(self, buf, root=0, info=None):
        return Prequest._persistent(lambda: self.Ibcast(buf, root))

    # --- gather / scatter ---------------------------------------------------------------------
    def _gather(self, sendbuf, recvbuf, root, blocking):
        core = self._c("Gather")
        root = check_root(core, root)
        size, rank = core.size, core.rank
        if rank != root:
            s = _m.simple(sendbuf, True, root, what="Gather sendbuf")
            data = s.gpu if s.gpu is not None else s.data()
            return _issue(blocking, core.Gather, core.Igather, data, None, root)
        r = _m.simple(recvbuf, False, root, size, what="Gather recvbuf")
        s = None if _m.is_in_place(sendbuf) else _m.simple(sendbuf, True, what="Gather sendbuf")
        if r.gpu is not None or (s is not None and s.gpu is not None):
            return _gpu_issue(blocking, core.Gather, core.Igather, "Igather", (r,), IN_PLACE if s is None else s.gpu,
                              r.gpu, root)
        whole = r.with_count(r.count * size)
        land = _Landing(whole)
        if s is None and not land.direct:  # the root's own block, in place in recvbuf, packed too
            block = r.nbytes
            land.buf[root * block:(root + 1) * block] = r.sub(root * r.count * r.t.extent, r.count).data()
        send = IN_PLACE if s is None else s.data()
        return _then(_issue(blocking, core.Gather, core.Igather, send, land.buf, root), land.finish, blocking,
                     "Igather")

    def Gather(self, sendbuf, recvbuf, root=0):
        """root's recvbuf = every rank's sendbuf, in rank order."""
        self._gather(sendbuf, recvbuf, root, True)

    def Igather(self, sendbuf, recvbuf, root=0):
        return Request._of(self._gather(sendbuf, recvbuf, root, False))

    def Gather_init(self, sendbuf, recvbuf, root=0, info=None):
        return Prequest._persistent(lambda: self.Igather(sendbuf, recvbuf, root))

    def _scatter(self, sendbuf, recvbuf, root, blocking):
        core = self._c("Scatter")
        root = check_root(core, root)
        size, rank = core.size, core.rank
        if rank != root:
            r = _m.simple(recvbuf, False, root, what="Scatter recvbuf")
            if r.gpu is not None:
                return _gpu_issue(blocking, core.Scatter, core.Iscatter, "Iscatter", (r,), None, r.gpu, root)
            land = _Landing(r)
            return _then(_issue(blocking, core.Scatter, core.Iscatter, None, land.buf, root), land.finish,
                         blocking, "Iscatter")
        s = _m.simple(sendbuf, True, root, size, what="Scatter sendbuf")
        r = None if _m.is_in_place(recvbuf) else _m.simple(recvbuf, False, what="Scatter recvbuf")
        if s.gpu is not None or (r is not None and r.gpu is not None):
            return _gpu_issue(blocking, core.Scatter, core.Iscatter, "Iscatter", (r,), s.gpu,
                              IN_PLACE if r is None else r.gpu, root)
        data = s.with_count(s.count * size).data()
        if r is None:
            return _issue(blocking, core.Scatter, core.Iscatter, data, IN_PLACE, root)
        land = _Landing(r)
        return _then(_issue(blocking, core.Scatter, core.Iscatter, data, land.buf, root), land.finish, blocking,
                     "Iscatter")

    def Scatter(self, sendbuf, recvbuf, root=0):
        """Block i of root's sendbuf goes to rank i's recvbuf."""
        self._scatter(sendbuf, recvbuf, root, True)

    def Iscatter(self, sendbuf, recvbuf, root=0):
        return Request._of(self._scatter(sendbuf, recvbuf, root, False))

    def Scatter_init(self, sendbuf, recvbuf, root=0, info=None):
        return Prequest._persistent(lambda: self.Iscatter(sendbuf, recvbuf, root))

    # --- all-gather / all-to-all -------------------------------------------------------------------
    def _allgather(self, sendbuf, recvbuf, blocking):
        core = self._c("Allgather")
        size, rank = core.size, core.rank
        r = _m.simple(recvbuf, False, 0, size, what="Allgather recvbuf")
        s = None if _m.is_in_place(sendbuf) else _m.simple(sendbuf, True, what="Allgather sendbuf")
        if r.gpu is not None or (s is not None and s.gpu is not None):
            return _gpu_issue(blocking, core.Allgather, core.Iallgather, "Iallgather", (r,),
                              IN_PLACE if s is None else s.gpu, r.gpu)
        land = _Landing(r.with_count(r.count * size))
        if s is None and not land.direct:
            block = r.nbytes
            land.buf[rank * block:(rank + 1) * block] = r.sub(rank * r.count * r.t.extent, r.count).data()
        send = IN_PLACE if s is None else s.data()
        return _then(_issue(blocking, core.Allgather, core.Iallgather, send, land.buf), land.finish, blocking,
                     "Iallgather")

    def Allgather(self, sendbuf, recvbuf):
        """recvbuf = every rank's sendbuf, in rank order."""
        self._allgather(sendbuf, recvbuf, True)

    def Iallgather(self, sendbuf, recvbuf):
        return Request._of(self._allgather(sendbuf, recvbuf, False))

    def Allgather_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Iallgather(sendbuf, recvbuf))

    def _alltoall(self, sendbuf, recvbuf, blocking):
        core = self._c("Alltoall")
        size = core.size
        r = _m.simple(recvbuf, False, 0, size, what="Alltoall recvbuf")
        s = None if _m.is_in_place(sendbuf) else _m.simple(sendbuf, True, 0, size, what="Alltoall sendbuf")
        if r.gpu is not None or (s is not None and s.gpu is not None):
            return _gpu_issue(blocking, core.Alltoall, core.Ialltoall, "Ialltoall", (r,),
                              IN_PLACE if s is None else s.gpu, r.gpu)
        whole = r.with_count(r.count * size)
        land = _Landing(whole)
        if s is None:
            send = IN_PLACE
            if not land.direct:
                land.buf[:] = whole.data()
        else:
            send = s.with_count(s.count * size).data()
        return _then(_issue(blocking, core.Alltoall, core.Ialltoall, send, land.buf), land.finish, blocking,
                     "Ialltoall")

    def Alltoall(self, sendbuf, recvbuf):
        """Block j of rank i's sendbuf goes to block i of rank j's recvbuf."""
        self._alltoall(sendbuf, recvbuf, True)

    def Ialltoall(self, sendbuf, recvbuf):
        return Request._of(self._alltoall(sendbuf, recvbuf, False))

    def Alltoall_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ialltoall(sendbuf, recvbuf))

    # --- reductions ---------------------------------------------------------------------------------
    def _reduction_msgs(self, sendbuf, recvbuf, what, recv_blocks=0, send_blocks=0):
        """(send Msg or None for IN_PLACE, recv Msg), checked to agree as mpi4py checks them."""
        r = _m.simple(recvbuf, False, 0, recv_blocks, what=f"{what} recvbuf")
        if _m.is_in_place(sendbuf):
            return None, r
        s = _m.simple(sendbuf, True, 0, send_blocks, what=f"{what} sendbuf")
        if s.gpu is None and r.gpu is None:
            if s.datatype != r.datatype:
                raise ValueError(f"{what}: the send and receive datatypes differ ({s.datatype.Get_name()} and "
                                 f"{r.datatype.Get_name()})")
        return s, r

    def _gathered_reduction(self, core, send, blocking, name, nbytes, fold_and_store, root=None):
        """Every rank's `send` bytes gathered (to all, or to root), then fold_and_store(chunks)."""
        size = core.size
        table = np.empty(nbytes * size, np.uint8) if root is None or core.rank == root else None
        if root is None:
            state = _issue(blocking, core.Allgather, core.Iallgather, send, table)
        else:
            state = _issue(blocking, core.Gather, core.Igather, send, table, root)

        def finish():
            if table is not None:
                fold_and_store([table[k * nbytes:(k + 1) * nbytes] for k in range(size)])
        return _then(state, finish, blocking, name)

    def _allreduce(self, sendbuf, recvbuf, op, blocking):
        core = self._c("Allreduce")
        rec = as_op(op)
        s, r = self._reduction_msgs(sendbuf, recvbuf, "Allreduce")
        if s is not None and s.gpu is None and r.gpu is None and s.count != r.count:
            raise ValueError(f"Allreduce: send count {s.count} and receive count {r.count} differ")
        if r.gpu is not None or (s is not None and s.gpu is not None):
            if not _gpu_folds(rec, r):
                return staged("allreduce", _send_recv(sendbuf, recvbuf),
                              lambda send, recv: self._allreduce(send, recv, op, blocking), blocking)
            return _gpu_issue(blocking, core.Allreduce, core.Iallreduce, "Iallreduce", (r,),
                              IN_PLACE if s is None else s.gpu, r.gpu, rec.core)
        native = _native_reduction(r, rec)
        if native is not None:
            view = r.span().view(r.t.np)
            send = IN_PLACE if s is None else s.data().view(r.t.np)
            return _issue(blocking, core.Allreduce, core.Iallreduce, send, view, native)
        mine, _ = (r if s is None else s).elements()
        out, copied = r.elements()
        check(rec, out.dtype, r.datatype)
        nbytes = mine.nbytes
        wire = mine.view(np.uint8).reshape(-1).copy() if s is None else mine.view(np.uint8).reshape(-1)

        def fold_and_store(chunks):
            result = _fold([c.view(out.dtype) for c in chunks], rec, r.datatype, len(chunks))
            out[...] = result
            if copied:
                r.store(out.view(np.uint8))
        return self._gathered_reduction(core, wire, blocking, "Iallreduce", nbytes, fold_and_store)

    def Allreduce(self, sendbuf, recvbuf, op=_SUM):
        """recvbuf = op over every rank's sendbuf."""
        core = self._s.core if self._s is not None else None
        recv = _plain(recvbuf, writable=True)
        send = IN_PLACE if sendbuf is IN_PLACE else _plain(sendbuf)
        if core is not None and recv is not None and send is not None and getattr(op, "_r", None) is not None \
                and op._r.core is not None:
            core.Allreduce(send, recv, op._r.core)  # gpucoll's own path as it is: its fast path included
            return
        self._allreduce(sendbuf, recvbuf, op, True)

    def Iallreduce(self, sendbuf, recvbuf, op=_SUM):
        return Request._of(self._allreduce(sendbuf, recvbuf, op, False))

    def Allreduce_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        return Prequest._persistent(lambda: self.Iallreduce(sendbuf, recvbuf, op))

    def _reduce(self, sendbuf, recvbuf, op, root, blocking):
        core = self._c("Reduce")
        root = check_root(core, root)
        rec = as_op(op)
        if core.rank == root:
            s, r = self._reduction_msgs(sendbuf, recvbuf, "Reduce")
            if s is not None and s.gpu is None and r.gpu is None and s.count != r.count:
                raise ValueError(f"Reduce: send count {s.count} and receive count {r.count} differ")
        else:
            s, r = _m.simple(sendbuf, True, root, what="Reduce sendbuf"), None
        if s is not None and s.gpu is not None or r is not None and r.gpu is not None:
            if not _gpu_folds(rec, r if r is not None else s):
                return staged("reduce", _send_recv(sendbuf, recvbuf),
                              lambda send, recv: self._reduce(send, recv, op, root, blocking), blocking)
            return _gpu_issue(blocking, core.Reduce, core.Ireduce, "Ireduce", (r,), IN_PLACE if s is None else s.gpu,
                              None if r is None else r.gpu, rec.core, root)
        ref = r if r is not None else s
        native = _native_reduction(ref, rec)
        if native is not None:
            send = IN_PLACE if s is None else s.data().view(ref.t.np)
            view = None if r is None else r.span().view(r.t.np)
            return _issue(blocking, core.Reduce, core.Ireduce, send, view, native, root)
        mine, _ = (r if s is None else s).elements()
        check(rec, mine.dtype, ref.datatype)
        wire = mine.view(np.uint8).reshape(-1)
        out, copied = r.elements() if r is not None else (None, False)

        def fold_and_store(chunks):
            out[...] = _fold([c.view(out.dtype) for c in chunks], rec, r.datatype, len(chunks))
            if copied:
                r.store(out.view(np.uint8))
        return self._gathered_reduction(core, wire, blocking, "Ireduce", mine.nbytes, fold_and_store, root)

    def Reduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        """root's recvbuf = op over every rank's sendbuf."""
        self._reduce(sendbuf, recvbuf, op, root, True)

    def Ireduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        return Request._of(self._reduce(sendbuf, recvbuf, op, root, False))

    def Reduce_init(self, sendbuf, recvbuf, op=_SUM, root=0, info=None):
        return Prequest._persistent(lambda: self.Ireduce(sendbuf, recvbuf, op, root))

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, blocking):
        core = self._c("Reduce_scatter_block")
        rec = as_op(op)
        size, rank = core.size, core.rank
        if _m.is_in_place(sendbuf):
            s, r = None, _m.simple(recvbuf, False, 0, size, what="Reduce_scatter_block recvbuf")
        else:
            r = _m.simple(recvbuf, False, what="Reduce_scatter_block recvbuf")
            s = _m.simple(sendbuf, True, 0, size, what="Reduce_scatter_block sendbuf")
            if s.gpu is None and r.gpu is None:
                if s.datatype != r.datatype:
                    raise ValueError("Reduce_scatter_block: the send and receive datatypes differ")
                if s.count != r.count:
                    raise ValueError(f"Reduce_scatter_block: send count {s.count} per rank and receive count "
                                     f"{r.count} differ")
        if r.gpu is not None or (s is not None and s.gpu is not None):
            if not _gpu_folds(rec, r):
                return staged("reduce_scatter_block", _send_recv(sendbuf, recvbuf),
                              lambda send, recv: self._reduce_scatter_block(send, recv, op, blocking), blocking)
            return _gpu_issue(blocking, core.Reduce_scatter_block, core.Ireduce_scatter_block, "Ireduce_scatter_block",
                              (r,), IN_PLACE if s is None else s.gpu, r.gpu, rec.core)
        count = r.count
        native = _native_reduction(r, rec)
        if native is not None:
            if s is None:
                whole = r.with_count(count * size).span().view(r.t.np)
                return _issue(blocking, core.Reduce_scatter_block, core.Ireduce_scatter_block, IN_PLACE, whole,
                              native)
            send = s.with_count(count * size).data().view(r.t.np)
            return _issue(blocking, core.Reduce_scatter_block, core.Ireduce_scatter_block, send,
                          r.span().view(r.t.np), native)
        source = (r if s is None else s).with_count(count * size)
        mine, _ = source.elements()
        target = r.with_count(count)
        out, copied = target.elements()
        check(rec, out.dtype, r.datatype)
        wire = mine.view(np.uint8).reshape(-1).copy() if s is None else mine.view(np.uint8).reshape(-1)

        def fold_and_store(chunks):
            parts = [c.view(out.dtype)[rank * count:(rank + 1) * count] for c in chunks]
            out[...] = _fold(parts, rec, r.datatype, size)
            if copied:
                target.store(out.view(np.uint8))
        return self._gathered_reduction(core, wire, blocking, "Ireduce_scatter_block", mine.nbytes, fold_and_store)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        """Rank i's recvbuf = op over every rank's block i of sendbuf."""
        self._reduce_scatter_block(sendbuf, recvbuf, op, True)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        return Request._of(self._reduce_scatter_block(sendbuf, recvbuf, op, False))

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        return Prequest._persistent(lambda: self.Ireduce_scatter_block(sendbuf, recvbuf, op))

    @through_host
    def _reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, blocking):
        core = self._c("Reduce_scatter")
        rec = as_op(op)
        size, rank = core.size, core.rank
        r = _m.simple(recvbuf, False, what="Reduce_scatter recvbuf")
        s = None if _m.is_in_place(sendbuf) else _m.simple(sendbuf, True, what="Reduce_scatter sendbuf")
        if recvcounts is None:
            if s is None:
                raise ValueError("Reduce_scatter: IN_PLACE needs the receive counts")
            counts = [int(c) for c in core.allgather(int(r.count))]
        else:
            counts = [int(c) for c in recvcounts]
            if len(counts) < size:
                raise ValueError(f"Reduce_scatter: {len(counts)} counts for {size} ranks")
            counts = counts[:size]
        total = sum(counts)
        if s is not None:
            if s.datatype != r.datatype:
                raise ValueError("Reduce_scatter: the send and receive datatypes differ")
            if s.count != total:
                raise ValueError(f"Reduce_scatter: send count {s.count} and sum(counts) {total} differ")
            if r.count != counts[rank]:
                raise ValueError(f"Reduce_scatter: receive count {r.count} and counts[{rank}] {counts[rank]} differ")
        elif r.count != total:
            raise ValueError(f"Reduce_scatter: receive count {r.count} and sum(counts) {total} differ")
        start = sum(counts[:rank])
        source = (r if s is None else s).with_count(total)
        target = r.with_count(counts[rank])
        native = _native_reduction(r, rec)
        mine, _ = source.elements()
        out, copied = target.elements()
        if native is not None:
            work = mine.copy()
            state = _issue(blocking, core.Allreduce, core.Iallreduce, IN_PLACE, work, native)

            def finish():
                out[...] = work[start:start + counts[rank]]
            return _then(state, finish, blocking, "Ireduce_scatter")
        check(rec, out.dtype, r.datatype)
        wire = mine.view(np.uint8).reshape(-1).copy()

        def fold_and_store(chunks):
            parts = [c.view(out.dtype)[start:start + counts[rank]] for c in chunks]
            out[...] = _fold(parts, rec, r.datatype, size)
            if copied:
                target.store(out.view(np.uint8))
        return self._gathered_reduction(core, wire, blocking, "Ireduce_scatter", mine.nbytes, fold_and_store)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        """Rank i's recvbuf = op over every rank's sendbuf, its recvcounts[i] elements from
        sum(recvcounts[:i]) on."""
        self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        return Request._of(self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, False))

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=_SUM, info=None):
        return Prequest._persistent(lambda: self.Ireduce_scatter(sendbuf, recvbuf, recvcounts, op))

    @through_host
    def _scan(self, sendbuf, recvbuf, op, blocking, exclusive):
        what = "Exscan" if exclusive else "Scan"
        core = self._c(what)
        rec = as_op(op)
        rank = core.rank
        s, r = self._reduction_msgs(sendbuf, recvbuf, what)
        if s is not None and s.count != r.count:
            raise ValueError(f"{what}: send count {s.count} and receive count {r.count} differ")
        mine, _ = (r if s is None else s).elements()
        out, copied = r.elements()
        check(rec, out.dtype, r.datatype)
        wire = mine.view(np.uint8).reshape(-1).copy()
        upto = rank if exclusive else rank + 1

        def fold_and_store(chunks):
            if upto == 0:  # Exscan on rank 0: recvbuf is left as it is (MPI leaves it undefined)
                return
            out[...] = _fold([c.view(out.dtype) for c in chunks], rec, r.datatype, upto)
            if copied:
                r.store(out.view(np.uint8))
        return self._gathered_reduction(core, wire, blocking, f"I{what.lower()}", mine.nbytes, fold_and_store)

    def Scan(self, sendbuf, recvbuf, op=_SUM):
        """Rank i's recvbuf = op over the sendbufs of ranks 0..i."""
        self._scan(sendbuf, recvbuf, op, True, False)

    def Iscan(self, sendbuf, recvbuf, op=_SUM):
        return Request._of(self._scan(sendbuf, recvbuf, op, False, False))

    def Scan_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        return Prequest._persistent(lambda: self.Iscan(sendbuf, recvbuf, op))

    def Exscan(self, sendbuf, recvbuf, op=_SUM):
        """Rank i's recvbuf = op over the sendbufs of ranks 0..i-1 (rank 0's is left alone)."""
        self._scan(sendbuf, recvbuf, op, True, True)

    def Iexscan(self, sendbuf, recvbuf, op=_SUM):
        return Request._of(self._scan(sendbuf, recvbuf, op, False, True))

    def Exscan_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        return Prequest._persistent(lambda: self.Iexscan(sendbuf, recvbuf, op))

    # --- vector collectives (point to point between the ranks) ----------------------------------------
    def _move(self, what, core, sends, recvs, local, blocking, by_p2p=False, root=-1):
        """Run an all-gather or all-to-all of blocks (sends: [(dest, packed bytes)], recvs:
        [(source, Msg)], local() the rank's own block): within one host through the
        communicator's direct group, in order with its other collectives (_direct_vector); else,
        or when a block is too large for the group's slots (by_p2p: the native path found so on
        every rank), by point to point."""
        dispatch = core.seam.dispatch
        if by_p2p:  # the native path's table exchange found a block too large, on every rank
            dispatch.view.stats.host["p2p"] += 1
            return _wait_if(self._vector(what, sends, recvs, local, VDIRECT_TAG), blocking)
        if dispatch.direct is None or self.Is_inter() or what == "Alltoallw":
            dispatch.view.stats.host["p2p"] += 1
            return _wait_if(self._vector(what, sends, recvs, local), blocking)
        seq = dispatch.next_seq()
        task = functools.partial(self._direct_vector, dispatch, seq, what, sends, recvs, local, root)
        if blocking:
            dispatch.queue.run(task)
            return None
        return dispatch.queue.submit(task, what.lower())

    def _direct_vector(self, dispatch, seq, what, sends, recvs, local, root):
        """Every block in one native call (gc_direct_vexchange); by point to point when it declines."""
        if dispatch.diagnosis.broken:
            raise GpucollError(f"this communicator is unusable: {dispatch.diagnosis.broken}")
        size = self.size
        kind = what.lower()
        landings = [(k, _Landing(msg)) for k, msg in recvs]
        recv_at, recv_bytes = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
        for k, land in landings:
            recv_at[k], recv_bytes[k] = land.buf.ctypes.data, land.buf.nbytes
        blocks = [(k, _bytes_of(data)) for k, data in sends]
        if kind in ("allgatherv", "gatherv"):  # one block for every receiver
            ones = [blocks[0][1]] if blocks else ([_bytes_of(b"")] if kind == "allgatherv" else [])
            send_at = np.array([a.ctypes.data for a in ones], np.uint64)
            send_bytes = np.array([a.nbytes for a in ones], np.uint64)
        elif blocks or kind == "alltoallv":  # a block per receiver
            send_at, send_bytes = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
            for k, arr in blocks:
                send_at[k], send_bytes[k] = arr.ctypes.data, arr.nbytes
        else:  # scatterv off the root: nothing to send
            send_at = send_bytes = np.zeros(0, np.uint64)
        group = dispatch.direct.group()
        args = (send_at, send_bytes, recv_at, recv_bytes) + ((root,) if root >= 0 else ())
        try:
            moved = getattr(group, kind)(*args, dispatch.timeout)
        except GpucollError as exc:
            dispatch.fast_failed(kind, 0, _dtypes.UINT8, None, max(root, 0), seq, exc)
        view = dispatch.view
        if dispatch.fast_ok and view.fast.host is None:  # the native paths, from now on
            view.fast.host = dispatch.direct.fast_path(dispatch)
        if not moved:  # a block too large for the slots, on some rank: every rank goes this way
            view.stats.host["p2p"] += 1
            self._vector(what, sends, recvs, local, VDIRECT_TAG).Wait()
            return
        view.stats.host["direct"] += 1
        for _, land in landings:
            land.finish()
        if local is not None:
            local()

    def _vector(self, what, sends, recvs, local, tag=VCOLL_TAG):
        """Post every send and receive of a vector collective; local() runs the rank's own block now.
        sends: [(dest, packed bytes)], recvs: [(source, Msg)]."""
        core = self._c(what)
        core.seam.check_alive()   # point to point below would take a freed or revoked communicator's seam
        p2p = core.seam.p2p
        parts, landings = [], []
        for source, msg in recvs:
            land = _Landing(msg)
            landings.append(land)
            parts.append(p2p.irecv(host_buffer(land.buf, what, writable=True), source, tag))
        for dest, data in sends:
            parts.append(p2p.isend(host_buffer(data, what), dest, tag))
        if local is not None:
            local()

        def finish():
            for land in landings:
                land.finish()
        return Composite(parts, finish, f"I{what.lower()}")

    @through_host
    def _gatherv(self, sendbuf, recvbuf, root, blocking, by_p2p=False):
        core = self._c("Gatherv")
        root = check_root(core, root)
        size, rank = core.size, core.rank
        if rank != root:
            s = _m.simple(sendbuf, True, root, what="Gatherv sendbuf")
            return self._move("Gatherv", core, [(root, s.data())], [], None, blocking, by_p2p, root)
        r = _m.vector(recvbuf, False, root, size, what="Gatherv recvbuf")
        s = None if _m.is_in_place(sendbuf) else _m.simple(sendbuf, True, what="Gatherv sendbuf")
        recvs = [(k, r.block(k)) for k in range(size) if k != root]
        local = None if s is None else (lambda: r.block(root).store(s.data()))
        return self._move("Gatherv", core, [], recvs, local, blocking, by_p2p, root)

    def Gatherv(self, sendbuf, recvbuf, root=0):
        """root's recvbuf [buf, counts, displs, type] gets rank i's sendbuf at displs[i]."""
        moved = self._fast_vector(_KIND["gatherv"], sendbuf, recvbuf, root)
        if moved == _FAST_TOO_BIG:
            self._gatherv(sendbuf, recvbuf, root, True, by_p2p=True)
        elif moved != _FAST_DONE:
            self._gatherv(sendbuf, recvbuf, root, True)

    def Igatherv(self, sendbuf, recvbuf, root=0):
        return Request._of(self._gatherv(sendbuf, recvbuf, root, False))

    def Gatherv_init(self, sendbuf, recvbuf, root=0, info=None):
        return Prequest._persistent(lambda: self.Igatherv(sendbuf, recvbuf, root))

    @through_host
    def _scatterv(self, sendbuf, recvbuf, root, blocking, by_p2p=False):
        core = self._c("Scatterv")
        root = check_root(core, root)
        size, rank = core.size, core.rank
        if rank != root:
            r = _m.simple(recvbuf, False, root, what="Scatterv recvbuf")
            return self._move("Scatterv", core, [], [(root, r)], None, blocking, by_p2p, root)
        s = _m.vector(sendbuf, True, root, size, what="Scatterv sendbuf")
        r = None if _m.is_in_place(recvbuf) else _m.simple(recvbuf, False, what="Scatterv recvbuf")
        sends = [(k, s.block(k).data()) for k in range(size) if k != root]
        local = None if r is None else (lambda: r.store(s.block(root).data()))
        return self._move("Scatterv", core, sends, [], local, blocking, by_p2p, root)

    def Scatterv(self, sendbuf, recvbuf, root=0):
        """Rank i's recvbuf gets counts[i] elements at displs[i] of root's sendbuf."""
        moved = self._fast_vector(_KIND["scatterv"], sendbuf, recvbuf, root)
        if moved == _FAST_TOO_BIG:
            self._scatterv(sendbuf, recvbuf, root, True, by_p2p=True)
        elif moved != _FAST_DONE:
            self._scatterv(sendbuf, recvbuf, root, True)

    def Iscatterv(self, sendbuf, recvbuf, root=0):
        return Request._of(self._scatterv(sendbuf, recvbuf, root, False))

    def Scatterv_init(self, sendbuf, recvbuf, root=0, info=None):
        return Prequest._persistent(lambda: self.Iscatterv(sendbuf, recvbuf, root))

    @through_host
    def _allgatherv(self, sendbuf, recvbuf, blocking, by_p2p=False):
        core = self._c("Allgatherv")
        size, rank = core.size, core.rank
        r = _m.vector(recvbuf, False, 0, size, what="Allgatherv recvbuf")
        if _m.is_in_place(sendbuf):
            data, local = r.block(rank).data().copy(), None
        else:
            s = _m.simple(sendbuf, True, what="Allgatherv sendbuf")
            data = s.data()

            def local():
                r.block(rank).store(data)
        others = [k for k in range(size) if k != rank]
        return self._move("Allgatherv", core, [(k, data) for k in others], [(k, r.block(k)) for k in others], local,
                          blocking, by_p2p)

    def Allgatherv(self, sendbuf, recvbuf):
        """Every rank's recvbuf [buf, counts, displs, type] gets rank i's sendbuf at displs[i]."""
        moved = self._fast_vector(_KIND["allgatherv"], sendbuf, recvbuf)
        if moved == _FAST_TOO_BIG:
            self._allgatherv(sendbuf, recvbuf, True, by_p2p=True)
        elif moved != _FAST_DONE:
            self._allgatherv(sendbuf, recvbuf, True)

    def Iallgatherv(self, sendbuf, recvbuf):
        return Request._of(self._allgatherv(sendbuf, recvbuf, False))

    def Allgatherv_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Iallgatherv(sendbuf, recvbuf))

    @through_host
    def _alltoallv(self, sendbuf, recvbuf, blocking, by_p2p=False):
        core = self._c("Alltoallv")
        size = core.size
        r = _m.vector(recvbuf, False, 0, size, what="Alltoallv recvbuf")
        s = r if _m.is_in_place(sendbuf) else _m.vector(sendbuf, True, 0, size, what="Alltoallv sendbuf")
        return self._exchange("Alltoallv", [s.block(k) for k in range(size)], [r.block(k) for k in range(size)],
                              s is r, blocking, by_p2p)

    def _exchange(self, what, sends, recvs, in_place, blocking, by_p2p=False):
        """Block k of sends goes to rank k; block k of recvs comes from rank k."""
        rank, size = self.rank, self.size
        data = [m.data() for m in sends]
        if in_place:  # the receives land where these come from: take them first
            data = [d.copy() for d in data]
        others = [k for k in range(size) if k != rank]
        return self._move(what, self._c(what), [(k, data[k]) for k in others], [(k, recvs[k]) for k in others],
                          lambda: recvs[rank].store(data[rank]), blocking, by_p2p)

    def Alltoallv(self, sendbuf, recvbuf):
        """Rank i's block j (counts, displs) goes to rank j's block i."""
        moved = self._fast_vector(_KIND["alltoallv"], sendbuf, recvbuf)
        if moved == _FAST_TOO_BIG:
            self._alltoallv(sendbuf, recvbuf, True, by_p2p=True)
        elif moved != _FAST_DONE:
            self._alltoallv(sendbuf, recvbuf, True)

    def _fast_vector(self, kind, sendbuf, recvbuf, root=-1):
        """An intracommunicator's native path for NumPy arrays (HostFast.vector): _FAST_DONE,
        _FAST_TOO_BIG (nothing moved, on every rank) or 0 (the general path runs the call)."""
        s = self._s
        if s is None or s.inter is not None:
            return 0
        fast = s.core.seam.host_fast
        return 0 if fast is None else fast.vector(kind, sendbuf, recvbuf, root)

    def Ialltoallv(self, sendbuf, recvbuf):
        return Request._of(self._alltoallv(sendbuf, recvbuf, False))

    def Alltoallv_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ialltoallv(sendbuf, recvbuf))

    @through_host
    def _alltoallw(self, sendbuf, recvbuf, blocking):
        self._c("Alltoallw")
        size = self.size
        r = _wblocks(recvbuf, False, size, "Alltoallw recvbuf")
        s = r if _m.is_in_place(sendbuf) else _wblocks(sendbuf, True, size, "Alltoallw sendbuf")
        return self._exchange("Alltoallw", s, r, s is r, blocking)

    def Alltoallw(self, sendbuf, recvbuf):
        """Alltoallv with a datatype per rank and displacements in bytes."""
        self._alltoallw(sendbuf, recvbuf, True)

    def Ialltoallw(self, sendbuf, recvbuf):
        return Request._of(self._alltoallw(sendbuf, recvbuf, False))

    def Alltoallw_init(self, sendbuf, recvbuf, info=None):
        return Prequest._persistent(lambda: self.Ialltoallw(sendbuf, recvbuf))


def _plain(msg, writable=False):
    """The NumPy array of a message that gpucoll's engines take as it is: a contiguous array of one
    of their dtypes, bare or as [array, datatype] with the datatype that is its dtype (the common
    mpi4py idiom); None for everything else, which goes through message.simple()."""
    if type(msg) is list or type(msg) is tuple:
        if len(msg) != 2:
            return None
        arr, datatype = msg
        t = getattr(datatype, "_t", None)
        if type(arr) is not np.ndarray or t is None or t.np != arr.dtype or t.code is None or t.contents is not None:
            return None
    else:
        arr = msg
        if type(arr) is not np.ndarray:
            return None
    flags = arr.flags
    if arr.dtype not in _CORE_DTYPES or not flags.c_contiguous or (writable and not flags.writeable):
        return None
    return arr


def _wait_if(state, blocking):
    if blocking:
        state.Wait()
        return None
    return state


_FAST_DONE, _FAST_TOO_BIG = 1, 2  # HostFast.vector's answers (cython_src/direct.pyx)
_KIND = {name: KINDS[name].id for name in VECTOR_KINDS}


def _bytes_of(data):
    """A packed block (an array or bytes) as a flat uint8 array over the same memory."""
    arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    return arr.reshape(-1).view(np.uint8)


def _no_gpu(msg, what):
    """For the collectives across an intercommunicator, which run on host memory only."""
    if msg is not None and msg.gpu is not None:
        raise NotImplementedError(f"{what} on GPU buffers across an intercommunicator")


def _wblocks(msg, readonly, size, what):
    """Alltoallw's [buf, counts, displs (bytes), datatypes] -> one Msg per rank."""
    n = len(msg)
    if n == 2:
        (buf, types), counts, displs = msg, None, None
    elif n == 3:
        buf, (counts, displs), types = msg
    elif n == 4:
        buf, counts, displs, types = msg
    else:
        raise ValueError(f"{what}: a message is [buf, counts, displs, datatypes] (2 to 4 items), not {n} items")
    bottom = buf is None or buf is _m.BOTTOM
    if bottom and (counts is None or displs is None):
        raise ValueError(f"{what}: MPI.BOTTOM needs counts and displacements (addresses)")
    if counts is None and displs is None:
        counts, displs = [1] * size, [0] * size
    counts = _m._int_list(counts, size, what, "counts")
    displs = _m._int_list(displs, size, what, "displacements")
    types = [types] * size if not isinstance(types, (list, tuple)) else list(types)
    if len(types) < size:
        raise ValueError(f"{what}: {len(types)} datatypes given, the communicator needs {size}")
    raw = None if bottom else _m._raw(_m.as_array(buf, readonly, what))
    plain = _m.is_plain(buf)
    out = []
    for k in range(size):
        datatype = _m.as_datatype(types[k], what)
        if bottom:
            out.append(_m.at_address(displs[k], counts[k], datatype, what, readonly))
            continue
        t = datatype._t
        if counts[k] and (displs[k] < 0 or displs[k] + (counts[k] - 1) * t.extent + t.true_ub > raw.size):
            raise ValueError(f"{what}: block {k} ({counts[k]} elements at byte {displs[k]}) reaches past the "
                             "buffer")
        out.append(_m.Msg(raw[displs[k]:], counts[k], datatype, plain=plain))
    return out
