"""The communicator: mpi4py's names and argument order, NCCL's speed.

Every method checks its arguments on the calling rank before anything is sent, then
hands a validated `Call` (gpucoll/base/call.py) to the dispatcher (gpucoll/dispatch/dispatcher.py), which
numbers it and picks the engine. Blocking methods return when the result is in place;
`I*` methods return a `Request`.

    import numpy as np, gpucoll
    comm = gpucoll.COMM_WORLD
    x = np.full(4, comm.rank, dtype=np.float32)
    comm.Allreduce(gpucoll.IN_PLACE, x, op=gpucoll.SUM)
"""
import os
import pickle

import numpy as np

from ..base import ops as _ops
from ..base.call import IN_PLACE, check_host_stream  # noqa: F401 - IN_PLACE: also gpucoll.IN_PLACE
from ..base.counters import PathCounters
from ..base.errors import GpucollError, InvalidUsageError, RevokedError
from ..base.request import CompletedRequest
from ..calls import build
from ..calls.buffers import host_buffer
from ..dispatch.dispatcher import Dispatcher
from ..engines.comm_view import CommView, FastPaths
from ..engines.p2p import host as _p2p
from ..engines.p2p.host import ShortCalls
from . import fault


UNDEFINED = -32766  # Split colour that leaves a rank out of every new communicator

