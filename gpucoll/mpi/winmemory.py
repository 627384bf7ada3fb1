"""Direct access to the windows of the other processes of this host (one-sided operations
without a round trip).

When every process of a window runs on one host, in one pid namespace, an origin reads and
writes the target's window memory itself with process_vm_readv/process_vm_writev (cross-memory
attach: one copy, nothing to do for the target, no thread to wake). Put and Get are complete when
they return, which MPI allows (completion at the next synchronisation is the latest it may
happen). What MPI wants atomic is made so with a lock per target window, a POSIX record lock on
a small file that the target made and unlinked once every process had opened it:

- byte 0: the window's lock epochs (Lock, Lock_all): shared or exclusive, as asked;
- byte 1: accumulates, fetch-and-op and compare-and-swap hold it exclusively while they read,
  combine and write back the target's bytes, so each is atomic per element against the others.

Record locks belong to the process and go with it: a crashed origin releases what it held. The
arithmetic of accumulates is the target side's too (win.py's service thread, for windows that
span hosts): `accumulated` and `swapped` are shared.
"""
import ctypes
import errno
import fcntl
import os
import tempfile
import threading
import time

import numpy as np

from ..base import config
from ..base.errors import InvalidUsageError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.mpi_constants import INTEGERS as _C
from .op import PREDEFINED as _OPS

IOV_MAX = 1024           # iovecs one process_vm_* call takes (Linux's UIO_MAXIOV)
EPOCH, ATOMIC = 0, 1     # the bytes of a target's lock file
_libc = ctypes.CDLL(None, use_errno=True)
_PROBE = np.ones(1, np.uint8)   # a byte every process can read from every other (the probe)


def accumulated(old, op, dtype, data):
    """The bytes of `old` (uint8) combined element by element with `data` by predefined op."""
    current = old.view(dtype).copy()
    _OPS[op]._r.array(np.frombuffer(data, dtype), current)
    return current.view(np.uint8)


def swapped(old, compare, data):
    """Compare-and-swap: the new bytes, or None when old is not compare."""
    return np.frombuffer(data, np.uint8) if old.tobytes() == compare else None


def runs(datatype, count):
    """(byte positions, lengths) of the runs of consecutive bytes that count elements of datatype
    cover, in typemap order (what a target layout becomes)."""
    return datatype._t.runs(count)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _transfer(call, pid, local, remote, lengths, what):
    """Move bytes between local memory (`local`: contiguous uint8, filled or drained in order) and
    the remote runs (addresses, lengths), IOV_MAX runs per system call."""
    base = local.__array_interface__["data"][0]
    if remote.size == 1:  # the common case, without arrays of iovecs
        nbytes = int(lengths[0])
        _check(call(pid, ctypes.byref(_Iovec(base, nbytes)), 1, ctypes.byref(_Iovec(int(remote[0]), nbytes)), 1, 0),
               nbytes, pid, what)
        return
    at = 0
    for k in range(0, remote.size, IOV_MAX):
        addr, size = remote[k:k + IOV_MAX], lengths[k:k + IOV_MAX]
        nbytes = int(size.sum())
        iov = np.empty((addr.size, 2), np.uintp)
        iov[:, 0], iov[:, 1] = addr, size
        _check(call(pid, ctypes.byref(_Iovec(base + at, nbytes)), 1, ctypes.c_void_p(iov.ctypes.data), addr.size, 0),
               nbytes, pid, what)
        at += nbytes


def _check(done, nbytes, pid, what):
    if done != nbytes:
        code = ctypes.get_errno() if done < 0 else 0
        raise InvalidUsageError(f"{what}: moved {max(done, 0)} of {nbytes} bytes of process {pid}'s window "
                                f"({os.strerror(code) if code else 'short transfer'}); did it free the "
                                "window's memory?", error_class=_C["ERR_RMA_SYNC"])


def readable(pid, address):
    """True when this process may read a byte at `address` of process pid."""
    got = np.zeros(1, np.uint8)
    try:
        _transfer(_libc.process_vm_readv, pid, got, np.array([address], np.uintp), np.ones(1, np.uintp), "probe")
    except InvalidUsageError:
        return False
    return True


