"""Reference executor: run every rank's schedule of one collective in-process, over NumPy arrays.

It is the oracle for schedule correctness (and for the native executor's tests): it follows the
contract of docs/internals.md literally and complains about anything a real executor would
choke on::

    import simulate                    # tests/simulate.py
    outs = simulate.collective("allreduce", "ring", [np.arange(10) * r for r in range(4)])
    outs[0]        # the sum, on every rank

Semantics: a message is the content of the source region when its step starts; messages
between a pair of ranks are matched in order (FIFO); a step ends when its send and its receive
are both done. In the default ``mode="rendezvous"`` a send completes only when the receiver's
current step receives from this rank, as with channels whose buffers are too small for the
message: a schedule that passes here cannot deadlock on any buffer size. ``mode="eager"``
buffers every message without limit. Scratch starts filled with a 0xA5 byte pattern so that
reading scratch before writing it shows in the results.
"""
import functools
from collections import deque

import numpy as np

from gpucoll.base.errors import GpucollError, InvalidUsageError
from gpucoll.algorithms import registry
from gpucoll.algorithms.steps import (COPY, DST_BUF, DST_COUNT, DST_OFF, FLAGS, RECV, RECV_PEER, REDUCE,
                                      SEND, SEND_PEER, SRC_BUF, SRC_COUNT, SRC_OFF, format_step)

# Reduction ops by name; AVG runs as SUM (the division is the caller's, see collective()).
# Integer codes follow gc_op in cython_src/include/gc_types.h.
OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
       "avg": np.add, "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
_OP_CODES = ("sum", "prod", "max", "min", "avg", "band", "bor", "bxor")
_PATTERN = 0xA5
REDUCING = frozenset({"allreduce", "reduce_scatter_block", "reduce"})


class SimulationError(GpucollError):
    """The schedules of a collective do not fit together."""


class DeadlockError(SimulationError):
    """No rank can make progress and some have not finished."""


class MessageMismatchError(SimulationError):
    """A message's element count differs from what its receiver expects, or a message is left
    over when every rank has finished."""


def op_name(op):
    """Normalise an op given as a name ('sum', 'SUM') or a gc_op code (0..7)."""
    if isinstance(op, (int, np.integer)) and not isinstance(op, bool) and 0 <= op < len(_OP_CODES):
        return _OP_CODES[op]
    name = str(getattr(op, "name", op)).lower()
    if name not in OPS:
        raise InvalidUsageError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    return name


class _Rank:
    """Progress of one rank: current step, what of it is done, the message it sends."""

    __slots__ = ("rank", "steps", "bufs", "pc", "sent", "got", "payload")

    def __init__(self, rank, steps, bufs):
        self.rank = rank
        self.steps = steps
        self.bufs = bufs
        self.pc = -1
        self.sent = self.got = True
        self.payload = None

    @property
    def done(self):
        return self.pc >= len(self.steps)

    def row(self):
        return self.steps[self.pc]

    def region(self, buf, off, count):
        return self.bufs[buf][off:off + count]


