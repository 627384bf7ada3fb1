"""The peer channels of one communicator, made on first use.

A peer on this host gets a shared-memory channel (unless GPUCOLL_SHM_DISABLE=1); a peer
on another host an OFI or a TCP channel (net.py chooses). The executor receives a table of raw channel pointers
indexed by peer rank; this object keeps the channel objects alive behind it.
"""
import numpy as np

from ..base import config, log
from . import net


class ChannelSet:
    """timeout: seconds to wait for a peer's side of a new channel (default GPUCOLL_TIMEOUT:
    channels are made in a collective, which a peer may reach late); check: called while
    waiting, raises to stop the wait (a rank known to have ended)."""

    def __init__(self, comm, purpose, use_shm, timeout=None, check=None):
        self._comm = comm
        self._ctx = comm.ctx
        self._id = f"{comm.id}/{purpose}"
        self._use_shm = use_shm
        self._ptrs = np.zeros(comm.size, dtype=np.uint64)
        self._objs = {}
        self._shm = None
        self._nsocks = config.NSOCKS.get()
        self._timeout = config.TIMEOUT.get() if timeout is None else timeout
        self._check = check

    def _shm_factory(self):
        if self._shm is None:
            from .shm import ShmChannels
            from .shm_segment import JobSegments

            comm, ctx = self._comm, self._ctx
            self._shm = ShmChannels(JobSegments(ctx.job_id, ctx.secret), self._id, comm.rank,
                                    [ctx.pids[w] for w in comm.world_ranks],
                                    watch=[ctx.watch_pid(w) for w in comm.world_ranks], timeout=self._timeout)
        return self._shm

    def _connect(self, peer):
        comm, ctx = self._comm, self._ctx
        world = comm.world_ranks[peer]
        if self._use_shm and ctx.hosts[world] == ctx.hosts[ctx.rank]:
            chan, how = self._shm_factory().channel(peer), "SHM"
        else:
            chan, how = net.channel(ctx, world, self._id, self._timeout, self._check, nsocks=self._nsocks)
        log.info("INIT", "%s: channel to rank %d (world %d, %s) via %s", self._id, peer, world,
                 ctx.hosts[world], how)
        self._objs[peer] = chan
        self._ptrs[peer] = chan.ptr

    def pointers(self, peers):
        """The pointer table, with a channel to each of `peers` (connected if new)."""
        for peer in peers:
            if not self._ptrs[peer]:
                self._connect(peer)
        return self._ptrs

    def close(self):
        if self._shm is not None:
            self._shm.close()  # first: it reads its channels' state to know which names to remove
        for chan in self._objs.values():
            chan.close()
        self._objs.clear()
        self._ptrs[:] = 0
