"""The direct engine: every rank of a one-host communicator maps one shared segment and runs
each collective as one native call over it (cython_src/include/gc_direct.h), no channel, no
schedule. Cost-table row: "direct" (gpucoll/algorithms/selector.py), every kind.

Packed fast path: once a call of a kind that has one ran here, `fast_path()` builds the
communicator's HostFast (cython_src/direct.pyx), which the communicator's Allreduce, Bcast,
Reduce and Allgather try first on NumPy arrays.
"""
from ..base import config, dtypes
from ..base.call import IN_PLACE, KINDS, VECTOR_KINDS, addresses
from ..transports import process_watch

ROWS = ("direct",)
FAST_KINDS = frozenset({"allreduce", "bcast", "reduce", "allgather", "alltoall", "reduce_scatter", "barrier"})


def _op(call):
    return call.op.code if call.op is not None else 0


# kind -> f(group, call, send address, recv address, timeout): the one native call of each kind.
_RUN = {
    "allreduce": lambda g, c, s, r, t: g.allreduce(s, r, c.count, c.code, _op(c), t),
    "bcast": lambda g, c, s, r, t: g.bcast(r, c.count, dtypes.ITEMSIZE[c.code], c.root, t),
    "reduce": lambda g, c, s, r, t: g.reduce(s, r, c.count, c.code, _op(c), c.root, t),
    "allgather": lambda g, c, s, r, t: g.allgather(s, r, c.count, dtypes.ITEMSIZE[c.code], t),
    "reduce_scatter": lambda g, c, s, r, t: g.reduce_scatter_block(s, r, c.count, c.code, _op(c), t),
    "alltoall": lambda g, c, s, r, t: g.alltoall(s, r, c.count, dtypes.ITEMSIZE[c.code], t),
    "gather": lambda g, c, s, r, t: g.gather(s, r, c.count, dtypes.ITEMSIZE[c.code], c.root, t),
    "scatter": lambda g, c, s, r, t: g.scatter(s, r, c.count, dtypes.ITEMSIZE[c.code], c.root, t),
    "barrier": lambda g, c, s, r, t: g.barrier(t),
}
assert set(_RUN) == set(KINDS) - VECTOR_KINDS


class DirectEngine:
    rows = ROWS

    def __init__(self, view, timeout, check_alive):
        self.view = view
        self.timeout = timeout
        self._check_alive = check_alive
        self._group = None
        self._watch = None

    def group(self):
        """The DirectGroup, made on first use (every rank makes it in the same call). Its waits
        belong to that call: GPUCOLL_TIMEOUT (a rank may reach its first collective late), and
        they stop as soon as a rank of the communicator is known to have ended."""
        if self._group is None:
            from ..transports.shm_direct import create_or_attach
            from ..transports.shm_segment import JobSegments

            h, ctx = self.view, self.view.ctx
            group = create_or_attach(JobSegments(ctx.job_id, ctx.secret), h.id, h.rank, h.size,
                                     creator_pid=ctx.pids[h.world_ranks[0]], timeout=self.timeout,
                                     check=self._check_alive)
            group.watch([ctx.watch_pid(w) for w in h.world_ranks])  # ranks that never attach
            if config.ON_FAILURE.get() == "continue":
                # The survivors go on: they must hear of a death now, not at a wait's next
                # periodic check (up to 32 ms away). Elsewhere gpurun ends the job anyway.
                peers = [ctx.watch_pid(w) for r, w in enumerate(h.world_ranks) if r != h.rank]
                self._watch = process_watch.watch(peers, lambda pid: group.nudge())
            oneshot_max = config.HOST_ONESHOT_MAX.get()
            if oneshot_max is not None:  # else the group's own, by its size (gc_direct.h)
                group.oneshot_max = oneshot_max
            single_copy_min = config.HOST_SINGLE_COPY_MIN.get()
            if single_copy_min is not None:
                group.single_copy_min = single_copy_min
            self._group = group
        return self._group

    def run(self, call, algo):
        send, recv = addresses(call, self.view.rank)
        _RUN[call.kind](self.group(), call, send, recv, self.timeout)

    def mode(self, call):
        """How the group runs `call`, for the debug log: the rule of gc_direct.h, read from the
        group's limits ('' where there is one way)."""
        group = self.group()
        if call.kind in ("allreduce", "reduce"):
            oneshot = call.nbytes <= min(group.oneshot_max, group.slot_bytes)
            return f"one-shot (up to {group.oneshot_max} B)" if oneshot else f"two-shot (above {group.oneshot_max} B)"
        if call.kind == "alltoall":
            send, recv = addresses(call, self.view.rank)
            limit = group.single_copy_min
            if limit and call.nbytes * self.view.size >= limit and send != recv:
                return f"single copy (from {limit} B sent, where every rank may read the others)"
            return "staged" + (" (in place)" if send == recv else f" (below {limit} B sent)" if limit else "")
        return ""

    def announce(self, call):
        """A barrier of the segment carrying the call's signature (raises MismatchError on
        every rank when they differ): for calls run where nothing compares signatures."""
        op = call.op.code if call.op is not None else -1
        self.group().announce(KINDS[call.kind].id, call.count, call.code, op, call.root, self.timeout)

    def fast_path(self, hooks):
        """The communicator's packed host fast path (HostFast) over this engine's group.
        hooks: the dispatcher's public face for it (see HostFast)."""
        import numpy as np

        from ..base import ops
        from .._native.direct import HostFast

        return HostFast(self.group(), hooks, IN_PLACE, np.ndarray, ops.Op, dtypes.CODES)

    def revoke(self):
        if self._group is not None:
            self._group.revoke()

    def close(self):
        if self._watch is not None:
            process_watch.unwatch(self._watch)
            self._watch = None
        if self._group is not None:
            self._group.close()
