"""Intra-host direct collectives over one shared-memory segment (thin binding of gc_direct.h).

Every rank of a communicator on one host attaches to the same segment (see
gpucoll/transports/shm_direct.py for naming, creation and cleanup) and calls the same
collectives in the same order. Buffers are passed as plain integer addresses (the
communicator layer takes them from NumPy arrays); each method is one native call made
without the GIL::

    g = DirectGroup(mm, rank, nranks)          # mm: a writable buffer holding the segment
    g.allreduce(x.ctypes.data, y.ctypes.data, x.size, dtypes.FLOAT32, ops.SUM.code, 30.0)

In place: pass the receive address as the send address (MPI's IN_PLACE; see each method).
Failures raise gpucoll.base.errors.TimeoutError or LostPeerError whose `ranks` are the ranks that
had not arrived (LostPeerError: those found dead), or MismatchError when ranks called a
collective with different kinds, counts, dtypes, ops or roots (every call publishes its
signature in the segment and every rank compares it with those of the ranks it reads from, in
a rooted call with every rank's); after one, the group is unusable.
"""
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_ANY_CONTIGUOUS,
                             PyBUF_SIMPLE)
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from cpython.number cimport PyNumber_AsSsize_t
from libc.string cimport memcpy, memset

from gpucoll.base import dtypes, ops
from gpucoll.base.call import BY_ID, KINDS  # the kinds' numbers: GC_KIND_* of gc_direct.h
from gpucoll.base.errors import GpucollError, InvalidUsageError, native_error
from gpucoll.base.ranks import ranges


cdef extern from "gc_direct.h" nogil:
    int GC_OK, GC_ERR_TIMEOUT, GC_ERR_PEER, GC_ERR_USAGE, GC_ERR_NOMEM, GC_ERR_MISMATCH, GC_ERR_REVOKED
    int GC_SIG_NONE, GC_SIG_SINGLE_COPY
    int GC_DIRECT_READY, GC_DIRECT_NOT_READY, GC_DIRECT_FOREIGN, GC_DIRECT_CREATOR_GONE, GC_DIRECT_MISMATCH
    ctypedef int gc_dtype
    ctypedef int gc_op

    ctypedef struct gc_direct:
        int rank
        int nranks
        size_t slot_bytes
        int broken
        const int32_t *watch
        size_t oneshot_max
        size_t round_max
        size_t cma_min
        uint64_t cma_calls
        int spins
        int64_t yield_ns
        int nmissing
        int ndead
        int *missing
        int *dead
        double waited_s
        int bad_peer
        int bad_by
        int bad_prev
        uint64_t bad_sig_peer
        uint64_t bad_sig_by

    size_t gc_direct_segment_size(int nranks, size_t slot_bytes)
    int gc_direct_format(void *base, size_t size, int nranks, size_t slot_bytes, int32_t creator_pid,
                         uint64_t token)
    int gc_direct_probe(const void *base, size_t size, int nranks, uint64_t token, int32_t creator_pid)
    int gc_direct_examine(const void *hdr, size_t size, uint64_t token)
    int gc_direct_attach(gc_direct *g, void *base, size_t size, int rank, int nranks, int *nattached)
    void gc_direct_detach(gc_direct *g)
    void gc_direct_revoke(gc_direct *g)
    void gc_direct_nudge(gc_direct *g)

    int gc_direct_allreduce(gc_direct *g, const void *send, void *recv, size_t count,
                            gc_dtype dt, gc_op op, double timeout_s)
    int gc_direct_reduce(gc_direct *g, const void *send, void *recv, size_t count,
                         gc_dtype dt, gc_op op, int root, double timeout_s)
    int gc_direct_reduce_scatter_block(gc_direct *g, const void *send, void *recv, size_t count,
                                       gc_dtype dt, gc_op op, double timeout_s)
    int gc_direct_bcast(gc_direct *g, void *buf, size_t nbytes, int root, double timeout_s)
    int gc_direct_allgather(gc_direct *g, const void *send, void *recv, size_t nbytes,
                            double timeout_s)
    int gc_direct_gather(gc_direct *g, const void *send, void *recv, size_t nbytes, int root,
                         double timeout_s)
    int gc_direct_scatter(gc_direct *g, const void *send, void *recv, size_t nbytes, int root,
                          double timeout_s)
    int gc_direct_alltoall(gc_direct *g, const void *send, void *recv, size_t nbytes,
                           double timeout_s)
    int gc_direct_barrier(gc_direct *g, double timeout_s)
    int gc_direct_vexchange(gc_direct *g, int kind, int root, const uint64_t *saddr, const uint64_t *sbytes,
                            int nsend, const uint64_t *raddr, const uint64_t *rbytes, double timeout_s)
    int GC_DIRECT_DECLINED
    int gc_direct_announce(gc_direct *g, int kind, uint64_t count, int dt, int op, int root,
                           double timeout_s)


cdef extern from "gc_proc.h" nogil:
    int gc_pid_dead(int32_t pid)


cdef extern from "gc_reduce.h" nogil:
    int gc_op_valid(int dt, int op)


def describe_signature(uint64_t sig):
    """A call signature (gc_direct_sig) in words: 'allreduce with 10 x float32 SUM',
    'bcast with 40 B root 1'."""
    s = int(sig)
    kind, dt, op = s >> 60, (s >> 56) & 15, (s >> 52) & 15
    root, count = (s >> 36) & 0xffff, s & ((1 << 36) - 1)
    name = BY_ID[kind].name if kind in BY_ID else f"collective {kind}"
    if kind == KINDS["barrier"].id:
        return name
    words = [f"{count} x {dtypes.name(dt)}" if dt != GC_SIG_NONE else f"{count} B"]
    if kind == KINDS["alltoall"].id and op == GC_SIG_SINGLE_COPY:
        words.append("read from its senders (in place, or another GPUCOLL_HOST_SINGLE_COPY_MIN, stages them)")
    elif op != GC_SIG_NONE:
        words.append(ops.ALL[op].name if op < len(ops.ALL) else f"op {op}")
    if root != 0xffff:
        words.append(f"root {root}")
    return f"{name} with {' '.join(words)}"


