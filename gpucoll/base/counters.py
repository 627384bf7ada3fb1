"""Which path each call of a communicator took: the counters behind `Communicator.stats()`.

A fast path that silently declines, a group that runs nothing together, a GPU call that
falls back to host memory: each still gives the right answer, only slower. These counters
are how tests (and users who wonder why a call is slow) see which path ran::

    before = comm.stats()
    comm.Allreduce(gpucoll.IN_PLACE, x)
    comm.stats()["host_fast"] - before["host_fast"]     # 1: the native fast path ran it

Each counter is bumped by the code that takes the path, in the thread that runs the call
(calls of one communicator never run at the same time).
"""
import collections


class PathCounters:
    """The counters of one communicator (all start at 0)."""

    __slots__ = ("host", "gpu", "gpu_fast", "groups", "group_deferred", "group_p2p", "fused_launches",
                 "fused_calls", "p2p_slot_launches", "p2p_slot_messages")

    def __init__(self):
        self.host = collections.Counter()  # host collectives of the general path, by algorithm
        self.gpu = collections.Counter()   # GPU collectives, by algorithm (fused ones: fused_calls)
        self.gpu_fast = 0        # GPU all-reduces launched from their packed launch
        self.groups = 0          # outermost comm.group() blocks completed
        self.group_deferred = 0  # GPU collectives that a group deferred to its end
        self.group_p2p = 0       # Send/Recv that a group completed at its end
        self.fused_launches = 0  # fused all-reduce launches (ar_oneshot_multi)
        self.fused_calls = 0     # all-reduces run by those launches
        self.p2p_slot_launches = 0  # slot kernel launches of small GPU messages (gpucoll/engines/p2p/outboxes.py)
        self.p2p_slot_messages = 0  # sends and receives those launches carried

    def snapshot(self, host_fast):
        """A plain dict of the counters; `host_fast`: the calls the host fast path ran."""
        return {"host_fast": host_fast, "host": dict(self.host), "gpu_fast": self.gpu_fast, "gpu": dict(self.gpu),
                "groups": self.groups, "group_deferred": self.group_deferred, "group_p2p": self.group_p2p,
                "fused_launches": self.fused_launches, "fused_calls": self.fused_calls,
                "p2p_slot_launches": self.p2p_slot_launches, "p2p_slot_messages": self.p2p_slot_messages}