def run(schedules, sendbufs, recvbufs, op="sum", mode="rendezvous", check=True):
    """Execute `schedules` (one per rank, index = rank) on the given buffers, in place.

    sendbufs[r] / recvbufs[r] are contiguous NumPy arrays (or None where the schedule needs no
    such buffer); they may be the same memory (IN_PLACE). Raises DeadlockError or
    MessageMismatchError when the schedules do not fit together, ScheduleError (with `check`)
    when a step breaks the contract."""
    if mode not in ("rendezvous", "eager"):
        raise InvalidUsageError(f"mode must be 'rendezvous' or 'eager', got {mode!r}")
    ufunc = OPS[op_name(op)]
    size = len(schedules)
    if len(sendbufs) != size or len(recvbufs) != size:
        raise InvalidUsageError("one send buffer and one receive buffer per schedule")
    dtype = next((np.asarray(a).dtype for a in list(sendbufs) + list(recvbufs) if a is not None),
                 np.dtype(np.uint8))
    ranks = []
    for r, sched in enumerate(schedules):
        if sched.rank != r or sched.size != size:
            raise InvalidUsageError(f"schedule {r} is {sched!r}, not for rank {r} of {size}")
        if check:
            sched.check()
        bufs = [_flat(sendbufs[r], dtype, sched.buffer_counts[0], f"rank {r} send buffer"),
                _flat(recvbufs[r], dtype, sched.buffer_counts[1], f"rank {r} receive buffer")]
        scratch = np.empty(sched.scratch_count, dtype)
        scratch.view(np.uint8)[:] = _PATTERN
        bufs.append(scratch)
        ranks.append(_Rank(r, sched.steps.tolist(), bufs))
    queues = {}

    def combine(target, incoming):
        """target = target OP incoming, the order of the contract."""
        try:
            ufunc(target, incoming, out=target)
        except TypeError as exc:
            raise InvalidUsageError(f"op {op_name(op)} does not apply to {dtype}: {exc}") from None

    def deliver(dst, row, src_rank, msg):
        if len(msg) != row[DST_COUNT]:
            raise MessageMismatchError(
                f"rank {src_rank} sends {len(msg)} elements to rank {dst.rank}, whose step "
                f"{dst.pc} ({format_step(row)}) expects {row[DST_COUNT]}")
        target = dst.region(row[DST_BUF], row[DST_OFF], row[DST_COUNT])
        if row[FLAGS] & REDUCE:
            combine(target, msg)
        else:
            target[...] = msg
        dst.got = True

    def advance(st):
        """Finish the current step and start the next ones (local copies run at once)."""
        while True:
            st.pc += 1
            if st.done:
                return
            row = st.row()
            flags = row[FLAGS]
            if flags & COPY:
                src = st.region(row[SRC_BUF], row[SRC_OFF], row[SRC_COUNT]).copy()
                dst = st.region(row[DST_BUF], row[DST_OFF], row[DST_COUNT])
                if flags & REDUCE:
                    combine(dst, src)
                else:
                    dst[...] = src
                continue
            st.sent = not flags & SEND
            st.got = not flags & RECV
            if flags & SEND:
                st.payload = st.region(row[SRC_BUF], row[SRC_OFF], row[SRC_COUNT]).copy()
                if mode == "eager":
                    queues.setdefault((st.rank, row[SEND_PEER]), deque()).append(st.payload)
                    st.sent = True
            if st.sent and st.got:
                continue
            return

    def try_progress(st):
        row = st.row()
        moved = False
        if not st.got:
            peer = row[RECV_PEER]
            if mode == "eager":
                q = queues.get((peer, st.rank))
                if q:
                    deliver(st, row, peer, q.popleft())
                    moved = True
            else:
                other = ranks[peer]
                if not other.done and not other.sent and other.row()[SEND_PEER] == st.rank:
                    deliver(st, row, peer, other.payload)
                    other.sent = True
                    moved = True
                    if other.got:
                        advance(other)
        if st.sent and st.got:
            advance(st)
            moved = True
        return moved

    for st in ranks:
        advance(st)
    while True:
        active = [st for st in ranks if not st.done]
        if not active:
            break
        progressed = False
        for st in active:
            if not st.done and try_progress(st):
                progressed = True
        if not progressed:
            raise DeadlockError("no rank can progress:\n" + "\n".join(
                f"  rank {st.rank} step {st.pc}/{len(st.steps)}: {format_step(st.row())}"
                f"{'' if st.sent else ' (send pending)'}{'' if st.got else ' (recv pending)'}"
                for st in active))
    left = {pair: len(q) for pair, q in queues.items() if q}
    if left:
        raise MessageMismatchError("messages never received (sender, receiver): count "
                                   + ", ".join(f"{k}: {v}" for k, v in sorted(left.items())))


def _flat(arr, dtype, need, what):
    if arr is None:
        if need:
            raise InvalidUsageError(f"{what} is needed ({need} elements)")
        return np.empty(0, dtype)
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        raise InvalidUsageError(f"{what} must be a contiguous NumPy array")
    if arr.dtype != dtype:
        raise InvalidUsageError(f"{what} is {arr.dtype}, the others {dtype}")
    flat = arr.reshape(-1)
    if flat.size < need:
        raise InvalidUsageError(f"{what} holds {flat.size} elements, the schedule needs {need}")
    return flat


def _count(name, inputs, root):
    p = len(inputs)
    if name == "barrier":
        return 0
    if name in ("allreduce", "reduce", "allgather", "gather"):
        return np.asarray(inputs[0 if name in ("allreduce", "allgather") else root]).size
    if name == "bcast":
        return np.asarray(inputs[root]).size
    src = np.asarray(inputs[root if name == "scatter" else 0])
    if src.size % p:
        raise InvalidUsageError(f"{name} input of {src.size} elements does not split into {p} blocks")
    return src.size // p