def pid_dead(int pid):
    """True once process `pid` of this host (and pid namespace) is gone or a zombie; False for 0
    or less (unknown). The one liveness rule (cython_src/include/gc_proc.h)."""
    cdef int dead
    with nogil:
        dead = gc_pid_dead(pid)
    return bool(dead)


def segment_size(int nranks, size_t slot_bytes):
    """Bytes of a segment for `nranks` ranks with slots of `slot_bytes` (rounded up to pages)."""
    return gc_direct_segment_size(nranks, slot_bytes)


def format_segment(object buf, int nranks, size_t slot_bytes, int creator_pid, uint64_t token):
    """Lay out a zero-filled writable buffer (the creator does this once, before anyone attaches);
    `token` (from the job secret) lets attachers refuse a segment that another job made."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
    try:
        st = gc_direct_format(view.buf, <size_t>view.len, nranks, slot_bytes, creator_pid, token)
    finally:
        PyBuffer_Release(&view)
    if st != GC_OK:
        raise InvalidUsageError(f"a direct segment for {nranks} ranks needs "
                                f"{gc_direct_segment_size(nranks, slot_bytes)} bytes, got {len(buf)}")


_PROBE = {GC_DIRECT_READY: "ready", GC_DIRECT_NOT_READY: "not ready", GC_DIRECT_FOREIGN: "foreign",
          GC_DIRECT_CREATOR_GONE: "creator gone", GC_DIRECT_MISMATCH: "mismatch"}


def probe_segment(object buf, int nranks, uint64_t token, int creator_pid=0):
    """An attacher's verdict on a mapped segment: 'ready'; 'not ready' (not formatted yet, or
    made by a process other than creator_pid: retry); 'foreign' (another token: not this job's);
    'creator gone'; 'mismatch' (another version or number of ranks)."""
    cdef Py_buffer view
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        st = gc_direct_probe(view.buf, <size_t>view.len, nranks, token, creator_pid)
    finally:
        PyBuffer_Release(&view)
    return _PROBE[st]


def examine_segment(const unsigned char[::1] header, uint64_t token):
    """gpucoll._native.core.SEG_* of a direct segment file, judged from its first bytes (token 0:
    any token)."""
    return gc_direct_examine(&header[0] if header.shape[0] else NULL, <size_t>header.shape[0], token)


cdef class DirectGroup:
    """This rank's handle on a direct segment: rank `rank` of `nranks`.

    `segment` is a writable buffer holding a formatted segment (an mmap; for raw memory see
    from_address); it is kept alive, and closed by close() if it has a close method. Counts
    are elements for the reductions (dtype_code / op_code are gc_dtype / gc_op codes, see
    gpucoll.base.dtypes and gpucoll.base.ops) and `count * itemsize` bytes for data movement; a count of
    0 returns at once without synchronising. timeout_s < 0 waits without a deadline (dead
    peers are still detected).
    """
    cdef gc_direct g
    cdef Py_buffer view
    cdef bint have_view
    cdef readonly int nattached
    cdef public object segment
    cdef int32_t *watched

    def __cinit__(self):
        self.have_view = False

    def __init__(self, object segment, int rank, int nranks):
        cdef int n = 0
        PyObject_GetBuffer(segment, &self.view, PyBUF_WRITABLE)
        self.have_view = True
        self.segment = segment
        st = gc_direct_attach(&self.g, self.view.buf, <size_t>self.view.len, rank, nranks, &n)
        if st != GC_OK:
            self._release()
            raise InvalidUsageError(
                f"cannot attach rank {rank} of {nranks} to this direct segment: it is not "
                f"formatted for {nranks} ranks, or too small" if st == GC_ERR_USAGE else
                "out of memory attaching a direct segment")
        self.nattached = n

    @staticmethod
    def from_address(size_t address, size_t size, int rank, int nranks):
        """Attach to a segment mapped at `address` (`size` bytes) by someone else, who keeps
        it mapped for as long as the group is used."""
        import ctypes
        return DirectGroup((ctypes.c_char * size).from_address(address), rank, nranks)

    def __repr__(self):
        if not self.have_view:
            return "<DirectGroup closed>"
        return f"<DirectGroup rank {self.g.rank} of {self.g.nranks}, slots of {self.g.slot_bytes} B>"

    cdef _release(self):
        if self.have_view:
            PyBuffer_Release(&self.view)
            self.have_view = False

    def watch(self, pids):
        """pids[r]: rank r's process id as the bootstrap gave it, for ranks of this host and
        pid namespace (0 elsewhere). Until rank r attaches, the waits take it for gone once
        that process has ended: a rank that dies before its first collective is then named at
        once instead of waited for until the deadline."""
        cdef int n = self.g.nranks
        if len(pids) != n:
            raise InvalidUsageError(f"watch() needs {n} pids, got {len(pids)}")
        cdef int32_t *w = <int32_t *>malloc(n * sizeof(int32_t))
        if w == NULL:
            raise MemoryError()
        for i in range(n):
            w[i] = pids[i] or 0
        self.g.watch = w
        free(self.watched)
        self.watched = w

    def close(self):
        """Detach; closes the segment object too when it has a close method. Idempotent."""
        if self.have_view:
            gc_direct_detach(&self.g)
            self._release()
        free(self.watched)
        self.watched = NULL
        seg, self.segment = self.segment, None
        if seg is not None and hasattr(seg, "close"):
            seg.close()

    def revoke(self):
        """Revoke the communicator on this host: every rank waiting in one of its collectives here
        (or entering one) fails with RevokedError. No-op once closed."""
        if self.have_view:
            gc_direct_revoke(&self.g)

    def nudge(self):
        """A process of this host ended: every rank waiting in a collective here checks the
        liveness of the ranks it waits for now (any thread; no-op once closed)."""
        if self.have_view:
            gc_direct_nudge(&self.g)

    def __dealloc__(self):
        if self.have_view:
            gc_direct_detach(&self.g)
            PyBuffer_Release(&self.view)
        free(self.watched)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def rank(self):
        return self.g.rank

    @property
    def nranks(self):
        return self.g.nranks

    @property
    def slot_bytes(self):
        return self.g.slot_bytes

    @property
    def oneshot_max(self):
        """Largest allreduce/reduce (bytes) done one-shot; larger ones are two-shot."""
        return self.g.oneshot_max

    @oneshot_max.setter
    def oneshot_max(self, size_t value):
        self.g.oneshot_max = value

    @property
    def round_max(self):
        """Bytes of one two-shot round (at most a slot)."""
        return self.g.round_max

    @round_max.setter
    def round_max(self, size_t value):
        self.g.round_max = value

    @property
    def single_copy_min(self):
        """All-to-all send buffers of at least this many bytes (all blocks) are read straight
        from each peer (process_vm_readv) when every rank can; 0: never."""
        return self.g.cma_min

    @single_copy_min.setter
    def single_copy_min(self, size_t value):
        self.g.cma_min = value

    @property
    def single_copy_calls(self):
        """Calls of this rank that moved their data by single copy."""
        return self.g.cma_calls

    def set_wait(self, int spins, double yield_s):
        """How a wait behaves: `spins` pause-spins, then `yield_s` seconds of sched_yield, then
        blocking until the awaited rank posts."""
        self.g.spins = spins
        self.g.yield_ns = <int64_t>(yield_s * 1e9)

    cdef int _raise(self, int st) except -1:
        """A failed native status -> errors.native_error (the one error path), told the ranks
        this rank waited for (a lost peer: those found dead) or the two mismatched calls."""
        missing = [self.g.missing[i] for i in range(self.g.nmissing)]
        dead = [self.g.dead[i] for i in range(self.g.ndead)]
        what = f"rank {self.g.rank} of a direct shared-memory group of {self.g.nranks}"
        detail = ""
        if st == GC_ERR_PEER:
            if dead and sorted(dead) != sorted(missing):
                detail = f"it waited for rank(s) {ranges(missing)}"
            missing = dead or missing
        elif st == GC_ERR_TIMEOUT and not missing:
            # The report reads the flags again after the deadline: a late rank may just have come.
            detail = "the ranks it waited for came just after the deadline"
        elif st == GC_ERR_MISMATCH:
            theirs, ours = describe_signature(self.g.bad_sig_peer), describe_signature(self.g.bad_sig_by)
            if self.g.bad_by == self.g.rank:
                which = " (the previous collective on this communicator)" if self.g.bad_prev else ""
                what = f"rank {self.g.bad_peer} called {theirs}, this rank with {ours}{which}"
            else:
                what = (f"rank {self.g.bad_by} found that rank {self.g.bad_peer} called {theirs} "
                        f"where rank {self.g.bad_by} called {ours}")
            missing = [self.g.bad_peer]
        elif st == GC_ERR_USAGE:
            if self.g.broken or not self.have_view:
                raise GpucollError("this direct group is unusable: it was closed, or an earlier "
                                   "collective on it failed")
            detail = "invalid arguments for a direct collective (dtype, op or root)"
        raise native_error(st, what, missing, detail, self.g.waited_s)

    def allreduce(self, size_t send_addr, size_t recv_addr, size_t count, int dtype_code,
                  int op_code, double timeout_s=-1.0):
        """recv = reduction of every rank's send (count elements); send == recv is in place."""
        with nogil:
            st = gc_direct_allreduce(&self.g, <const void *>send_addr, <void *>recv_addr, count,
                                     dtype_code, op_code, timeout_s)
        if st: self._raise(st)

    def reduce(self, size_t send_addr, size_t recv_addr, size_t count, int dtype_code,
               int op_code, int root, double timeout_s=-1.0):
        """Like allreduce, but only `root` receives (recv_addr is ignored elsewhere)."""
        with nogil:
            st = gc_direct_reduce(&self.g, <const void *>send_addr, <void *>recv_addr, count,
                                  dtype_code, op_code, root, timeout_s)
        if st: self._raise(st)

    def reduce_scatter_block(self, size_t send_addr, size_t recv_addr, size_t count_per_rank,
                             int dtype_code, int op_code, double timeout_s=-1.0):
        """send holds nranks blocks of count_per_rank; rank i gets block i of the reduction.
        send == recv is in place (input: the whole buffer; result: its first block)."""
        with nogil:
            st = gc_direct_reduce_scatter_block(&self.g, <const void *>send_addr,
                                                <void *>recv_addr, count_per_rank, dtype_code,
                                                op_code, timeout_s)
        if st: self._raise(st)

    def bcast(self, size_t addr, size_t count, size_t itemsize, int root, double timeout_s=-1.0):
        """Copy root's count elements of itemsize bytes into every rank's buffer."""
        with nogil:
            st = gc_direct_bcast(&self.g, <void *>addr, count * itemsize, root, timeout_s)
        if st: self._raise(st)

    def allgather(self, size_t send_addr, size_t recv_addr, size_t count_per_rank,
                  size_t itemsize, double timeout_s=-1.0):
        """recv (nranks blocks) gets every rank's send; send == recv means this rank's block is
        already at recv + rank * block."""
        with nogil:
            st = gc_direct_allgather(&self.g, <const void *>send_addr, <void *>recv_addr,
                                     count_per_rank * itemsize, timeout_s)
        if st: self._raise(st)

    def gather(self, size_t send_addr, size_t recv_addr, size_t count_per_rank, size_t itemsize,
               int root, double timeout_s=-1.0):
        """root's recv (nranks blocks) gets every rank's send; send == recv at the root means
        its block is already in place."""
        with nogil:
            st = gc_direct_gather(&self.g, <const void *>send_addr, <void *>recv_addr,
                                  count_per_rank * itemsize, root, timeout_s)
        if st: self._raise(st)

    def scatter(self, size_t send_addr, size_t recv_addr, size_t count_per_rank, size_t itemsize,
                int root, double timeout_s=-1.0):
        """Rank i's recv gets block i of root's send (nranks blocks); send == recv at the root
        leaves its block in place."""
        with nogil:
            st = gc_direct_scatter(&self.g, <const void *>send_addr, <void *>recv_addr,
                                   count_per_rank * itemsize, root, timeout_s)
        if st: self._raise(st)

    def alltoall(self, size_t send_addr, size_t recv_addr, size_t count_per_rank,
                 size_t itemsize, double timeout_s=-1.0):
        """Block j of send goes to rank j, landing at block i (the sender's rank) of its recv;
        send == recv is in place."""
        with nogil:
            st = gc_direct_alltoall(&self.g, <const void *>send_addr, <void *>recv_addr,
                                    count_per_rank * itemsize, timeout_s)
        if st: self._raise(st)

    def allgatherv(self, const uint64_t[::1] send_at, const uint64_t[::1] send_bytes,
                   const uint64_t[::1] recv_at, const uint64_t[::1] recv_bytes, double timeout_s=-1.0):
        """Rank j's one block (send_at[0], send_bytes[0] bytes) lands at recv_at[j] of every rank,
        which expects recv_bytes[j] of it (its own block copied when recv_bytes[rank] is not 0).
        Addresses are absolute. False: some rank's block does not fit the slots, and nothing
        moved between ranks (every rank returns False, the caller moves the data another way)."""
        return self._vexchange(_KIND_ALLGATHERV, -1, send_at, send_bytes, recv_at, recv_bytes, timeout_s)

    def alltoallv(self, const uint64_t[::1] send_at, const uint64_t[::1] send_bytes,
                  const uint64_t[::1] recv_at, const uint64_t[::1] recv_bytes, double timeout_s=-1.0):
        """send_bytes[j] bytes at send_at[j] go to rank j, landing at its recv_at[i] (i: this
        rank), where it expects recv_bytes[i]. False as allgatherv."""
        return self._vexchange(_KIND_ALLTOALLV, -1, send_at, send_bytes, recv_at, recv_bytes, timeout_s)

    def gatherv(self, const uint64_t[::1] send_at, const uint64_t[::1] send_bytes,
                const uint64_t[::1] recv_at, const uint64_t[::1] recv_bytes, int root, double timeout_s=-1.0):
        """Each rank's one block goes to root, landing at its recv_at[j] (recv_bytes[j] expected;
        all 0 off the root). False as allgatherv."""
        return self._vexchange(_KIND_GATHERV, root, send_at, send_bytes, recv_at, recv_bytes, timeout_s)

    def scatterv(self, const uint64_t[::1] send_at, const uint64_t[::1] send_bytes,
                 const uint64_t[::1] recv_at, const uint64_t[::1] recv_bytes, int root, double timeout_s=-1.0):
        """root's block j (send_at[j], send_bytes[j]; no blocks off the root) lands at recv_at[root]
        of rank j, which expects recv_bytes[root]. False as allgatherv."""
        return self._vexchange(_KIND_SCATTERV, root, send_at, send_bytes, recv_at, recv_bytes, timeout_s)

    cdef bint _vexchange(self, int kind, int root, const uint64_t[::1] send_at, const uint64_t[::1] send_bytes,
                         const uint64_t[::1] recv_at, const uint64_t[::1] recv_bytes, double timeout_s) except -1:
        cdef int n = self.g.nranks, nsend = send_at.shape[0], st
        if (send_bytes.shape[0] != nsend or recv_at.shape[0] != n or recv_bytes.shape[0] != n
                or nsend not in (0, 1, n)):
            raise InvalidUsageError(f"a v-collective of {n} ranks takes 0, 1 or {n} send blocks and {n} receive "
                                    f"blocks, not {nsend} and {recv_at.shape[0]}")
        return _vcall(&self.g, kind, root, &send_at[0] if nsend else NULL, &send_bytes[0] if nsend else NULL,
                      nsend, &recv_at[0], &recv_bytes[0], timeout_s, self)

    def barrier(self, double timeout_s=-1.0):
        """Return once every rank has entered the barrier."""
        with nogil:
            st = gc_direct_barrier(&self.g, timeout_s)
        if st: self._raise(st)

    def announce(self, int kind, uint64_t count, int dtype_code, int op_code, int root,
                 double timeout_s=-1.0):
        """A barrier carrying the signature of a call run elsewhere (kind: a GC_KIND_* number,
        as gpucoll.base.call.KINDS[kind].id; count; dtype and op codes, or -1 for none; root, or -1):
        raises MismatchError on every rank when the ranks' signatures differ."""
        dt = GC_SIG_NONE if dtype_code < 0 else dtype_code
        op = GC_SIG_NONE if op_code < 0 else op_code
        with nogil:
            st = gc_direct_announce(&self.g, kind, count, dt, op, root, timeout_s)
        if st: self._raise(st)


cdef size_t ANY_SIZE = <size_t>-1  # _send_view: a send buffer of any size


cdef object _bare(object arr, object ndarray, object codes, Py_buffer *view, bint writable):
    """A bare contiguous ndarray of a dtype gpucoll moves (the one-block side of a vector
    collective): its dtype, its buffer taken into *view; None, holding nothing, otherwise."""
    if type(arr) is not ndarray or codes.get(arr.dtype) is None:
        return None
    try:
        PyObject_GetBuffer(arr, view, PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0))
    except (BufferError, ValueError):
        return None
    return arr.dtype


