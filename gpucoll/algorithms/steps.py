"""Schedules as data: the step layout, the Schedule type, its checks and its builder.

A schedule is what one rank does for one collective call.

A schedule is a NumPy ``int64`` array of shape ``(nsteps, 9)`` (see ``docs/internals.md``,
"Schedules"), wrapped in :class:`Schedule` together with the buffer sizes it needs::

    from gpucoll.algorithms import schedule
    s = schedule("allreduce", "ring", rank=0, size=4, count=1000)
    s.steps            # (nsteps, 9) int64, read-only
    s.scratch_count    # elements of scratch (buffer 2) the executor must provide
    print(s.format())  # one line per step, for humans

Generators build schedules with :class:`StepBuilder`, which keeps the column layout in one place.
"""
import numpy as np

from ..base.errors import InvalidUsageError

# Step flags (column FLAGS).
SEND = 1
RECV = 2
REDUCE = 4
COPY = 8

# Buffer ids (columns SRC_BUF, DST_BUF). NOBUF marks the unused half of a step.
SENDBUF = 0
RECVBUF = 1
SCRATCH = 2
NOBUF = -1

# Column indices.
FLAGS, SEND_PEER, SRC_BUF, SRC_OFF, SRC_COUNT, RECV_PEER, DST_BUF, DST_OFF, DST_COUNT = range(9)
NCOLS = 9

_BUF_NAMES = {SENDBUF: "send", RECVBUF: "recv", SCRATCH: "scratch", NOBUF: "-"}


class ScheduleError(InvalidUsageError):
    """A schedule breaks the contract of docs/internals.md (bad peer, buffer, range or flags)."""


class Schedule:
    """One rank's steps for one collective call.

    Fields:
      steps          (nsteps, 9) int64 array, read-only (schedules are cached and shared)
      scratch_count  elements of scratch (buffer 2) needed
      buffer_counts  (send, recv, scratch): elements each buffer must hold on this rank
      name           "collective.algorithm" for the logs
      collective, algorithm, rank, size, count, root   what it was built for
    """

    __slots__ = ("steps", "scratch_count", "buffer_counts", "name", "collective", "algorithm",
                 "rank", "size", "count", "root")

    def __init__(self, steps, collective, algorithm, rank, size, count, root=None,
                 send_count=0, recv_count=0, scratch_count=0):
        steps = np.ascontiguousarray(steps, dtype=np.int64).reshape(-1, NCOLS)
        steps.flags.writeable = False
        self.steps = steps
        self.scratch_count = int(scratch_count)
        self.buffer_counts = (int(send_count), int(recv_count), int(scratch_count))
        self.collective = collective
        self.algorithm = algorithm
        self.name = f"{collective}.{algorithm}"
        self.rank = rank
        self.size = size
        self.count = count
        self.root = root

    def __len__(self):
        return len(self.steps)

    @property
    def nsteps(self):
        return len(self.steps)

    @property
    def sent(self):
        """Elements this rank sends to peers."""
        rows = self.steps
        return int(rows[rows[:, FLAGS] & SEND != 0, SRC_COUNT].sum())

    @property
    def received(self):
        """Elements this rank receives from peers."""
        rows = self.steps
        return int(rows[rows[:, FLAGS] & RECV != 0, DST_COUNT].sum())

    def nbytes_moved(self, itemsize):
        """Bytes this rank puts on the wire (for logs and busbw estimates)."""
        return self.sent * int(itemsize)

    def __repr__(self):
        root = "" if self.root is None else f" root={self.root}"
        return (f"<Schedule {self.name} rank={self.rank}/{self.size} count={self.count}{root} "
                f"steps={self.nsteps} scratch={self.scratch_count}>")

    def format(self):
        """The steps as text, one line each: ``3: send->1 recv[0:250] | recv<-3 +recv[250:500]``."""
        lines = [repr(self)]
        for i, row in enumerate(self.steps):
            lines.append(f"{i:4d}: {format_step(row)}")
        return "\n".join(lines)

    def check(self):
        """Raise ScheduleError if a step breaks the contract; return self."""
        check_steps(self.steps, self.rank, self.size, self.buffer_counts, self.name)
        return self