# A forked child inherits its parent's communicators: their shared memory, sockets and call
# numbers, not their threads. Were it to call a collective it would take part in the parent's
# (both get wrong results), so the child marks every inherited communicator unusable as it
# starts; the per-call check is the one `_check_alive` already makes, and the fast paths are
# dropped, so they cost nothing more.
def _after_fork_in_child():
    for comm in list(fault.LIVE):
        comm._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Communicator(ShortCalls):
    """A group of ranks that run collectives together.

    Attributes: `rank`, `size`, `local_rank` (rank among this host's ranks of the
    communicator), `local_size`, `host`, `name`."""

    def __init__(self, context, comm_id, world_ranks):
        self._ctx = context
        self._id = comm_id
        self._world_ranks = tuple(world_ranks)
        self.size = len(world_ranks)
        self.rank = self._world_ranks.index(context.rank)
        self.host = context.hosts[context.rank]
        same_host = [r for r in self._world_ranks if context.hosts[r] == self.host]
        self.local_rank = same_host.index(context.rank)
        self.local_size = len(same_host)
        self.name = comm_id
        self._pid = os.getpid()
        self._freed = False     # freed, revoked, or inherited by a forked child: every call raises _unusable
        self._unusable = None   # (exception class, message)
        self._was_freed = False  # Free() has run
        self._fault = fault.FaultState()  # revoked or not, agreements made (gpucoll/api/fault.py)
        self._stats = PathCounters()  # which path each call took (stats())
        self._fast = FastPaths()  # the packed fast paths (host, gpu) the engines install
        self._view = CommView(context, comm_id, self.rank, self.size, self.local_size, self._world_ranks,
                              self._stats, self._fast, exchange=self.allgather, exchange_into=self.Allgather,
                              barrier=self.Barrier, run=self._run, free=self.Free, subgroup=self._subgroup,
                              revoked=self._revoked_elsewhere,
                              failed_among=lambda ranks: fault.unacknowledged(self, ranks))
        self._dispatch = Dispatcher(self._view)
        self._p2p = _p2p.PointToPoint(self._view, _gpu_point_to_point)
        # The short paths of host point to point (gpucoll._native.p2p.ShortPaths): a message in
        # contiguous host memory, plain in-range rank and tag, a live communicator (and no open
        # group for the blocking ones). They answer done (True, or the request) or decline
        # (False, None): the caller then takes its general path, which checks everything.
        # gpucoll.MPI's point to point tries them first too (comm.seam).
        self._short = self._p2p.short
        self._children = 0  # Split/Dup counter: names children identically on every rank
        self._group = None     # inside comm.group(): the _Group collecting deferred operations
        self.seam = CommSeam(self)
        fault.LIVE.add(self)

    # --- identity ---------------------------------------------------------------
    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Get_name(self):
        return self.name

    @property
    def world_ranks(self):
        """The world rank of each rank of this communicator."""
        return self._world_ranks

    def __repr__(self):
        return f"<gpucoll.Communicator {self._id} rank {self.rank} of {self.size}>"

    def stats(self):
        """How many calls of this communicator took each path, as a dict (docs/debugging.md):
        `host_fast` (host all-reduces, bcasts, reduces, all-gathers and barriers run by the native
        fast paths), `host` (algorithm -> host collectives run by the general path), `gpu_fast`
        (repeated GPU all-reduces launched from their packed launch), `gpu` (algorithm -> GPU
        collectives; `host-staged` / `host-pipelined` when they went through host memory),
        `groups`, `group_deferred`, `group_p2p`, `fused_launches` and `fused_calls`."""
        fast = self._fast.host
        return self._stats.snapshot(fast.calls if fast is not None else 0)

    def _check_alive(self):
        if self._freed:
            raise self._unusable[0](self._unusable[1])

    def _ended(self):
        """Freed, or unusable for a reason other than a revoke (a revoked communicator can still
        be shrunk, agreed on and freed)."""
        return self._was_freed or (self._freed and not self._fault.revoked)

    def _check_not_freed(self, what):
        """Fault tolerance's calls work on a revoked communicator, not on a freed one."""
        if self._ended():
            raise InvalidUsageError(f"{what}: {self._unusable[1]}")

    def _revoked_elsewhere(self):
        """A wait found that another rank revoked this communicator before this rank heard of it."""
        fault.revoke_here(self._id)

    def _revoke_here(self):
        """Every later call raises RevokedError; pending ones on this host fail now (the
        communicator's shared segment, point to point's posted receives and offers)."""
        if self._fault.revoked or self._was_freed:
            return
        self._fault.revoked = True
        if not self._freed:
            self._freed = self._short.closed = True
            self._fast.host = self._fast.gpu = None
            self._unusable = (RevokedError, f"communicator {self._id} was revoked; shrink() it to go on "
                                            "with the surviving ranks")
        self._dispatch.revoke()   # queued nonblocking calls then fail in their first wait
        self._p2p.revoke()

    def _forked(self):
        """In a forked child: every later call raises; the transports stay as they are (they are
        the parent's, so even Free leaves them alone)."""
        self._freed = self._short.closed = True
        self._fast.host = self._fast.gpu = None
        self._unusable = (InvalidUsageError,
            f"communicator {self._id} belongs to process {self._pid}, which created it; this process "
            f"({os.getpid()}) is a fork of it and cannot use it: its calls would take part in the parent's "
            "collectives and corrupt both results. Use gpucoll only in the process that initialised it and "
            "pass data to and from child processes yourself, or start the children with multiprocessing's "
            "'spawn' start method, which inherits no communicator.")
        self._dispatch.queue.abandon(InvalidUsageError(self._unusable[1]))  # requests the parent had pending

    def _root(self, root):
        return build.checked_root(root, self.size)

    # --- communicator management ------------------------------------------------
    def spawn(self, argv, nprocs=1, root=0, cwd=None):
        """Start `nprocs` processes of `argv` (a command and its arguments; root's count) in this
        job, under gpurun, and return the communicator of this communicator's ranks followed by
        theirs (collective). In the started processes, gpucoll.parent() returns the same
        communicator. Raises SpawnError naming why it could not start them (gpucoll/api/spawning.py)."""
        from .spawning import spawn

        self._check_alive()
        return spawn(self, argv, nprocs, root, cwd)

    def Dup(self):
        """A new communicator with the same ranks, isolated from this one."""
        self._check_alive()
        self._children += 1
        return Communicator(self._ctx, f"{self._id}.d{self._children}", self._world_ranks)

    def Split(self, color=0, key=0):
        """Ranks with the same color form a new communicator, ordered by (key, rank).
        A color of UNDEFINED (any negative one, or None) gives None."""
        self._check_alive()
        self._children += 1
        tag = self._children
        # Checked after the exchange, so that a bad argument on one rank raises on all of them.
        mine = (UNDEFINED if color is None else build.integer(color), build.integer(key))
        table = self.allgather(mine)
        bad = [r for r, (c, k) in enumerate(table) if c is None or k is None]
        if bad:
            raise InvalidUsageError(f"Split: rank(s) {', '.join(map(str, bad))} passed a color or key that is "
                                    "not an integer; pass integers (UNDEFINED to stay out)")
        color = mine[0]
        if color < 0:
            return None
        members = sorted((k, r) for r, (c, k) in enumerate(table) if c == color)
        world = [self._world_ranks[r] for _, r in members]
        return Communicator(self._ctx, f"{self._id}.s{tag}c{color}", world)

    def Free(self):
        """Release the communicator's transports; using it afterwards raises."""
        if self._ended():
            return
        self._fast.host = self._fast.gpu = None
        self._short.closed = True
        self._unusable = (InvalidUsageError, f"communicator {self._id} was freed; create a new one with Dup() or Split()")
        error = None
        try:  # no peer may still be using our IPC memory when it is unmapped
            self._dispatch.quiesce()
        except GpucollError as exc:
            error = exc
        try:  # waits for our GPU messages to be read; raises a timeout the device recorded
            self._p2p.close()
        except GpucollError as exc:
            error = error or exc
        self._dispatch.close()
        self._freed = self._was_freed = True
        if error is not None:
            raise error

    # --- fault tolerance (gpucoll/api/fault.py) -----------------------------------------
    def revoke(self):
        """Make every pending and later operation on this communicator raise RevokedError, on
        every rank (ULFM's MPI_Comm_revoke). shrink() still works."""
        fault.revoke(self)

    def is_revoked(self):
        return self._fault.revoked

    def shrink(self):
        """A new communicator of the surviving ranks, the same on each of them (collective over
        the survivors; ULFM's MPI_Comm_shrink). With no failure, a duplicate."""
        return fault.shrink(self)

    def agree(self, flag):
        """The bitwise AND of the survivors' integer flags, the same on every survivor
        (collective over the survivors; ULFM's MPI_Comm_agree)."""
        return fault.agree(self, flag)

    def grow(self):
        """After shrink(): the communicator of the ranks before the shrinks, each failed rank's
        place taken by the replacement gpurun --respawn started for it (collective with the
        replacements' gpucoll.rejoin())."""
        return fault.grow(self)

    def failed(self):
        """The ranks of this communicator known to have failed."""
        return fault.failed(self)

    def ack_failed(self, count=None):
        """Acknowledge the first `count` failed ranks (all when None); how many are acknowledged."""
        return fault.ack_failed(self, count)

    # --- groups ---------------------------------------------------------------------
    def group(self):
        """Issue the operations of a `with` block together, as NCCL's group calls do::

            with comm.group():
                for grad in grads:                     # 100 small all-reduces, one launch
                    comm.Allreduce(gpucoll.IN_PLACE, grad)
                comm.Isend(a, 1); comm.Irecv(b, 1)     # no deadlock between the pair

        GPU collectives inside are deferred to the end of the outermost block and then issued in
        order, the small all-reduces of one dtype fused into one kernel launch (across streams:
        the streams are joined around it). Send/Recv (GPU or host buffers) start at once without
        blocking and complete at the end of the block. Host-buffer collectives run at once.
        Requests of operations issued inside can be waited on after the block."""
        return _Group(self)

    # --- the buffer collectives ---------------------------------------------------
    def _blocking(self, call, stream=None):
        call.stream = stream
        self._dispatch.submit(call, self._group)

    def _nonblocking(self, call, stream=None):
        call.stream = stream
        return self._dispatch.submit_nonblocking(call, self._group)

    def _run(self, call):
        """A blocking call built by an engine (the phases of a hierarchical all-reduce)."""
        self._check_alive()
        self._dispatch.submit(call)

    def _subgroup(self, comm_id, world_ranks):
        """The engines' handle of a new communicator of these world ranks, made locally."""
        return Communicator(self._ctx, comm_id, world_ranks)._view

    def _call(self, builder, *args):
        """builder's Call (gpucoll/calls/build.py) for these arguments, once this communicator
        is known to be usable."""
        self._check_alive()
        return builder(self.rank, self.size, *args)

    def Allreduce(self, sendbuf, recvbuf, op=_ops.SUM, stream=None):
        """recvbuf = op over every rank's sendbuf (IN_PLACE: recvbuf is also the input)."""
        fast = self._fast.host  # NumPy arrays on one host: the native fast path (cython_src/direct.pyx)
        if fast is not None and stream is None and fast.allreduce(sendbuf, recvbuf, op):
            return
        fast = self._fast.gpu  # a repeated GPU all-reduce: one packed launch (gpucoll/engines/gpu/engine.py)
        if fast is not None and self._group is None and fast(sendbuf, recvbuf, op, stream):
            return
        self._blocking(self._call(build.allreduce, sendbuf, recvbuf, op), stream)

    def Iallreduce(self, sendbuf, recvbuf, op=_ops.SUM, stream=None):
        return self._nonblocking(self._call(build.allreduce, sendbuf, recvbuf, op), stream)

    def Bcast(self, buf, root=0, stream=None):
        """Copy root's buf into every rank's buf."""
        fast = self._fast.host
        if fast is not None and stream is None and fast.bcast(buf, root):
            return
        self._blocking(self._call(build.bcast, buf, root), stream)

    def Ibcast(self, buf, root=0, stream=None):
        return self._nonblocking(self._call(build.bcast, buf, root), stream)

    def Reduce(self, sendbuf, recvbuf, op=_ops.SUM, root=0, stream=None):
        """root's recvbuf = op over every rank's sendbuf; recvbuf is ignored elsewhere."""
        fast = self._fast.host
        if fast is not None and stream is None and fast.reduce(sendbuf, recvbuf, op, root):
            return
        self._blocking(self._call(build.reduce, sendbuf, recvbuf, op, root), stream)

    def Ireduce(self, sendbuf, recvbuf, op=_ops.SUM, root=0, stream=None):
        return self._nonblocking(self._call(build.reduce, sendbuf, recvbuf, op, root), stream)

    def Allgather(self, sendbuf, recvbuf, stream=None):
        """recvbuf = every rank's sendbuf, concatenated in rank order."""
        fast = self._fast.host
        if fast is not None and stream is None and fast.allgather(sendbuf, recvbuf):
            return
        self._blocking(self._call(build.allgather, sendbuf, recvbuf), stream)

    def Iallgather(self, sendbuf, recvbuf, stream=None):
        return self._nonblocking(self._call(build.allgather, sendbuf, recvbuf), stream)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=_ops.SUM, stream=None):
        """Rank i's recvbuf = op over every rank's block i of sendbuf."""
        fast = self._fast.host
        if fast is not None and stream is None and fast.reduce_scatter_block(sendbuf, recvbuf, op):
            return
        self._blocking(self._call(build.reduce_scatter_block, sendbuf, recvbuf, op), stream)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=_ops.SUM, stream=None):
        return self._nonblocking(self._call(build.reduce_scatter_block, sendbuf, recvbuf, op), stream)

    def Alltoall(self, sendbuf, recvbuf, stream=None):
        """Block j of rank i's sendbuf becomes block i of rank j's recvbuf."""
        fast = self._fast.host
        if fast is not None and stream is None and fast.alltoall(sendbuf, recvbuf):
            return
        self._blocking(self._call(build.alltoall, sendbuf, recvbuf), stream)

    def Ialltoall(self, sendbuf, recvbuf, stream=None):
        return self._nonblocking(self._call(build.alltoall, sendbuf, recvbuf), stream)

    def Gather(self, sendbuf, recvbuf, root=0, stream=None):
        """root's recvbuf = every rank's sendbuf in rank order."""
        self._blocking(self._call(build.gather, sendbuf, recvbuf, root), stream)

    def Igather(self, sendbuf, recvbuf, root=0, stream=None):
        return self._nonblocking(self._call(build.gather, sendbuf, recvbuf, root), stream)

    def Scatter(self, sendbuf, recvbuf, root=0, stream=None):
        """Block i of root's sendbuf goes to rank i's recvbuf."""
        self._blocking(self._call(build.scatter, sendbuf, recvbuf, root), stream)

    def Iscatter(self, sendbuf, recvbuf, root=0, stream=None):
        return self._nonblocking(self._call(build.scatter, sendbuf, recvbuf, root), stream)

    def Barrier(self):
        """Return once every rank has entered the barrier."""
        fast = self._fast.host
        if fast is not None and fast.barrier():
            return
        self._blocking(self._call(build.barrier))

    def Ibarrier(self):
        return self._nonblocking(self._call(build.barrier))

    barrier = Barrier

    # --- point to point -------------------------------------------------------------
    # Host buffers go through gpucoll/engines/p2p/host.py; GPU buffers through gpucoll/engines/p2p/gpu.py, in the
    # order of `stream=` (default: the caller's current stream), matched by the same engine.
    # Send and Recv of a plain NumPy array try p2p's short path first (every call's path).
    def _send(self, buf, dest, tag, stream, nonblocking, what="buf"):
        self._check_alive()
        b, tag = host_buffer(buf, what), build.user_tag(tag)
        if dest == _p2p.PROC_NULL:
            return CompletedRequest("Isend") if nonblocking else None
        grouped = not nonblocking and self._group is not None  # starts now, completes with the group
        if b.is_gpu:
            req = self._p2p.gpu_side().send(b, dest, tag, stream, nonblocking or grouped, self._group is not None)
        else:
            _host_stream(stream)
            req = self._p2p.isend(b, dest, tag) if nonblocking or grouped else self._p2p.send(b, dest, tag)
        if grouped:
            self._group.waits.append(req)
            return None
        return req

    def _irecv(self, buf, source, tag, status, stream, what="buf"):
        self._check_alive()
        b = host_buffer(buf, what, writable=True)
        if b.is_gpu:
            return self._p2p.gpu_side().recv(b, source, tag, status, stream, nonblocking=True,
                                        in_group=self._group is not None)
        _host_stream(stream)
        return self._p2p.irecv(b, source, tag, status)

    def _enqueued(self, req, status=None):
        """Wait as a blocking receive does: GPU data enqueued on its stream, host data in place
        (in a group: when the group ends)."""
        if self._group is not None:
            self._group.waits.append(req)
            return
        _wait_enqueued(req, status)

    # Send, Isend, Recv and Irecv are ShortCalls' (native: the short paths first, then _send and
    # _irecv).

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=_p2p.ANY_SOURCE,
                 recvtag=_p2p.ANY_TAG, status=None, stream=None):
        req = self._irecv(recvbuf, source, recvtag, status, stream, "recvbuf")
        self._send(sendbuf, dest, sendtag, stream, False, "sendbuf")
        self._enqueued(req)

    # --- object methods (pickle) ---------------------------------------------------
    def send(self, obj, dest, tag=0):
        self._check_alive()
        self._p2p.send_object(obj, dest, build.user_tag(tag))

    def isend(self, obj, dest, tag=0):
        self._check_alive()
        return self._p2p.isend_object(obj, dest, build.user_tag(tag))

    def recv(self, buf=None, source=_p2p.ANY_SOURCE, tag=_p2p.ANY_TAG, status=None):
        self._check_alive()
        req = self._p2p.irecv_object(source, tag, status)
        self._p2p.wait_blocking(req)
        return req.wait()

    def irecv(self, buf=None, source=_p2p.ANY_SOURCE, tag=_p2p.ANY_TAG):
        self._check_alive()
        return self._p2p.irecv_object(source, tag)

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=_p2p.ANY_SOURCE,
                 recvtag=_p2p.ANY_TAG, status=None):
        req = self.irecv(None, source, recvtag)
        self.send(sendobj, dest, sendtag)
        self._p2p.wait_blocking(req)
        return req.wait(status)

    def bcast(self, obj, root=0):
        """root's Python object, on every rank."""
        self._check_alive()
        root = self._root(root)
        data, problem = b"", None
        if self.rank == root:
            try:
                data = _dumps(obj)
            except Exception as exc:
                problem = exc
        # A length of -1 tells the others that the root gave up, so that they raise too.
        length = np.array([len(data) if problem is None else -1], dtype=np.int64)
        self.Bcast(length, root)
        if length[0] < 0:
            why = f": {type(problem).__name__}: {problem}" if problem is not None else ""
            raise InvalidUsageError(f"bcast: the root (rank {root}) cannot pickle its object{why}")
        buf = np.frombuffer(data, np.uint8).copy() if self.rank == root else np.empty(length[0], np.uint8)
        self.Bcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def allgather(self, obj):
        """Every rank's object, in rank order."""
        return self._allgather_objects(obj, "allgather")

    def _allgather_objects(self, obj, what, problem=None):
        """allgather, raising on every rank when a rank's input is wrong (`problem`) or cannot
        be pickled: no rank is left waiting for a rank that gave up."""
        if problem is None:
            try:
                data = _dumps(obj)
            except Exception as exc:
                problem = f"{what}: rank {self.rank} cannot pickle its object: {type(exc).__name__}: {exc}"
        if problem is not None:
            data = _dumps(_ScatterFailed(problem))
        items = [pickle.loads(b) for b in self._allgather_bytes(data)]
        failed = next((item for item in items if isinstance(item, _ScatterFailed)), None)
        if failed is not None:
            raise InvalidUsageError(failed.problem)
        return items

    def _allgather_bytes(self, data):
        lengths = np.empty(self.size, np.int64)
        self.Allgather(np.array([len(data)], np.int64), lengths)
        width = int(lengths.max()) if self.size else 0
        mine = np.zeros(width, np.uint8)
        mine[:len(data)] = np.frombuffer(data, np.uint8)
        table = np.empty(width * self.size, np.uint8)
        self.Allgather(mine, table)
        return [table[r * width:r * width + int(lengths[r])].tobytes() for r in range(self.size)]

    def gather(self, obj, root=0):
        """On root: every rank's object in rank order; None elsewhere."""
        self._check_alive()
        root = self._root(root)
        items = self._allgather_objects(obj, "gather") if self.size <= 64 else self._gather_via_root(obj, root)
        return items if self.rank == root else None

    def _gather_via_root(self, obj, root):
        if self.rank != root:
            self._p2p.send_object(obj, root, _p2p.OBJECT_GATHER_TAG)
            return None
        return [obj if r == root else self._p2p.irecv_object(r, _p2p.OBJECT_GATHER_TAG).wait()
                for r in range(self.size)]

    def scatter(self, sendobj, root=0):
        """Rank i gets root's sendobj[i]."""
        self._check_alive()
        root = self._root(root)
        if self.rank == root:
            if sendobj is None or not hasattr(sendobj, "__len__") or len(sendobj) != self.size:
                problem = (f"scatter: the root (rank {root}) must pass a sequence of {self.size} objects, "
                           f"not {type(sendobj).__name__}"
                           + (f" of length {len(sendobj)}" if hasattr(sendobj, "__len__") else ""))
                # Tell the waiting ranks too, so that no rank hangs on the root's mistake.
                for r in range(self.size):
                    if r != root:
                        self._p2p.send_object(_ScatterFailed(problem), r, _p2p.OBJECT_SCATTER_TAG)
                raise InvalidUsageError(problem)
            for r in range(self.size):
                if r != root:
                    self._p2p.send_object(sendobj[r], r, _p2p.OBJECT_SCATTER_TAG)
            return sendobj[root]
        item = self._p2p.irecv_object(root, _p2p.OBJECT_SCATTER_TAG).wait()
        if isinstance(item, _ScatterFailed):
            raise InvalidUsageError(item.problem)
        return item

    def allreduce(self, obj, op=_ops.SUM):
        """op over every rank's object, combined in rank order (same result everywhere)."""
        op = _ops.as_op(op)
        items = self._allgather_objects(obj, "allreduce")
        if op is _ops.AVG:
            total = items[0]
            for item in items[1:]:
                total = total + item
            return total / self.size
        result = items[0]
        for item in items[1:]:
            result = op.py(result, item)
        return result

    def reduce(self, obj, op=_ops.SUM, root=0):
        result = self.allreduce(obj, op)
        return result if self.rank == self._root(root) else None

    def alltoall(self, sendobj):
        """Item j of rank i's sendobj becomes item i of rank j's result."""
        problem = None
        if sendobj is None or not hasattr(sendobj, "__len__") or len(sendobj) != self.size:
            problem = (f"alltoall: every rank must pass a sequence of {self.size} objects; rank {self.rank} "
                       f"passed {type(sendobj).__name__}"
                       + (f" of length {len(sendobj)}" if hasattr(sendobj, "__len__") else ""))
        table = self._allgather_objects(None if problem else list(sendobj), "alltoall", problem)
        return [table[r][self.rank] for r in range(self.size)]