def possible(ctx, world_ranks):
    """(whether this process can reach every window of world_ranks directly, what the others
    need to probe it): same host, same pid namespace, and allowed by settings."""
    ok = config.RMA_DIRECT.get() and all(w == ctx.rank or ctx.watch_pid(w) for w in world_ranks)
    return ok, (os.getpid(), _PROBE.ctypes.data)


def lock_file():
    """(fd, path) of this process's new lock file (mode 0600), in memory where there is /dev/shm;
    (-1, None) when none can be made."""
    for where in ("/dev/shm", tempfile.gettempdir()):
        try:
            return tempfile.mkstemp(prefix="gpucoll-win-", dir=where)
        except OSError:
            continue
    return -1, None


class DirectAccess:
    """The windows of a group of one host: [(pid, address, size, disp_unit)] per rank and the
    lock file of each (fds, open here)."""

    def __init__(self, table, fds):
        self.table, self.fds = table, fds
        self.timeout = config.TIMEOUT.get()
        self.threads = threading.Lock()  # record locks are the process's: its threads take turns here

    def close(self):
        for fd in self.fds:
            os.close(fd)  # releases every lock this process still holds
        self.fds = []

    def _where(self, rank, disp, layout, what):
        """(pid, addresses of the runs) of a layout (runs()) at displacement disp of rank's window."""
        pid, address, size, unit = self.table[rank]
        offset = disp * unit
        positions, lengths = layout
        if positions.size == 1:
            lo = offset + int(positions[0])
            hi = lo + int(lengths[0])
        else:
            lo, hi = offset + int(positions.min()), offset + int((positions + lengths).max())
        if lo < 0 or hi > size:
            raise InvalidUsageError(f"{what}: bytes [{lo}, {hi}) of rank {rank}'s window are outside its {size} "
                                    "bytes", error_class=_C["ERR_ARG"])
        return pid, (positions + (address + offset)).astype(np.uintp)

    def put(self, rank, disp, layout, data, what):
        """Write data (packed bytes) into the layout's runs."""
        if layout[0].size:
            pid, addresses = self._where(rank, disp, layout, what)
            _transfer(_libc.process_vm_writev, pid, np.ascontiguousarray(data), addresses, layout[1], what)

    def get(self, rank, disp, layout, into, what):
        """Read the layout's bytes into `into` (contiguous uint8 of their number); into."""
        if layout[0].size:
            pid, addresses = self._where(rank, disp, layout, what)
            _transfer(_libc.process_vm_readv, pid, into, addresses, layout[1], what)
        return into

    def update(self, rank, disp, layout, change, what):
        """Atomically: read the target's bytes, write back change(old) unless it is None; the old bytes."""
        with self.threads:
            self._lock(rank, ATOMIC, fcntl.LOCK_EX, what)
            try:
                old = self.get(rank, disp, layout, np.empty(int(layout[1].sum()), np.uint8), what)
                new = change(old)
                if new is not None:
                    self.put(rank, disp, layout, new, what)
                return old
            finally:
                fcntl.lockf(self.fds[rank], fcntl.LOCK_UN, 1, ATOMIC)

    def lock(self, rank, exclusive, what):
        self._lock(rank, EPOCH, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, what)

    def unlock(self, rank):
        fcntl.lockf(self.fds[rank], fcntl.LOCK_UN, 1, EPOCH)

    def _lock(self, rank, byte, kind, what):
        """Take a record lock, waiting at most GPUCOLL_TIMEOUT (polling: a blocked lock call could
        not be given up)."""
        fd, pause, deadline = self.fds[rank], 20e-6, None
        while True:
            try:
                fcntl.lockf(fd, kind | fcntl.LOCK_NB, 1, byte)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            now = time.monotonic()
            deadline = deadline or now + self.timeout
            if now > deadline:
                raise GpucollTimeout(f"{what}: rank {rank}'s window stayed locked by another process for "
                                     f"{self.timeout:g} s (GPUCOLL_TIMEOUT); is a lock never released?")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
