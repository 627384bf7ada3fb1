"""The hierarchical engine: all-reduce on communicators that span hosts with several ranks on
some. Cost-table row: "hierarchical" (its cost: gpucoll/algorithms/hierarchical.py).

Three phases, each an ordinary collective on a sub-communicator, so each runs on the
transport that suits it:

    1. reduce to the host's leader (local rank 0) inside each host: shared memory, `direct`
    2. allreduce among the leaders, one per host: TCP (verbs where a data path exists)
    3. bcast from the leader inside each host: shared memory, `direct`

The sub-communicators need no exchange: every rank knows every rank's host from the
bootstrap, so each makes them locally with the same names (view.subgroup). Every element
is still combined in one fixed order (inside hosts, then across leaders), so results are
bitwise identical on every rank.
"""
from functools import lru_cache

from ..algorithms.hierarchical import costs
from ..base import ops as _ops
from ..base.call import Call

ROWS = ("hierarchical",)


class HierarchicalEngine:
    """The host layout of one communicator and, once needed, its two sub-communicators."""

    rows = ROWS

    def __init__(self, view):
        hosts = [view.ctx.hosts[w] for w in view.world_ranks]
        self.order = list(dict.fromkeys(hosts))            # hosts in order of first rank
        self.nhosts = len(self.order)
        counts = [hosts.count(h) for h in self.order]
        self.local_max = max(counts)
        self.applies = self.nhosts > 1 and self.local_max > 1
        self.view = view
        self._hosts = hosts
        self._local = self._leaders = None
        self._prefer = lru_cache(maxsize=256)(self._decide)

    def _decide(self, nbytes):
        flat, hier = costs(nbytes, self.view.size, self.local_max, self.nhosts)
        return hier < flat

    def can_run(self, call):
        """Whether the call is one this engine takes: a host all-reduce on a communicator that
        spans hosts with several ranks on some (every other row serves whatever reaches it)."""
        return self.applies and call.kind == "allreduce" and not call.gpu

    def prefer(self, nbytes):
        """Cheaper than the best flat schedule for an all-reduce of nbytes?"""
        return self.applies and self._prefer(nbytes)

    def _subgroups(self):
        if self._local is None:
            h = self.view
            me = self._hosts[h.rank]
            index = self.order.index(me)
            mine = [w for w, host in zip(h.world_ranks, self._hosts) if host == me]
            leaders = [next(w for w, host in zip(h.world_ranks, self._hosts) if host == x) for x in self.order]
            self._local = h.subgroup(f"{h.id}.host{index}", mine)
            if h.ctx.rank in leaders:
                self._leaders = h.subgroup(f"{h.id}.leaders", leaders)
        return self._local, self._leaders

    def run(self, call, algo):
        """Reduce inside the host, allreduce across leaders, bcast inside the host. AVG is
        summed through the phases and divided once at the end, as the flat path does."""
        local, leaders = self._subgroups()
        n, code, op = call.count, call.code, call.op
        avg = op is _ops.AVG
        if avg:
            op = _ops.SUM
        local.run(Call("reduce", call.send, call.recv, n, code, op, 0))
        if leaders is not None:
            leaders.run(Call("allreduce", None, call.recv, n, code, op))
        local.run(Call("bcast", call.recv, call.recv, n, code, root=0))
        if avg:
            from .._native import core

            core.scale_avg(call.recv.array[:n], code, self.view.size)

    def close(self):
        for sub in (self._local, self._leaders):
            if sub is not None:
                sub.free()
