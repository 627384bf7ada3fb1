# cython: language_level=3
"""Native core: element-wise reductions, shared-memory channels and the schedule executor.

Thin bindings of cython_src/include/gc_reduce.h, gc_shmchan.h and gc_exec.h; the policy (names,
sizes, retries, which channel serves which peer) lives in gpucoll/transports/. Every call that
can fail goes through ``_check``, which hands its status to gpucoll.base.errors.native_error.

    >>> import numpy as np
    >>> from gpucoll._native import core
    >>> a = np.arange(4, dtype=np.float32); core.reduce(a, np.ones(4, np.float32), 10, 0); a
    array([1., 2., 3., 4.], dtype=float32)
"""
from libc.stdint cimport int64_t, uint64_t, uintptr_t, int32_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE

from gpucoll.base import errors

cdef extern from "gc_types.h" nogil:
    int GC_OK, GC_ERR_TIMEOUT, GC_ERR_PEER, GC_ERR_IO, GC_ERR_USAGE, GC_ERR_NOMEM, GC_ERR_MISMATCH
    int GC_NUM_DTYPES, GC_NUM_OPS
    int GC_SEG_UNKNOWN, GC_SEG_FOREIGN, GC_SEG_IN_USE, GC_SEG_LEFTOVER

cdef extern from "gc_chan.h" nogil:
    ctypedef struct gc_chan:
        int fd
        int peer
        int (*alive)(gc_chan *c)

cdef extern from "gc_reduce.h" nogil:
    size_t gc_dtype_size(int dt)
    int gc_op_valid(int dt, int op)
    void gc_reduce(void *dst, const void *src, size_t count, int dt, int op)
    void gc_scale_avg(void *buf, size_t count, int dt, int nranks)

cdef extern from "gc_shmchan.h" nogil:
    int GC_SHM_NOT_READY, GC_SHM_FOREIGN
    ctypedef struct gc_shmchan:
        gc_chan chan
        uint64_t cap
        int side
    gc_shmchan *gc_shmchan_create(int fd, uint64_t cap, uint64_t token, uint64_t pidns,
                                  int32_t expect_pid, int *err)
    gc_shmchan *gc_shmchan_attach(int fd, int creator_pid, uint64_t token, uint64_t pidns, int *err)
    int gc_shmchan_examine(const void *hdr, size_t size, uint64_t token, uint64_t pidns)
    int gc_shmchan_unlink(const char *name)
    void gc_shmchan_close(gc_shmchan *ch)
    int gc_shmchan_peer_state(const gc_shmchan *ch)

cdef extern from "gc_exec.h" nogil:
    ctypedef struct gc_exec_args:
        const int64_t *steps
        int64_t nsteps
        gc_chan **chans
        int nchans
        char *bufs[3]
        int64_t buf_bytes[3]
        size_t itemsize
        int dtype
        int op
        int root
        int64_t deadline_ns
        const int32_t *revoked
    ctypedef struct gc_exec_err:
        int code
        int peer
        int64_t step
        const char *what
        int64_t got, want
        int mismatch
        int errno_
    int GC_STEP_COLS
    int GC_MISMATCH_BYTES, GC_MISMATCH_DTYPE, GC_MISMATCH_OP, GC_MISMATCH_ROOT
    int64_t gc_now_ns()
    int gc_exec_run(const gc_exec_args *a, gc_exec_err *e)

STEP_COLS = GC_STEP_COLS
# What a segment file holds (gc_types.h GC_SEG_*): see gpucoll/transports/shm_segment.py.
SEG_UNKNOWN, SEG_FOREIGN, SEG_IN_USE, SEG_LEFTOVER = GC_SEG_UNKNOWN, GC_SEG_FOREIGN, GC_SEG_IN_USE, GC_SEG_LEFTOVER
# ShmChannel.attach's answers other than a channel.
SHM_NOT_READY, SHM_FOREIGN = GC_SHM_NOT_READY, GC_SHM_FOREIGN
SEND, RECV, REDUCE, COPY = 1, 2, 4, 8