cdef inline bint _writable(object arr):
    return bool(arr.flags.writeable)


cdef int _KIND_ALLGATHERV = KINDS["allgatherv"].id, _KIND_ALLTOALLV = KINDS["alltoallv"].id
cdef int _KIND_GATHERV = KINDS["gatherv"].id, _KIND_SCATTERV = KINDS["scatterv"].id


cdef int _vcall(gc_direct *g, int kind, int root, const uint64_t *sat, const uint64_t *sby, int nsend,
                const uint64_t *rat, const uint64_t *rby, double timeout_s, DirectGroup group) except -1:
    """gc_direct_vexchange without the GIL: 1 moved, 0 declined (too large for the slots); raises
    the group's error otherwise."""
    cdef int st
    with nogil:
        st = gc_direct_vexchange(g, kind, root, sat, sby, nsend, rat, rby, timeout_s)
    if st == GC_DIRECT_DECLINED:
        return 0
    if st:
        group._raise(st)
    return 1


cdef object _vspec(object spec, object ndarray, Py_buffer *view, uint64_t *at, uint64_t *nbytes, int n,
                   bint writable):
    """HostFast.vector's reading of [array, counts, displs, TYPE] or [array, (counts, displs),
    TYPE]: the array's dtype, with its buffer taken into *view and each of the n blocks' address
    and bytes in at[], nbytes[] (every block inside the array); None, holding nothing, for
    anything else."""
    cdef Py_ssize_t k, count, displ, total, isz
    cdef uintptr_t base
    t = type(spec)
    if t is not list and t is not tuple:
        return None
    if len(spec) == 4:
        arr, counts, displs, datatype = spec
    elif len(spec) == 3:
        arr, pair, datatype = spec
        if (type(pair) is not tuple and type(pair) is not list) or len(pair) != 2:
            return None
        counts, displs = pair
    else:
        return None
    if type(arr) is not ndarray:
        return None
    dt = arr.dtype
    info = getattr(datatype, "_t", None)
    if info is None or info.code is None or info.contents is not None or (info.np is not dt and info.np != dt):
        return None
    if (type(counts) is not list and type(counts) is not tuple) or (type(displs) is not list and
                                                                    type(displs) is not tuple):
        return None
    if len(counts) != n or len(displs) != n:
        return None
    try:
        PyObject_GetBuffer(arr, view, PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0))
    except (BufferError, ValueError):
        return None
    base, isz = <uintptr_t>view.buf, view.itemsize
    total = view.len // isz if isz > 0 else 0
    try:
        for k in range(n):
            count, displ = PyNumber_AsSsize_t(counts[k], OverflowError), PyNumber_AsSsize_t(displs[k], OverflowError)
            if count < 0 or displ < 0 or displ > total or count > total - displ:
                PyBuffer_Release(view)
                return None
            at[k], nbytes[k] = <uint64_t>(base + <uintptr_t>(displ * isz)), <uint64_t>(count * isz)
    except (TypeError, OverflowError):
        PyBuffer_Release(view)
        return None
    return dt