class CommSeam:
    """What gpucoll.MPI (gpucoll/mpi/) uses of a communicator beyond its public API, and all of
    it: no module but this one reads a Communicator's underscored state (tests/test_seam.py).

    - `context`: the process's bootstrap context (hosts, ranks, job id) that communicators are
      made from: `Communicator(seam.context, comm_id, world_ranks)`;
    - `id`: the communicator's id; a child's id extends it, the same on every rank;
    - `child_id(letter)`: the next child's id, `{id}.{letter}{n}`, counted with Dup and Split;
    - `p2p`: its point-to-point engine (gpucoll/engines/p2p/host.py: object messages, probes,
      synchronous sends);
    - `short`: the short paths of host point to point (gpucoll._native.p2p.ShortPaths); gpucoll.MPI
      calls them with mpi=True (done: True, or its Request handle; or declined, nothing done);
    - `dispatch`: its dispatcher (gpucoll/dispatch/dispatcher.py), whose direct engine and ordered
      queue run gpucoll.MPI's vector collectives within a host;
    - `host_fast`: its native host fast paths (gpucoll._native.direct.HostFast), None until its
      first call on the direct engine;
    - for fault tolerance (gpucoll/api/fault.py): `fault`, its FaultState; `check_usable(what)`,
      which raises InvalidUsageError naming `what` on a freed communicator (a revoked one is
      usable there); `revoke_here()`, which revokes it in this process; `released`, whether
      Free() has run; `check_alive()`, which raises what any call of a freed or revoked
      communicator raises (for calls that do nothing, such as a receive from PROC_NULL).
    """

    __slots__ = ("context", "id", "p2p", "short", "dispatch", "fault", "_comm")

    def __init__(self, comm):
        self.context, self.id, self.p2p, self._comm = comm._ctx, comm._id, comm._p2p, comm
        self.short, self.dispatch, self.fault = comm._short, comm._dispatch, comm._fault

    @property
    def host_fast(self):
        return self._comm._fast.host

    @property
    def released(self):
        return self._comm._was_freed

    def check_usable(self, what):
        self._comm._check_not_freed(what)

    def check_alive(self):
        """Raise what any call of a freed or revoked communicator raises."""
        self._comm._check_alive()

    def revoke_here(self):
        self._comm._revoke_here()

    def child_id(self, letter):
        comm = self._comm
        comm._children += 1
        return f"{self.id}.{letter}{comm._children}"


