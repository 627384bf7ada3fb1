"""Shared-memory channels between the ranks of one host: naming, creation, clean-up.

One segment per unordered pair of ranks (a < b) of a communicator, holding a ring for each
direction (layout and protocol: cython_src/include/gc_shmchan.h). Channels are made on first
use, so a communicator pays only for the pairs its algorithms talk over::

    chans = ShmChannels(JobSegments(job_id, secret), comm_id, rank, pids)  # pids[r]: pid of rank r
    ptr = chans.channel(peer).ptr                       # gc_chan address for run_schedule
    chans.close()

Names, exclusive creation and the checks made before attaching: shm_segment.py (a file of the
right name that this job did not make raises SharedMemoryError on both ranks of the pair).

Life cycle, chosen so that a crash leaves nothing in /dev/shm:

- the lower rank of the pair creates the segment (replacing a leftover of an earlier run whose
  processes are gone) and goes on at once: its sends wait in the ring;
- the higher rank attaches, retrying until the segment is there and initialised or the
  timeout passes, and then unlinks the name straight away. From then on the memory lives only
  in the two mappings and the kernel frees it when both processes are gone, however they end;
- the window between create and attach is the only one in which a name can be left behind:
  a creator that closes before its peer attached keeps the name, because the peer may still
  come for messages already waiting in the ring (a Send that returned before the receiver
  arrived). The launcher removes what a job left when it ends (JobSegments.unlink_all), and a
  later job removes segments whose processes are all gone (shm_segment.remove_leftovers).

Ring size: GPUCOLL_BUFFSIZE bytes per direction (rounded up to pages, clamped to 4 KiB..1 GiB),
chosen by the creator and read from the segment by the attacher, so the two always agree.
"""
import os
import time

from .._native import core
from .._native import direct as _direct
from ..base import config, errors, log
from . import shm_segment


def pid_alive(pid):
    """False once the process of this host is gone (or only a zombie waiting to be reaped): the
    rule of cython_src/include/gc_proc.h, which the native waits use too."""
    return not _direct.pid_dead(pid or 0)


class ShmChannels:
    """The shared-memory channels of one rank of a communicator toward its on-host peers.

    segments (a shm_segment.JobSegments) names the job's segment files and their tokens.
    pids[r] is the process id of rank r (or None/0 when unknown): the attaching side uses it
    to tell a live creator from a stale segment of the same name. watch[r] (default: pids)
    is the pid to watch for liveness, 0 where it means nothing here (another host or pid
    namespace): the attaching side stops waiting when the creator has ended, and a created
    channel counts its peer gone when that process ends before attaching. capacity defaults
    to GPUCOLL_BUFFSIZE, timeout (seconds to wait for a peer's segment) to GPUCOLL_TIMEOUT.
    """

    def __init__(self, segments, comm_id, rank, pids=None, capacity=None, timeout=None, watch=None):
        self.segments = segments
        self.comm_id = comm_id
        self.rank = rank
        self.pids = list(pids) if pids is not None else []
        self.watch = list(watch) if watch is not None else self.pids
        self.capacity = int(capacity if capacity is not None else config.BUFFSIZE.get())
        self.timeout = float(timeout if timeout is not None else config.TIMEOUT.get())
        self._chans = {}
        self._created = {}          # peer -> name of the segments we created

    def _pid(self, r, table=None):
        table = self.pids if table is None else table
        return table[r] if 0 <= r < len(table) and table[r] else 0

    def path(self, peer):
        """The segment file of the channel between this rank and `peer`."""
        lo, hi = min(self.rank, peer), max(self.rank, peer)
        return self.segments.path(f"pair:{self.comm_id}:{lo}-{hi}")

    def channel(self, peer):
        """The ShmChannel to `peer`, created (lower rank) or attached (higher rank) on first use."""
        chan = self._chans.get(peer)
        if chan is not None:
            return chan
        if peer == self.rank:
            raise errors.InvalidUsageError(f"rank {peer} has no shared-memory channel to itself")
        path = self.path(peer)
        name, token = os.path.basename(path), self.segments.token(path)
        if self.rank < peer:
            fd = shm_segment.create(path, 0, token)
            try:
                chan = core.ShmChannel.create(fd, name, self.capacity, token, shm_segment.PIDNS,
                                              self._pid(peer, self.watch), peer)
            except BaseException:
                shm_segment.unlink_quietly(path)
                raise
            finally:
                os.close(fd)
            self._created[peer] = name
            log.info("SHM", "created %s (%s, %d B per ring) for rank %d", name, self.comm_id,
                     chan.capacity, peer)
        else:
            chan = self._attach(path, token, peer)
            chan.unlink()           # both ends are mapped: the name is no longer needed
            log.info("SHM", "attached %s (%s, %d B per ring) from rank %d", name, self.comm_id,
                     chan.capacity, peer)
        self._chans[peer] = chan
        return chan

    def _attach(self, path, token, peer):
        creator, watched = self._pid(peer), self._pid(peer, self.watch)
        name = os.path.basename(path)
        deadline = time.monotonic() + self.timeout
        delay = 0.0005
        while True:
            fd = shm_segment.open_checked(path)
            if fd is not None:
                try:
                    chan = core.ShmChannel.attach(fd, name, creator, token, shm_segment.PIDNS, peer)
                finally:
                    os.close(fd)
                if isinstance(chan, core.ShmChannel):
                    return chan
                if chan == core.SHM_FOREIGN:
                    raise shm_segment.squatted(path, "holds a segment with another job's token")
            if watched and not pid_alive(watched):
                raise errors.LostPeerError(
                    f"rank {peer} (pid {watched}) died before creating shared memory {path}",
                    ranks=(peer,))
            if time.monotonic() >= deadline:
                raise errors.TimeoutError(
                    f"rank {peer} did not create shared memory {path} within "
                    f"{self.timeout:g} s")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def pointers(self, size):
        """A uint64 table of gc_chan addresses indexed by rank for every channel made so far."""
        import numpy as np

        table = np.zeros(size, dtype=np.uint64)
        for peer, chan in self._chans.items():
            table[peer] = chan.ptr
        return table

    def close(self):
        """Close every channel (peers then see this rank as gone). A name we created is removed
        if its peer attached (normally the peer already did), else left for the peer."""
        for peer, chan in self._chans.items():
            if peer in self._created and chan.peer_attached:
                try:
                    chan.unlink()
                except errors.GpucollError:
                    pass
            chan.close()
        self._chans.clear()
        self._created.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<ShmChannels job={self.segments.job_id} comm={self.comm_id} rank={self.rank} "
                f"peers={sorted(self._chans)}>")