cdef int _check(int rc, int peer=-1, int64_t step=-1, what=None, int64_t got=0,
                int64_t want=0, int err_no=0, double timeout=0.0, int mismatch=0) except -1:
    """A GC_* status -> errors.native_error (the one error path), told the peer, the step and,
    for a mismatch, what each side has."""
    if rc == GC_OK:
        return 0
    desc = what or "the schedule"
    if rc == GC_ERR_PEER or rc == GC_ERR_TIMEOUT:
        desc += f" rank {peer}"   # the executor says "receiving from", "waiting for room toward"
    elif rc == GC_ERR_MISMATCH:
        from gpucoll.base import dtypes, ops
        if mismatch == GC_MISMATCH_BYTES:
            desc += f" ({got} bytes announced, {want} expected)"
        elif mismatch == GC_MISMATCH_DTYPE:
            name = lambda c: dtypes.name(c) if 0 <= c < GC_NUM_DTYPES else f"dtype {c}"
            desc = f"rank {peer} sent {name(got)}, this rank expects {name(want)}"
        elif mismatch == GC_MISMATCH_OP:
            name = lambda c: ops.ALL[c].name if 0 <= c < GC_NUM_OPS else f"op {c}"
            desc = f"rank {peer} reduces with {name(got)}, this rank with {name(want)}"
        elif mismatch == GC_MISMATCH_ROOT:
            name = lambda r: f"root {r}" if r >= 0 else "no root (a collective without one)"
            desc = f"rank {peer} has {name(got)}, this rank {name(want)}"
    elif rc == GC_ERR_USAGE and got != want:
        desc += f" ({got} bytes announced, {want} expected)"
    if step >= 0:
        desc += f" at step {step}"
    if rc == GC_ERR_MISMATCH or (rc == GC_ERR_USAGE and peer >= 0):
        desc += f" with rank {peer}"
    # A schedule that times out knows only the neighbour it waited for, which may itself be
    # waiting: it names no ranks, and the dispatcher's diagnosis finds those that are late.
    raise errors.native_error(rc, desc, () if rc == GC_ERR_TIMEOUT else (peer,), "", timeout, err_no)


cdef class _Buf:
    """A contiguous buffer-protocol view held for the duration of one call."""
    cdef Py_buffer view
    cdef bint held

    def __cinit__(self, obj, bint writable):
        PyObject_GetBuffer(obj, &self.view, PyBUF_SIMPLE | (PyBUF_WRITABLE if writable else 0))
        self.held = True

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef size_t _itemsize(int dtype_code) except 0:
    if dtype_code < 0 or dtype_code >= GC_NUM_DTYPES:
        raise errors.InvalidUsageError(f"unknown dtype code {dtype_code}")
    return gc_dtype_size(dtype_code)


def dtype_size(int dtype_code):
    """Bytes per element of a gc_dtype code."""
    return _itemsize(dtype_code)


def op_valid(int dtype_code, int op_code):
    """True when the op is defined for the dtype (as gc_op_valid)."""
    return bool(gc_op_valid(dtype_code, op_code))


def address_of(obj):
    """Address of the first byte of a contiguous buffer (a NumPy array, bytearray, ...):
    cheaper than building NumPy's __array_interface__ dict on every call."""
    cdef Py_buffer view
    PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
    cdef uintptr_t addr = <uintptr_t>view.buf
    PyBuffer_Release(&view)
    return addr