cdef inline int _send_view(object sendbuf, object ndarray, object dt, Py_buffer *sv, size_t want,
                           uintptr_t raddr, size_t rbytes, bint same_ok) except -1:
    """HostFast's check of a send buffer: 1, with its view taken into *sv, when `sendbuf` is an
    exact ndarray of dtype `dt`, contiguous, of `want` bytes (ANY_SIZE: any), that does not overlap
    the receive buffer [raddr, raddr + rbytes) (same_ok: but for starting at raddr itself, which
    reads as in place); else 0, holding nothing, and the general path runs the call and says
    what was wrong."""
    cdef uintptr_t saddr
    cdef size_t n
    if type(sendbuf) is not ndarray or sendbuf.dtype is not dt:
        return 0
    try:
        PyObject_GetBuffer(sendbuf, sv, PyBUF_ANY_CONTIGUOUS)
    except (BufferError, ValueError):
        return 0
    saddr, n = <uintptr_t>sv.buf, <size_t>sv.len
    if ((want != ANY_SIZE and n != want)
            or (not (same_ok and saddr == raddr) and saddr < raddr + rbytes and raddr < saddr + n)):
        PyBuffer_Release(sv)
        return 0
    return 1


cdef class CallGate:
    """Who runs a communicator's next host call, and its number: the state an ordered queue
    (gpucoll/engines/queue.py) shares with every inline path, HostFast's included.

    `busy`: a call is running (inline in a caller's thread, or on the queue's worker);
    `queued`: calls waiting for the worker; `seq`: the next call's sequence number. Every
    method runs with the GIL held and calls no Python code between its test and its update,
    so each is atomic with respect to the other Python threads: the caller's claim (enter)
    and the worker's (claim_queued) need no lock, and the native fast paths claim, number and
    release a call with no Python call at all."""

    cdef public bint busy, closed
    cdef readonly Py_ssize_t queued
    cdef public unsigned long long seq
    cdef object wake  # called by leave() when the worker has something to do

    def __init__(self, wake):
        self.wake = wake

    cpdef bint enter(self):
        """Claim the next call for the caller's thread: True when nothing is queued or running."""
        if self.queued or self.busy:
            return False
        self.busy = True
        return True

    cpdef leave(self):
        """End the call enter() claimed; wake the worker if it has something to do."""
        self.busy = False
        if self.queued or self.closed:
            self.wake()

    def add_queued(self):
        self.queued += 1

    def claim_queued(self):
        """The worker's claim of the oldest queued call: True when one is queued and none runs."""
        if self.busy or not self.queued:
            return False
        self.queued -= 1
        self.busy = True
        return True

    def drop_queued(self):
        """Forget every queued call (a forked child, whose worker does not exist)."""
        self.queued = 0

    cpdef unsigned long long next_seq(self):
        """The next sequence number: the one place that numbers a communicator's calls."""
        cdef unsigned long long seq = self.seq
        self.seq = seq + 1
        return seq


