"""Hierarchical allreduce for communicators that span hosts with several ranks on some.

Three phases, each an ordinary collective on a sub-communicator, so each runs on the
transport that suits it:

    1. reduce to the host's leader (local rank 0) inside each host: shared memory, `direct`
    2. allreduce among the leaders, one per host: TCP (verbs where a data path exists)
    3. bcast from the leader inside each host: shared memory, `direct`

The sub-communicators need no exchange: every rank knows every rank's host from the
bootstrap, so each builds them locally with the same names. The choice against the flat
schedule is the cost model's (selector.py's links and table)::

    h = Hierarchy(comm)
    h.applies                      # several hosts and more than one rank on one of them
    h.prefer(nbytes)               # hierarchical cheaper than the best flat schedule?
    h.allreduce(call)              # runs the three phases for a dispatch Call

Every element is still combined in one fixed order (inside hosts, then across leaders),
so results are bitwise identical on every rank.
"""
from functools import lru_cache

from . import selector


def costs(nbytes, size, local_max, nhosts, inter="tcp", intra="shm"):
    """(flat seconds, hierarchical seconds) by the cost model."""
    flat = min(selector.cost("allreduce", a, nbytes, size, inter) for a in selector.candidates("allreduce", inter))
    cross = min(selector.cost("allreduce", a, nbytes, nhosts, inter)
                for a in selector.candidates("allreduce", inter))
    inside = 0.0
    if local_max > 1:
        inside = (selector.cost("reduce", "direct", nbytes, local_max, intra)
                  + selector.cost("bcast", "direct", nbytes, local_max, intra))
    return flat, cross + inside


class Hierarchy:
    """The host layout of one communicator and, once needed, its two sub-communicators."""

    def __init__(self, comm):
        ctx = comm._ctx
        hosts = [ctx.hosts[w] for w in comm.world_ranks]
        self.order = list(dict.fromkeys(hosts))            # hosts in order of first rank
        self.nhosts = len(self.order)
        counts = [hosts.count(h) for h in self.order]
        self.local_max = max(counts)
        self.applies = self.nhosts > 1 and self.local_max > 1
        self.via = "SHM+TCP"
        self._comm = comm
        self._hosts = hosts
        self._local = self._leaders = None
        self._prefer = lru_cache(maxsize=256)(self._decide)

    def _decide(self, nbytes):
        flat, hier = costs(nbytes, self._comm.size, self.local_max, self.nhosts)
        return hier < flat

    def prefer(self, nbytes):
        return self.applies and self._prefer(nbytes)

    def _subcomms(self):
        if self._local is None:
            from ..comm import Communicator

            comm, ctx = self._comm, self._comm._ctx
            me = self._hosts[comm.rank]
            index = self.order.index(me)
            mine = [w for w, h in zip(comm.world_ranks, self._hosts) if h == me]
            leaders = [next(w for w, h in zip(comm.world_ranks, self._hosts) if h == host) for host in self.order]
            self._local = Communicator(ctx, f"{comm._id}.host{index}", mine)
            if ctx.rank in leaders:
                self._leaders = Communicator(ctx, f"{comm._id}.leaders", leaders)
        return self._local, self._leaders

    def allreduce(self, call):
        """Reduce inside the host, allreduce across leaders, bcast inside the host. AVG is
        summed through the phases and divided once at the end, as the flat path does."""
        from .. import ops as _ops
        from ..dispatch import Call

        local, leaders = self._subcomms()
        n, code, op = call.count, call.code, call.op
        avg = op is _ops.AVG
        if avg:
            op = _ops.SUM
        Call(local._dispatch, "reduce", call.send, call.recv, n, code, op, 0).run()
        if leaders is not None:
            Call(leaders._dispatch, "allreduce", None, call.recv, n, code, op).run()
        Call(local._dispatch, "bcast", call.recv, call.recv, n, code, root=0).run()
        if avg:
            from .._native import core

            core.scale_avg(call.recv.array[:n], code, self._comm.size)

    def close(self):
        for sub in (self._local, self._leaders):
            if sub is not None:
                sub.Free()