def collective(name, algorithm, inputs, op="sum", root=0, inplace=False, mode="rendezvous"):
    """Run one collective on all ranks with MPI's buffer semantics; return each rank's result.

    inputs[r] is rank r's input: the vector (allreduce, reduce, allgather, gather), the
    size * count input (reduce_scatter_block, alltoall, and scatter at the root), the root's data
    (bcast; other ranks' entries only set the shape), or None (barrier). `inplace` passes the
    same memory as send and receive buffer the way MPI_IN_PLACE does. The result is None where
    MPI defines none (non-root reduce and gather, barrier). AVG divides the sum by the rank
    count at the end (floor division for integers); collectives that do not reduce ignore `op`."""
    p = len(inputs)
    name = registry.canonical(name)
    count = _count(name, inputs, root)
    scheds = [registry.schedule(name, algorithm, r, p, count, root=root, inplace=inplace)
              for r in range(p)]
    sends, recvs, outs = [], [], []
    for r in range(p):
        x = None if inputs[r] is None else np.array(inputs[r], copy=True).reshape(-1)
        is_root = r == root
        send = recv = out = None
        if name == "barrier":
            pass
        elif name == "bcast":
            recv = out = x if is_root else np.zeros(count, np.asarray(inputs[root]).dtype)
        elif name in ("allreduce", "alltoall") and inplace:
            send = recv = out = x
        elif name == "reduce_scatter_block" and inplace:
            send = recv = x
            out = x[:count]
        elif name in ("allgather", "gather") and inplace and (name == "allgather" or is_root):
            recv = out = np.zeros(p * count, x.dtype)
            recv[r * count:(r + 1) * count] = x
            send = recv[r * count:(r + 1) * count]
        elif name == "scatter" and inplace and is_root:
            send = x
            recv = out = x[r * count:(r + 1) * count]
        else:
            send = x if name != "scatter" or is_root else None
            n = {"allreduce": count, "reduce_scatter_block": count, "allgather": p * count,
                 "reduce": count, "gather": p * count, "scatter": count, "alltoall": p * count}[name]
            dtype = np.asarray(inputs[root if name == "scatter" else r]).dtype
            if name not in ("reduce", "gather") or is_root:
                recv = out = np.zeros(n, dtype)
        sends.append(send)
        recvs.append(recv)
        outs.append(out)
    run(scheds, sends, recvs, op, mode)
    if op_name(op) == "avg" and name in REDUCING:
        for out in outs:
            if out is not None:
                if out.dtype.kind in "iu":
                    np.floor_divide(out, p, out=out)
                else:
                    np.true_divide(out, p, out=out)
    return outs


def reference(name, inputs, op="sum", root=0):
    """What `collective` must return, computed directly with NumPy (reductions in rank order)."""
    p = len(inputs)
    name = registry.canonical(name)
    ufunc = OPS[op_name(op)]
    xs = [None if x is None else np.asarray(x).reshape(-1) for x in inputs]
    count = _count(name, inputs, root)

    def reduced(vectors):
        total = functools.reduce(lambda a, b: ufunc(a, b), vectors)
        if op_name(op) == "avg":
            total = total // p if total.dtype.kind in "iu" else (total / p).astype(total.dtype)
        return total

    if name == "barrier":
        return [None] * p
    if name == "allreduce":
        return [reduced(xs)] * p
    if name == "reduce":
        return [reduced(xs) if r == root else None for r in range(p)]
    if name == "reduce_scatter_block":
        total = reduced(xs)
        return [total[r * count:(r + 1) * count] for r in range(p)]
    if name == "allgather":
        return [np.concatenate(xs)] * p
    if name == "gather":
        return [np.concatenate(xs) if r == root else None for r in range(p)]
    if name == "bcast":
        return [xs[root]] * p
    if name == "scatter":
        return [xs[root][r * count:(r + 1) * count] for r in range(p)]
    if name == "alltoall":
        return [np.concatenate([xs[j][r * count:(r + 1) * count] for j in range(p)]) for r in range(p)]
    raise InvalidUsageError(f"unknown collective {name!r}")