class _Group:
    """The context manager of Communicator.group(); nested blocks join the outermost one."""

    def __init__(self, comm):
        self.comm = comm
        self.calls = []   # (Call, GpuRequest or None) of deferred GPU collectives, in order
        self.waits = []   # requests of Send/Recv started in the group, completed at its end
        self.outer = None

    def __enter__(self):
        comm = self.comm
        comm._check_alive()
        self.outer = comm._group
        if self.outer is None:
            comm._group = self
            comm._short.grouped = True
        return self

    def __exit__(self, kind, exc, tb):
        comm = self.comm
        if self.outer is not None:
            return False
        comm._group = None
        comm._short.grouped = False
        if kind is not None:  # the block raised: what it deferred is dropped with it
            if comm._p2p.gpu is not None:
                comm._p2p.gpu.drop_group()
            return False
        stats = comm._stats
        stats.groups += 1
        stats.group_deferred += len(self.calls)
        stats.group_p2p += len(self.waits)
        if self.calls:
            comm._dispatch.run_group([call for call, _ in self.calls])
            for call, req in self.calls:
                if req is not None:
                    req.record(call.stream)
        if comm._p2p.gpu is not None:
            comm._p2p.gpu.end_group()
        for req in self.waits:
            _wait_enqueued(req)
        return False


def _wait_enqueued(req, status=None):
    """Wait for a request the caller does not hand out (a blocking receive, a group's)."""
    target = getattr(req, "target", None)  # a GPU receive: enqueued on its stream is enough
    stream = None if target is None else target.stream
    p2p = getattr(req, "_p2p", None)   # a receive: one from ANY_SOURCE that a failure ends is taken back
    if p2p is not None:
        p2p.wait_blocking(req, status, stream=stream)
    elif stream is None:
        req.Wait(status)
    else:
        req.Wait(status, stream=stream)


class _ScatterFailed:
    """What a rank sends instead of data when its input to an object collective is wrong."""

    def __init__(self, problem):
        self.problem = problem


_host_stream = check_host_stream  # point to point refuses a stream on host buffers the same way


def _gpu_point_to_point(p2p):
    from ..engines.p2p.gpu import GpuPointToPoint  # CUDA is loaded for the first GPU buffer only

    return GpuPointToPoint(p2p)


def _dumps(obj):
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