def format_step(row):
    """One step as text (see Schedule.format)."""
    flags = int(row[FLAGS])

    def region(buf, off, count):
        return f"{_BUF_NAMES.get(int(buf), buf)}[{off}:{off + count}]"

    if flags & COPY:
        verb = "reduce" if flags & REDUCE else "copy"
        return (f"{verb} {region(row[SRC_BUF], row[SRC_OFF], row[SRC_COUNT])} -> "
                f"{region(row[DST_BUF], row[DST_OFF], row[DST_COUNT])}")
    parts = []
    if flags & SEND:
        parts.append(f"send->{row[SEND_PEER]} {region(row[SRC_BUF], row[SRC_OFF], row[SRC_COUNT])}")
    if flags & RECV:
        op = "+" if flags & REDUCE else ""
        parts.append(f"recv<-{row[RECV_PEER]} {op}{region(row[DST_BUF], row[DST_OFF], row[DST_COUNT])}")
    return " | ".join(parts)


def check_steps(steps, rank, size, buffer_counts, name="schedule"):
    """Check every step against the contract; raise ScheduleError naming the first bad one."""
    steps = np.asarray(steps)
    if steps.dtype != np.int64 or steps.ndim != 2 or steps.shape[1] != NCOLS:
        raise ScheduleError(f"{name}: steps must be an int64 array of shape (n, {NCOLS}), "
                            f"got {steps.dtype} {steps.shape}")
    for i, row in enumerate(steps.tolist()):
        problem = _step_problem(row, rank, size, buffer_counts)
        if problem:
            raise ScheduleError(f"{name} rank {rank} step {i} ({format_step(row)}): {problem}")


def _step_problem(row, rank, size, buffer_counts):
    flags, speer, sbuf, soff, scount, rpeer, dbuf, doff, dcount = row
    if flags not in (SEND, RECV, SEND | RECV, RECV | REDUCE, SEND | RECV | REDUCE, COPY, COPY | REDUCE):
        return f"flags {flags} is not a valid combination"

    def bad_region(buf, off, count, writable):
        if count < 0 or off < 0:
            return "negative offset or count"
        if buf not in (SENDBUF, RECVBUF, SCRATCH):
            return f"buffer {buf} does not exist"
        if writable and buf == SENDBUF:
            return "writes the send buffer, which is read-only"
        if off + count > buffer_counts[buf]:
            return (f"{_BUF_NAMES[buf]}[{off}:{off + count}] overruns the "
                    f"{buffer_counts[buf]} elements it holds")
        return None

    def overlap():
        return sbuf == dbuf and sbuf != NOBUF and soff < doff + dcount and doff < soff + scount

    if flags & SEND or flags & COPY:
        problem = bad_region(sbuf, soff, scount, False)
        if problem:
            return "source " + problem
    elif (speer, sbuf, soff, scount) != (-1, NOBUF, 0, 0):
        return "unused send columns must be (-1, -1, 0, 0)"
    if flags & RECV or flags & COPY:
        problem = bad_region(dbuf, doff, dcount, True)
        if problem:
            return "destination " + problem
    elif (rpeer, dbuf, doff, dcount) != (-1, NOBUF, 0, 0):
        return "unused receive columns must be (-1, -1, 0, 0)"
    if flags & SEND and not (0 <= speer < size and speer != rank):
        return f"send peer {speer} is not another rank of {size}"
    if flags & RECV and not (0 <= rpeer < size and rpeer != rank):
        return f"receive peer {rpeer} is not another rank of {size}"
    if flags & COPY:
        if speer != -1 or rpeer != -1:
            return "a copy has no peers"
        if scount != dcount:
            return "a copy must have equal source and destination counts"
    if (flags & COPY or flags & SEND and flags & RECV) and overlap():
        # A sendrecv streams its source while writing its destination: they must not share memory.
        return "source and destination overlap"
    return None