def reduce(dst, src, int dtype_code, int op_code):
    """dst[i] = dst[i] OP src[i] over buffer-protocol objects of equal byte size.

    AVG reduces as SUM (finish with scale_avg)."""
    cdef size_t isz = _itemsize(dtype_code)
    if not gc_op_valid(dtype_code, op_code):
        raise errors.InvalidUsageError(f"op {op_code} is not defined for dtype {dtype_code}")
    cdef _Buf d = _Buf(dst, True)
    cdef _Buf s = _Buf(src, False)
    if d.view.len != s.view.len or d.view.len % isz:
        raise errors.InvalidUsageError(
            f"reduce needs equal whole-element buffers, got {d.view.len} and {s.view.len} bytes")
    with nogil:
        gc_reduce(d.view.buf, s.view.buf, <size_t>d.view.len // isz, dtype_code, op_code)


def scale_avg(buf, int dtype_code, int nranks):
    """Finish an AVG in place: divide by nranks (floats) or floor-divide (integers, as //)."""
    cdef size_t isz = _itemsize(dtype_code)
    if nranks <= 0:
        raise errors.InvalidUsageError(f"nranks must be positive, got {nranks}")
    cdef _Buf b = _Buf(buf, True)
    with nogil:
        gc_scale_avg(b.view.buf, <size_t>b.view.len // isz, dtype_code, nranks)


def shm_unlink(name):
    """Remove a shared-memory name (mappings stay valid); a missing name is not an error."""
    cdef bytes n = _shm_name(name)
    cdef int rc = gc_shmchan_unlink(n)
    _check(rc, -1, -1, f"cannot unlink shared memory {name}", 0, 0, errno)


cdef extern from "errno.h":
    int errno


cdef bytes _shm_name(name):
    n = name if name.startswith("/") else "/" + name
    return n.encode()


def examine_channel(const unsigned char[::1] header, uint64_t token, uint64_t pidns):
    """SEG_* of a channel segment file, judged from its first bytes (token 0: any token) by a
    process in pid namespace `pidns`."""
    return gc_shmchan_examine(&header[0] if header.shape[0] else NULL, <size_t>header.shape[0], token, pidns)


cdef class ShmChannel:
    """One end of a shared-memory channel (two rings) between two ranks of one host.

    The caller opens the segment file (gpucoll/transports/shm_segment.py: exclusive creation,
    owner and mode checks) and passes its descriptor, which it may close afterwards.
    ``ShmChannel.create(fd, name, capacity, token)`` lays the segment out (the lower rank of the
    pair); ``ShmChannel.attach(fd, name, creator_pid, token)`` maps it (the higher rank), or
    answers SHM_NOT_READY (not formatted yet, or made by another creator) or SHM_FOREIGN (another
    token). ``.ptr`` is the address of its gc_chan for run_schedule.
    """
    cdef gc_shmchan *ch
    cdef readonly str name

    @staticmethod
    def create(int fd, name, capacity, uint64_t token, uint64_t pidns=0, int expect_pid=0, int peer=-1):
        """Lay out the new, empty file `fd` as side 0; expect_pid: the peer's pid, 0 if unknown or
        meaningless here (another pid namespace). Until the peer attaches, a channel whose peer
        process `expect_pid` has ended is not alive: a peer that dies before attaching fails the
        collectives waiting for it at once, not at their deadline."""
        cdef int err = 0
        cdef gc_shmchan *ch = gc_shmchan_create(fd, <uint64_t>capacity, token, pidns, expect_pid, &err)
        cdef int en = errno
        if ch == NULL:
            _check(err, -1, -1, f"cannot create shared memory {name}", 0, 0, en)
        return ShmChannel._wrap(ch, name, peer)

    @staticmethod
    def attach(int fd, name, int creator_pid, uint64_t token, uint64_t pidns=0, int peer=-1):
        """Attach as side 1: the ShmChannel, or SHM_NOT_READY / SHM_FOREIGN."""
        cdef int err = 0
        cdef gc_shmchan *ch = gc_shmchan_attach(fd, creator_pid, token, pidns, &err)
        cdef int en = errno
        if ch == NULL:
            if err == GC_SHM_NOT_READY or err == GC_SHM_FOREIGN:
                return err
            _check(err, -1, -1, f"cannot attach shared memory {name}", 0, 0, en)
        return ShmChannel._wrap(ch, name, peer)

    @staticmethod
    cdef ShmChannel _wrap(gc_shmchan *ch, name, int peer):
        cdef ShmChannel self = ShmChannel.__new__(ShmChannel)
        self.ch = ch
        self.name = name
        ch.chan.peer = peer
        return self

    def __dealloc__(self):
        gc_shmchan_close(self.ch)
        self.ch = NULL

    cdef gc_shmchan *_live(self) except NULL:
        if self.ch == NULL:
            raise errors.InvalidUsageError(f"shared-memory channel {self.name} is closed")
        return self.ch

    @property
    def ptr(self):
        """Address of the gc_chan (an int) to put in run_schedule's chan_ptrs."""
        return <uintptr_t>&self._live().chan

    @property
    def capacity(self):
        """Bytes per ring (the creator's choice, rounded to pages)."""
        return self._live().cap

    @property
    def side(self):
        """0 for the creator (lower rank), 1 for the attacher."""
        return self._live().side

    @property
    def peer(self):
        return self._live().chan.peer

    @property
    def peer_attached(self):
        """True once the other side has mapped the segment (it may have closed since)."""
        return gc_shmchan_peer_state(self._live()) != 0

    @property
    def closed(self):
        return self.ch == NULL

    def alive(self):
        """False once the peer closed its end or its process is gone."""
        cdef gc_shmchan *ch = self._live()
        return bool(ch.chan.alive(&ch.chan))

    def close(self):
        """Mark this end closed (the peer sees it as gone) and unmap; idempotent."""
        gc_shmchan_close(self.ch)
        self.ch = NULL

    def unlink(self):
        """Remove the segment's name; both ends keep their mappings."""
        shm_unlink(self.name)

    def __repr__(self):
        state = "closed" if self.ch == NULL else f"side {self.ch.side}, {self.ch.cap} B/ring"
        return f"<ShmChannel {self.name} {state}>"


def run_schedule(const int64_t[:, ::1] steps, const uint64_t[::1] chan_ptrs,
                 uintptr_t send_addr, uintptr_t recv_addr, uintptr_t scratch_addr,
                 size_t itemsize, int dtype_code, int op_code, double timeout_s,
                 int64_t send_bytes=-1, int64_t recv_bytes=-1, int64_t scratch_bytes=-1, int root=-1,
                 uintptr_t revoked_addr=0):
    """Run one rank's schedule (int64 array (nsteps, 9)) without the GIL.

    chan_ptrs[r] is the gc_chan address for peer rank r (0 where there is none), from any
    transport. Addresses are raw pointers: the caller keeps the buffers alive. The *_bytes
    sizes, when given (>= 0), bound every step's offsets. timeout_s <= 0 waits forever. `root`
    (-1 for none) and the op travel in every message header and must match the peer's.
    revoked_addr: the address of an int32 that another thread sets to revoke the communicator
    (0: none); the run then raises RevokedError within a few milliseconds.
    Raises TimeoutError, LostPeerError or InvalidUsageError naming the peer rank and step.
    """
    if steps.shape[1] != GC_STEP_COLS:
        raise errors.InvalidUsageError(f"a schedule has {GC_STEP_COLS} columns, not {steps.shape[1]}")
    if itemsize != _itemsize(dtype_code) or op_code < 0 or op_code >= GC_NUM_OPS:
        raise errors.InvalidUsageError(
            f"dtype {dtype_code} / itemsize {itemsize} / op {op_code} do not fit together")
    cdef gc_exec_args a
    cdef gc_exec_err e
    a.steps = &steps[0, 0] if steps.shape[0] else NULL
    a.nsteps = steps.shape[0]
    a.chans = <gc_chan **>&chan_ptrs[0] if chan_ptrs.shape[0] else NULL
    a.nchans = chan_ptrs.shape[0]
    a.bufs[0] = <char *>send_addr
    a.bufs[1] = <char *>recv_addr
    a.bufs[2] = <char *>scratch_addr
    a.buf_bytes[0] = send_bytes
    a.buf_bytes[1] = recv_bytes
    a.buf_bytes[2] = scratch_bytes
    a.itemsize = itemsize
    a.dtype = dtype_code
    a.op = op_code
    a.root = root
    a.deadline_ns = gc_now_ns() + <int64_t>(timeout_s * 1e9) if timeout_s > 0 else 0
    a.revoked = <const int32_t *>revoked_addr
    cdef int rc
    with nogil:
        rc = gc_exec_run(&a, &e)
    if rc != GC_OK:
        what = e.what.decode() if e.what != NULL else None
        _check(rc, e.peer, e.step, what, e.got, e.want, e.errno_, timeout_s, e.mismatch)
