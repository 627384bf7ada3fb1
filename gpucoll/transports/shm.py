"""Shared-memory channels between the ranks of one host: naming, creation, clean-up.

One segment per unordered pair of ranks (a < b) of a communicator, holding a ring for each
direction (layout and protocol: cython_src/include/gc_shmchan.h). Channels are made on first
use, so a communicator pays only for the pairs its algorithms talk over::

    chans = ShmChannels(job_id, comm_id, rank, pids)   # pids[r]: process id of rank r
    ptr = chans.channel(peer).ptr                       # gc_chan address for run_schedule
    chans.close()

Life cycle, chosen so that a crash leaves nothing in /dev/shm:

- the lower rank of the pair creates ``/dev/shm/gpucoll-<job>-<comm>-<a>-<b>`` (replacing a
  stale one of that name) and goes on at once: its sends wait in the ring;
- the higher rank attaches, retrying until the segment is there and initialised or the
  timeout passes, and then unlinks the name straight away. From then on the memory lives only
  in the two mappings and the kernel frees it when both processes are gone, however they end;
- the window between create and attach is the only one in which a name can be left behind:
  a creator that closes before its peer attached keeps the name, because the peer may still
  come for messages already waiting in the ring (a Send that returned before the receiver
  arrived); ``unlink_job(job_id)`` removes whatever a job left (a launcher calls it when the
  job ends).

Ring size: GPUCOLL_BUFFSIZE bytes per direction (rounded up to pages, clamped to 4 KiB..1 GiB),
chosen by the creator and read from the segment by the attacher, so the two always agree.
"""
import os
import re
import time

from .. import config, errors, log
from .._native import core

SHM_DIR = "/dev/shm"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _part(text):
    """A piece of a segment name: only characters that are safe in a file name."""
    return _UNSAFE.sub("_", str(text)) or "_"


def segment_name(job_id, comm_id, a, b):
    """The name (no leading slash) of the segment of ranks a and b of a communicator."""
    lo, hi = min(a, b), max(a, b)
    name = f"gpucoll-{_part(job_id)}-{_part(comm_id)}-{lo}-{hi}"
    if len(name) > 250:                      # NAME_MAX is 255: keep the distinctive tail
        name = f"gpucoll-{_part(job_id)[:40]}-{abs(hash(comm_id)):x}-{lo}-{hi}"
    return name


def unlink_job(job_id):
    """Remove every pair segment that a job left under /dev/shm; returns how many."""
    prefix = f"gpucoll-{_part(job_id)}-"
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass
    return removed


def pid_alive(pid):
    """False once the process of this host is gone (or only a zombie waiting to be reaped)."""
    if not pid or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


class ShmChannels:
    """The shared-memory channels of one rank of a communicator toward its on-host peers.

    pids[r] is the process id of rank r (or None/0 when unknown): the attaching side uses it
    to tell a live creator from a stale segment of the same name. watch[r] (default: pids)
    is the pid to watch for liveness, 0 where it means nothing here (another host or pid
    namespace): the attaching side stops waiting when the creator has ended, and a created
    channel counts its peer gone when that process ends before attaching. capacity defaults
    to GPUCOLL_BUFFSIZE, timeout (seconds to wait for a peer's segment) to GPUCOLL_TIMEOUT.
    """

    def __init__(self, job_id, comm_id, rank, pids=None, capacity=None, timeout=None, watch=None):
        self.job_id = job_id
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

    def name(self, peer):
        return segment_name(self.job_id, self.comm_id, self.rank, peer)

    def channel(self, peer):
        """The ShmChannel to `peer`, created (lower rank) or attached (higher rank) on first use."""
        chan = self._chans.get(peer)
        if chan is not None:
            return chan
        if peer == self.rank:
            raise errors.InvalidUsageError(f"rank {peer} has no shared-memory channel to itself")
        name = self.name(peer)
        if self.rank < peer:
            chan = core.ShmChannel.create(name, self.capacity, peer)
            chan.watch_peer(self._pid(peer, self.watch))
            self._created[peer] = name
            log.info("SHM", "created %s (%d B per ring) for rank %d", name, chan.capacity, peer)
        else:
            chan = self._attach(name, peer)
            chan.unlink()           # both ends are mapped: the name is no longer needed
            log.info("SHM", "attached %s (%d B per ring) from rank %d", name, chan.capacity, peer)
        self._chans[peer] = chan
        return chan

    def _attach(self, name, peer):
        creator, watched = self._pid(peer), self._pid(peer, self.watch)
        deadline = time.monotonic() + self.timeout
        delay = 0.0005
        while True:
            chan = core.ShmChannel.attach(name, creator, peer)
            if chan is not None:
                return chan
            if watched and not pid_alive(watched):
                raise errors.LostPeerError(
                    f"rank {peer} (pid {watched}) died before creating shared memory {name}",
                    ranks=(peer,))
            if time.monotonic() >= deadline:
                raise errors.TimeoutError(
                    f"rank {peer} did not create shared memory {SHM_DIR}/{name} within "
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
        return (f"<ShmChannels job={self.job_id} comm={self.comm_id} rank={self.rank} "
                f"peers={sorted(self._chans)}>")