class StepBuilder:
    """Appends steps in the column layout; generators speak in (buffer, offset, count).

    Zero-length sends and receives are dropped unless ``keep_empty`` (the barrier): both ends of
    a message compute the same count, so both drop it, and an empty message carries no data.
    """

    def __init__(self, rank, size, keep_empty=False):
        self.rank = rank
        self.size = size
        self.keep_empty = keep_empty
        self.rows = []

    def combine(self, src_buf, src_off, dst_buf, dst_off, count):
        """Local reduction dst = dst OP src (COPY|REDUCE); skipped when empty."""
        if count > 0:
            self.rows.append((COPY | REDUCE, -1, src_buf, src_off, count, -1, dst_buf, dst_off, count))

    def copy(self, src_buf, src_off, dst_buf, dst_off, count):
        """Local copy; skipped when empty. Buffers 0 and 1 may be the same memory (IN_PLACE):
        the executor treats a copy whose source and destination addresses are equal as done."""
        if count > 0:
            self.rows.append((COPY, -1, src_buf, src_off, count, -1, dst_buf, dst_off, count))

    def step(self, send=None, recv=None, reduce=False):
        """One step: ``send=(peer, buf, off, count)`` and/or ``recv=(peer, buf, off, count)``."""
        if send is not None and send[3] == 0 and not self.keep_empty:
            send = None
        if recv is not None and recv[3] == 0 and not self.keep_empty:
            recv = None
        if send is None and recv is None:
            return
        flags = 0
        row = [0, -1, NOBUF, 0, 0, -1, NOBUF, 0, 0]
        if send is not None:
            flags |= SEND
            row[SEND_PEER:SRC_COUNT + 1] = send
        if recv is not None:
            flags |= RECV | (REDUCE if reduce else 0)
            row[RECV_PEER:DST_COUNT + 1] = recv
        row[FLAGS] = flags
        self.rows.append(tuple(row))

    def send(self, peer, buf, off, count):
        self.step(send=(peer, buf, off, count))

    def recv(self, peer, buf, off, count, reduce=False):
        self.step(recv=(peer, buf, off, count), reduce=reduce)

    def build(self, collective, algorithm, count, root=None, send_count=0, recv_count=0,
              scratch_count=0):
        rows = np.array(self.rows, dtype=np.int64).reshape(-1, NCOLS)
        return Schedule(rows, collective, algorithm, self.rank, self.size, count, root,
                        send_count, recv_count, scratch_count)


def check_args(rank, size, count, root=None):
    """Reject impossible arguments with InvalidUsageError before building anything."""
    for name, value in (("rank", rank), ("size", size), ("count", count)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise InvalidUsageError(f"{name} must be an integer, got {value!r}")
    if size < 1:
        raise InvalidUsageError(f"size must be >= 1, got {size}")
    if not 0 <= rank < size:
        raise InvalidUsageError(f"rank {rank} is not in [0, {size})")
    if count < 0:
        raise InvalidUsageError(f"count must be >= 0, got {count}")
    if root is not None:
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < size:
            raise InvalidUsageError(f"root {root!r} is not a rank of a communicator of size {size}")


def partition(count, parts):
    """Offsets of `parts` near-equal blocks of `count` elements: block b is
    [edges[b], edges[b + 1]); the first count % parts blocks get one element more."""
    q, r = divmod(count, parts)
    return [b * q + min(b, r) for b in range(parts + 1)]


def lowbit(x):
    """Lowest set bit of x > 0 (the size of a binomial subtree rooted at relative rank x)."""
    return x & -x


def pow2_floor(x):
    """Largest power of two <= x (x >= 1)."""
    return 1 << (x.bit_length() - 1)