cdef class HostFast:
    """The packed host fast paths of a communicator's Allreduce, Bcast, Reduce, Allgather,
    Alltoall, Reduce_scatter_block (NumPy arrays) and Barrier over a direct group (installed by
    gpucoll/dispatch/dispatcher.py once a call ran on the direct engine; Communicator tries
    them before it builds a Call).

    Each method is called with the user's arguments before anything else; it does the checks
    of the general path in C (exact ndarray types, a dtype gpucoll moves, the same dtype and
    size, contiguous in C or Fortran order (the bytes in memory order, as MPI reads them),
    writable where the result lands, no overlap, an op the dtype supports, a root in range, a
    non-empty call whose algorithm is "direct"), claims the communicator's ordered queue
    (the queue's CallGate: only when nothing is queued), takes the next sequence number from
    it and makes the native call, all without a Python call. It returns False, having done nothing,
    whenever a check fails, so that the general path runs the call and raises its usual
    errors. A failed native call raises through hooks.fast_failed() (gpucoll/dispatch/diagnosis.py),
    as the general path's failures do.

    hooks: the dispatcher's public face: queue (.gate), choices (the cost table's cached
    answers, (kind, table bytes) -> algorithm), choose(call), diagnosis (.broken), timeout,
    fast_failed(kind, count, code, op, root, seq, exc).
    """

    cdef DirectGroup group
    cdef CallGate gate
    cdef object hooks, choose, diagnosis, choices
    cdef object in_place, ndarray, op_type, codes, call_type
    cdef double timeout
    cdef int rank, size
    cdef readonly unsigned long long calls  # calls these paths ran (Communicator.stats()["host_fast"])

    def __init__(self, DirectGroup group, hooks, in_place, ndarray, op_type, codes):
        from gpucoll.base.call import Call

        self.group, self.hooks = group, hooks
        self.gate = hooks.queue.gate
        self.choose, self.diagnosis = hooks.choose, hooks.diagnosis
        self.choices = hooks.choices
        self.in_place, self.ndarray, self.op_type, self.codes = in_place, ndarray, op_type, codes
        self.call_type = Call
        self.timeout = hooks.timeout
        self.rank, self.size = group.g.rank, group.g.nranks

    cdef bint _direct(self, kind, size_t table_bytes, size_t count, int code, op, int root) except -1:
        """The cost table picks the direct engine for this call (and the communicator works)."""
        if self.diagnosis.broken is not None:
            return False
        algo = self.choices.get((kind, table_bytes))
        if algo is None:
            algo = self.choose(self.call_type(kind, None, None, count, code, op, root))
        return algo == "direct"

    cdef int _failed(self, int st, kind, size_t count, int code, op, int root, seq) except -1:
        try:
            self.group._raise(st)
        except GpucollError as exc:
            self.hooks.fast_failed(kind, count, code, op, root, seq, exc)
        return 0

    cdef bint _reduce_view(self, recvbuf, op, Py_buffer *rv, int *code, int *op_code) except -1:
        """The receive buffer of a reduction taken into *rv, with its dtype's and op's codes: True
        when recvbuf is an exact ndarray of a dtype gpucoll reduces, op an Op the dtype supports,
        the buffer writable and contiguous; else False, holding nothing (the general path says
        what is wrong)."""
        if type(recvbuf) is not self.ndarray or type(op) is not self.op_type:
            return False
        c = self.codes.get(recvbuf.dtype)
        if c is None:
            return False
        code[0], op_code[0] = c, op.code
        if not gc_op_valid(code[0], op_code[0]):
            return False
        try:
            PyObject_GetBuffer(recvbuf, rv, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        except (BufferError, ValueError):  # read-only, not contiguous
            return False
        return True

    def allreduce(self, sendbuf, recvbuf, op):
        cdef Py_buffer rv, sv
        cdef bint have_send = False
        cdef size_t count, nbytes
        cdef uintptr_t raddr, saddr
        cdef int st, code, op_code
        if not self._reduce_view(recvbuf, op, &rv, &code, &op_code):
            return False
        dt = recvbuf.dtype
        try:
            nbytes = <size_t>rv.len
            raddr = <uintptr_t>rv.buf
            saddr = raddr
            if sendbuf is not self.in_place:
                have_send = _send_view(sendbuf, self.ndarray, dt, &sv, nbytes, raddr, nbytes, True)
                if not have_send:
                    return False
                saddr = <uintptr_t>sv.buf
            if nbytes == 0:
                return False
            count = nbytes // <size_t>rv.itemsize
            if not self._direct("allreduce", nbytes, count, code, op, 0) or not self.gate.enter():
                return False
            seq = self.gate.next_seq()
            self.calls += 1
            try:
                with nogil:
                    st = gc_direct_allreduce(&self.group.g, <const void *>saddr, <void *>raddr, count, code,
                                             op_code, self.timeout)
            finally:
                self.gate.leave()
            if st:
                self._failed(st, "allreduce", count, code, op, 0, seq)
            return True
        finally:
            PyBuffer_Release(&rv)
            if have_send:
                PyBuffer_Release(&sv)

    def reduce_scatter_block(self, sendbuf, recvbuf, op):
        """Rank i's recvbuf = op over every rank's block i of sendbuf (IN_PLACE: the input is the
        whole recvbuf, the result its first block)."""
        cdef Py_buffer rv, sv
        cdef bint have_send = False
        cdef size_t block, total, count, isz
        cdef uintptr_t raddr, saddr
        cdef int st, code, op_code
        if not self._reduce_view(recvbuf, op, &rv, &code, &op_code):
            return False
        dt = recvbuf.dtype
        try:
            isz = <size_t>rv.itemsize
            raddr = <uintptr_t>rv.buf
            saddr = raddr
            if sendbuf is self.in_place:
                total = <size_t>rv.len
                if (total // isz) % <size_t>self.size:
                    return False
                block = total // <size_t>self.size
            else:
                block = <size_t>rv.len
                total = block * <size_t>self.size
                have_send = _send_view(sendbuf, self.ndarray, dt, &sv, total, raddr, block, True)
                if not have_send:
                    return False
                saddr = <uintptr_t>sv.buf
            if block == 0:
                return False
            count = block // isz
            if not self._direct("reduce_scatter", total, count, code, op, 0) or not self.gate.enter():
                return False
            seq = self.gate.next_seq()
            self.calls += 1
            try:
                with nogil:
                    st = gc_direct_reduce_scatter_block(&self.group.g, <const void *>saddr, <void *>raddr, count,
                                                        code, op_code, self.timeout)
            finally:
                self.gate.leave()
            if st:
                self._failed(st, "reduce_scatter", count, code, op, 0, seq)
            return True
        finally:
            PyBuffer_Release(&rv)
            if have_send:
                PyBuffer_Release(&sv)

    def barrier(self):
        """Barrier: True once every rank entered it, False to decline (the general path runs it)."""
        cdef int st
        if not self._direct("barrier", 0, 0, 0, None, 0) or not self.gate.enter():
            return False
        seq = self.gate.next_seq()
        self.calls += 1
        try:
            with nogil:
                st = gc_direct_barrier(&self.group.g, self.timeout)
        finally:
            self.gate.leave()
        if st:
            self._failed(st, "barrier", 0, 0, None, 0, seq)
        return True

    def bcast(self, buf, root):
        cdef Py_buffer bv
        cdef size_t nbytes, count
        cdef int st, code, r
        if type(buf) is not self.ndarray or type(root) is not int:
            return False
        if root < 0 or root >= self.size:
            return False
        r = root
        c = self.codes.get(buf.dtype)
        if c is None:
            return False
        code = c
        try:
            PyObject_GetBuffer(buf, &bv, PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if r != self.rank else 0))
        except (BufferError, ValueError):
            return False
        try:
            nbytes = <size_t>bv.len
            if nbytes == 0:
                return False
            count = nbytes // <size_t>bv.itemsize
            if not self._direct("bcast", nbytes, count, code, None, r) or not self.gate.enter():
                return False
            seq = self.gate.next_seq()
            self.calls += 1
            try:
                with nogil:
                    st = gc_direct_bcast(&self.group.g, bv.buf, nbytes, r, self.timeout)
            finally:
                self.gate.leave()
            if st:
                self._failed(st, "bcast", count, code, None, r, seq)
            return True
        finally:
            PyBuffer_Release(&bv)

    def reduce(self, sendbuf, recvbuf, op, root):
        cdef Py_buffer rv, sv
        cdef bint have_recv = False, have_send = False
        cdef size_t count, nbytes
        cdef uintptr_t raddr = 0, saddr = 0
        cdef int st, code, op_code, r
        if type(op) is not self.op_type or type(root) is not int:
            return False
        if root < 0 or root >= self.size:
            return False
        r = root
        try:
            if r == self.rank:
                if type(recvbuf) is not self.ndarray:
                    return False
                dt = recvbuf.dtype
                try:
                    PyObject_GetBuffer(recvbuf, &rv, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
                except (BufferError, ValueError):
                    return False
                have_recv = True
                raddr = saddr = <uintptr_t>rv.buf
                nbytes = <size_t>rv.len
            else:  # recvbuf is ignored off the root; IN_PLACE there is an error the general path raises
                if sendbuf is self.in_place:
                    return False
                dt = sendbuf.dtype if type(sendbuf) is self.ndarray else None
            if sendbuf is not self.in_place:
                # off the root, any size: there is no receive buffer to match or overlap
                have_send = _send_view(sendbuf, self.ndarray, dt, &sv, nbytes if have_recv else ANY_SIZE,
                                       raddr, nbytes if have_recv else 0, True)
                if not have_send:
                    return False
                saddr = <uintptr_t>sv.buf
                nbytes = <size_t>sv.len
            c = self.codes.get(dt)
            if c is None:
                return False
            code, op_code = c, op.code
            if not gc_op_valid(code, op_code) or nbytes == 0:
                return False
            count = nbytes // <size_t>dt.itemsize
            if not self._direct("reduce", nbytes, count, code, op, r) or not self.gate.enter():
                return False
            seq = self.gate.next_seq()
            self.calls += 1
            try:
                with nogil:
                    st = gc_direct_reduce(&self.group.g, <const void *>saddr, <void *>raddr, count, code, op_code,
                                          r, self.timeout)
            finally:
                self.gate.leave()
            if st:
                self._failed(st, "reduce", count, code, op, r, seq)
            return True
        finally:
            if have_recv:
                PyBuffer_Release(&rv)
            if have_send:
                PyBuffer_Release(&sv)

    def allgather(self, sendbuf, recvbuf):
        return self._blocks(sendbuf, recvbuf, False)

    def alltoall(self, sendbuf, recvbuf):
        return self._blocks(sendbuf, recvbuf, True)

    def vector(self, int kind, sendbuf, recvbuf, root=-1):
        """Allgatherv, Alltoallv, Gatherv or Scatterv (kind: its number in gpucoll.base.call.KINDS)
        of NumPy arrays in the vector specs mpi4py programs write: [array, counts, displs, TYPE] or
        [array, (counts, displs), TYPE], TYPE the array's own datatype (anything with a `_t`
        whose `np` is the array's dtype, `code` set and `contents` None: gpucoll.MPI's predefined
        datatypes); the one-block sides bare arrays of the same dtype (of any basic dtype where
        no spec says which), IN_PLACE where MPI allows it. 0: declined, having done nothing (the
        general path runs the call, over the same direct group); 1: done; 2: some rank's block
        does not fit the group's slots, nothing moved between ranks, every rank returns 2 (the
        caller moves the data by point to point)."""
        cdef Py_buffer rv, sv
        cdef bint have_recv = False, have_send = False, at_root
        cdef int n = self.size, me = self.rank, nsend, r = -1, st
        cdef uint64_t *tab
        if kind == _KIND_GATHERV or kind == _KIND_SCATTERV:
            if type(root) is not int or not 0 <= root < n:
                return 0
            r = root
        elif kind != _KIND_ALLGATHERV and kind != _KIND_ALLTOALLV:
            return 0
        at_root = me == r
        tab = <uint64_t *>malloc(4 * <size_t>n * sizeof(uint64_t))
        if tab == NULL:
            raise MemoryError("a vector collective: no memory for its tables")
        cdef uint64_t *rat = tab
        cdef uint64_t *rby = tab + n
        cdef uint64_t *sat = tab + 2 * n
        cdef uint64_t *sby = tab + 3 * n
        memset(tab, 0, 4 * <size_t>n * sizeof(uint64_t))
        try:
            # the receiving side: a spec (every kind but scatterv off the root... and gatherv off it)
            if kind == _KIND_SCATTERV and not at_root:
                dt = _bare(recvbuf, self.ndarray, self.codes, &rv, True)
                if dt is None:
                    return 0
                have_recv = True
                rat[r], rby[r] = <uint64_t><uintptr_t>rv.buf, <uint64_t>rv.len
            elif kind == _KIND_GATHERV and not at_root:
                dt = None
            else:
                specbuf = sendbuf if kind == _KIND_SCATTERV else recvbuf
                dt = _vspec(specbuf, self.ndarray, &rv, rat if kind != _KIND_SCATTERV else sat,
                            rby if kind != _KIND_SCATTERV else sby, n, kind != _KIND_SCATTERV)
                if dt is None:
                    return 0
                have_recv = True  # (scatterv's root: the send spec's view, released the same way)
            # the other side
            if kind == _KIND_ALLTOALLV:
                nsend = n
                if sendbuf is self.in_place:
                    memcpy(sat, rat, n * sizeof(uint64_t))
                    memcpy(sby, rby, n * sizeof(uint64_t))
                else:
                    sdt = _vspec(sendbuf, self.ndarray, &sv, sat, sby, n, False)
                    if sdt is None:
                        return 0
                    have_send = True  # released below, whatever follows
                    if sdt is not dt and sdt != dt:
                        return 0
                if sby[me] != rby[me]:
                    return 0  # the general path says what is wrong
            elif kind == _KIND_SCATTERV:
                if at_root:
                    nsend = n
                    if recvbuf is self.in_place:
                        pass  # the root's block stays where it is
                    else:
                        if not _send_view(recvbuf, self.ndarray, dt, &sv, ANY_SIZE, 0, 0, False):
                            return 0
                        have_send = True  # (the root's receive buffer)
                        if <uint64_t>sv.len != sby[me] or not _writable(recvbuf):
                            return 0
                        rat[me], rby[me] = <uint64_t><uintptr_t>sv.buf, sby[me]
                else:
                    nsend = 0
            else:  # allgatherv, gatherv: one block
                nsend = 1
                if sendbuf is self.in_place:
                    if dt is None:
                        return 0  # IN_PLACE off the root of a gatherv: the general path says so
                    sat[0], sby[0] = rat[me], rby[me]
                    if kind == _KIND_GATHERV:
                        rby[me] = 0  # the root's block is in place already
                else:
                    if dt is None:
                        dt = _bare(sendbuf, self.ndarray, self.codes, &sv, False)
                        if dt is None:
                            return 0
                    elif not _send_view(sendbuf, self.ndarray, dt, &sv, ANY_SIZE, 0, 0, False):
                        return 0
                    have_send = True
                    sat[0], sby[0] = <uint64_t><uintptr_t>sv.buf, <uint64_t>sv.len
                    if (kind == _KIND_ALLGATHERV or at_root) and sby[0] != rby[me]:
                        return 0
                    if kind == _KIND_GATHERV and not at_root:
                        rby[me] = 0
            if self.diagnosis.broken is not None or not self.gate.enter():
                return 0
            seq = self.gate.next_seq()
            self.calls += 1
            try:
                with nogil:
                    st = gc_direct_vexchange(&self.group.g, kind, r, sat, sby, nsend, rat, rby, self.timeout)
            finally:
                self.gate.leave()
            if st == GC_DIRECT_DECLINED:
                return 2
            if st:
                self._failed(st, BY_ID[kind].name, 0, 0, None, max(r, 0), seq)
            return 1
        finally:
            free(tab)
            if have_recv:
                PyBuffer_Release(&rv)
            if have_send:
                PyBuffer_Release(&sv)

    cdef bint _blocks(self, sendbuf, recvbuf, bint all_to_all) except -1:
        """Allgather (every rank contributes one block: recvbuf is size blocks) or Alltoall
        (block j of every rank's sendbuf goes to rank j: both buffers are size blocks). IN_PLACE:
        this rank's block of recvbuf (allgather), the whole of recvbuf (alltoall)."""
        cdef Py_buffer rv, sv
        cdef bint have_send = False
        cdef size_t total, block, count, isz
        cdef uintptr_t raddr, saddr
        cdef int st, code
        if type(recvbuf) is not self.ndarray:
            return False
        dt = recvbuf.dtype
        c = self.codes.get(dt)
        if c is None:
            return False
        code = c
        kind = "alltoall" if all_to_all else "allgather"
        try:
            PyObject_GetBuffer(recvbuf, &rv, PyBUF_WRITABLE | PyBUF_ANY_CONTIGUOUS)
        except (BufferError, ValueError):
            return False
        try:
            total = <size_t>rv.len
            isz = <size_t>rv.itemsize
            if total == 0 or (total // isz) % <size_t>self.size:
                return False
            block = total // <size_t>self.size
            raddr = <uintptr_t>rv.buf
            saddr = raddr if all_to_all else raddr + <size_t>self.rank * block
            if sendbuf is not self.in_place:
                have_send = _send_view(sendbuf, self.ndarray, dt, &sv, total if all_to_all else block, raddr,
                                       total, False)
                if not have_send:
                    return False
                saddr = <uintptr_t>sv.buf
            count = block // isz
            if not self._direct(kind, total, count, code, None, 0) or not self.gate.enter():
                return False
            seq = self.gate.next_seq()
            self.calls += 1
            try:
                with nogil:
                    if all_to_all:
                        st = gc_direct_alltoall(&self.group.g, <const void *>saddr, <void *>raddr, block,
                                                self.timeout)
                    else:
                        st = gc_direct_allgather(&self.group.g, <const void *>saddr, <void *>raddr, block,
                                                 self.timeout)
            finally:
                self.gate.leave()
            if st:
                self._failed(st, kind, count, code, None, 0, seq)
            return True
        finally:
            PyBuffer_Release(&rv)
            if have_send:
                PyBuffer_Release(&sv)
