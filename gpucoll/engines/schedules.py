"""The schedule engine: a collective as a schedule of steps (gpucoll/algorithms) run by the
native executor over the communicator's peer channels (shared memory within a host, TCP
between hosts). Cost-table rows: every schedule algorithm of the selector (ring, tree,
recursive halving-doubling, ...). Also runs the GPUCOLL_DEBUG_CHECKS cross-check (an
all-gather of the call signatures)."""
import functools

import numpy as np

from ..algorithms import schedule as build_schedule
from ..base import dtypes
from ..base import ops as _ops
from ..base.call import ROOTED, addresses


@functools.lru_cache(maxsize=1024)
def _peers_of(sched):
    """Peer ranks a schedule talks to (columns send_peer and recv_peer)."""
    cols = sched.steps[:, [1, 5]]
    return tuple(int(p) for p in np.unique(cols[cols >= 0]))


class ScheduleEngine:
    rows = None  # every algorithm of the selector that is not a native engine's

    def __init__(self, view, use_shm, timeout, check_alive):
        self.view = view
        self.use_shm = use_shm
        self.timeout = timeout
        self._check_alive = check_alive
        self._channels = None
        self._scratch = np.empty(0, np.uint8)
        # Set by revoke() (possibly from the watcher thread): a run waiting on a peer ends with
        # RevokedError (gc_exec.h looks at it with its deadline)
        self._revoked = np.zeros(1, np.int32)
        self._revoked_addr = self._revoked.ctypes.data

    def channels(self):
        if self._channels is None:
            from ..transports.channels import ChannelSet

            self._channels = ChannelSet(self.view, "coll", use_shm=self.use_shm, timeout=self.timeout,
                                        check=self._check_alive)
        return self._channels

    def _scratch_addr(self, nbytes):
        if self._scratch.size < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.size), np.uint8)
        return self._scratch.__array_interface__["data"][0]

    def run(self, call, algo):
        from .._native import core

        h = self.view
        isz = dtypes.ITEMSIZE[call.code]
        send, recv = addresses(call, h.rank)
        sched = build_schedule(call.kind, algo, h.rank, h.size, call.count, root=call.root,
                               inplace=call.send is None or call.send.addr == (0 if call.recv is None else call.recv.addr))
        scratch = self._scratch_addr(sched.scratch_count * isz) if sched.scratch_count else 0
        # AVG travels as AVG (the executor reduces it as SUM), so that a peer's SUM differs
        op = call.op.code if call.op is not None else _ops.SUM.code
        root = call.root if call.kind in ROOTED else -1
        if root >= 0 and sched.nsteps:
            # A rooted schedule's data does not reach every rank (a bcast's root receives
            # nothing), so ranks that disagree on the root would return with their own data or
            # wait for a root that never sends. First a dissemination barrier whose empty
            # messages carry the call's header: a rank that completes it has a chain of
            # matching headers from every rank, and every rank runs it whatever root it took.
            # Its own run, before the data schedule's channels are made: on first use a
            # rank waits for the peers of its schedule to connect, which differ with the root.
            bar = build_schedule("barrier", "dissemination", h.rank, h.size)
            core.run_schedule(bar.steps, self.channels().pointers(_peers_of(bar)), send, recv, 0, isz, call.code,
                              op, self.timeout, root=root, revoked_addr=self._revoked_addr)
        chans = self.channels().pointers(_peers_of(sched))
        core.run_schedule(sched.steps, chans, send, recv, scratch, isz, call.code, op, self.timeout, root=root,
                          revoked_addr=self._revoked_addr)
        if call.op is _ops.AVG and call.recv is not None and (call.kind != "reduce" or h.rank == call.root):
            core.scale_avg(call.recv.array[:call.count], call.code, h.size)

    def gather_signatures(self, call):
        """Every rank's Call.signature(), in rank order (an all-gather over the channels)."""
        from .._native import core

        h = self.view
        mine = np.array(call.signature(), dtype=np.int64)
        table = np.empty(h.size * mine.size, dtype=np.int64)
        sched = build_schedule("allgather", "ring", h.rank, h.size, mine.size)
        core.run_schedule(sched.steps, self.channels().pointers(_peers_of(sched)), mine.__array_interface__["data"][0],
                          table.__array_interface__["data"][0], 0, 8, dtypes.INT64, 0, self.timeout,
                          revoked_addr=self._revoked_addr)
        return table.reshape(h.size, mine.size)

    def revoke(self):
        """Fail the runs that wait on this communicator's peers (ULFM's revoke; any thread)."""
        self._revoked[0] = 1

    def close_channels(self):
        if self._channels is not None:
            self._channels.close()

    close = close_channels
