"""From a validated call to bytes on the wire: algorithm choice, execution, logs, errors.

The dispatcher of a communicator picks, for each call, the algorithm (the cost model of
gpucoll.algorithms.selector, or GPUCOLL_ALGO) and runs it: the intra-host `direct`
algorithms on one shared segment, or a schedule over the peer channels. Every call gets a
sequence number; errors name the operation, that number and the ranks involved.
"""
import functools
import json
import time

import numpy as np

from . import config, dtypes, log
from . import ops as _ops
from .algorithms import schedule as build_schedule
from .algorithms import selector
from .errors import GpucollError, LostPeerError, MismatchError
from .errors import TimeoutError as GpucollTimeout

KIND_IDS = {"allreduce": 1, "bcast": 2, "reduce": 3, "allgather": 4, "reduce_scatter": 5, "alltoall": 6,
            "gather": 7, "scatter": 8, "barrier": 9}
_KIND_NAMES = {v: k for k, v in KIND_IDS.items()}
_REDUCING = frozenset({"allreduce", "reduce", "reduce_scatter"})
_ROOTED = frozenset({"bcast", "reduce", "gather", "scatter"})


class Call:
    """One validated collective call. `count` is the per-rank block for allgather,
    reduce_scatter, alltoall, gather and scatter, else the buffer's element count."""

    __slots__ = ("dispatch", "kind", "send", "recv", "count", "code", "op", "root", "stream", "seq")

    def __init__(self, dispatch, kind, send, recv, count, code, op=None, root=0):
        self.dispatch, self.kind, self.send, self.recv = dispatch, kind, send, recv
        self.count, self.code, self.op, self.root = count, code, op, root
        self.stream = None  # GPU calls: the stream= argument, then the resolved handle
        self.seq = None     # numbered when the caller issues it (Dispatcher.number), else when it runs

    @property
    def gpu(self):
        """True when the buffers are on a GPU (gpucoll/gpu runs the call)."""
        buf = self.recv if self.recv is not None else self.send
        return buf is not None and buf.is_gpu

    def run(self):
        return self.dispatch.execute(self)

    def signature(self):
        op = self.op.code if self.op is not None else -1
        return (KIND_IDS[self.kind], self.count, self.code, op, self.root)


@functools.lru_cache(maxsize=1024)
def _peers_of(sched):
    """Peer ranks a schedule talks to (columns send_peer and recv_peer)."""
    cols = sched.steps[:, [1, 5]]
    return tuple(int(p) for p in np.unique(cols[cols >= 0]))


def _addr(buf):
    return 0 if buf is None else buf.addr


class Dispatcher:
    def __init__(self, comm):
        self.comm = comm
        self.seq = 0
        self.timeout = config.TIMEOUT.get()
        self.checks = config.DEBUG_CHECKS.get()
        self.forced = config.ALGO.get()
        self._choices = {}
        single_host = comm.local_size == comm.size
        self.shm = single_host and not config.SHM_DISABLE.get()
        self.transport = "shm" if self.shm else "tcp"
        self.available = frozenset({"direct"}) if self.shm and comm.size > 1 else frozenset()
        self._direct = None
        self._channels = None
        self._hier = None           # algorithms.hierarchical.Hierarchy, made on first use
        self._scratch = np.empty(0, np.uint8)
        self._gpu = None
        self._broken = None         # why the schedule channels cannot be used any more

    # --- resources, made on first use (every rank makes them in the same call) -----------
    # Their waits belong to that call: GPUCOLL_TIMEOUT (a rank may reach its first collective
    # late), and they stop as soon as a rank of the communicator is known to have ended.
    def direct(self):
        if self._direct is None:
            from .transports.shm_direct import create_or_attach
            from .transports.shm_segment import JobSegments

            comm, ctx = self.comm, self.comm._ctx
            group = create_or_attach(JobSegments(ctx.job_id, ctx.secret), comm._id, comm.rank, comm.size,
                                     creator_pid=ctx.pids[comm.world_ranks[0]], timeout=self.timeout,
                                     check=self.check_alive)
            group.watch([ctx.watch_pid(w) for w in comm.world_ranks])  # ranks that never attach
            self._direct = group
        return self._direct

    def channels(self):
        if self._channels is None:
            from .transports.channels import ChannelSet

            self._channels = ChannelSet(self.comm, "coll", use_shm=self.shm, timeout=self.timeout,
                                        check=self.check_alive)
        return self._channels

    def check_alive(self):
        """Raise LostPeerError naming the ranks of this communicator whose process is known
        to have ended (of this host: see Context.has_ended): every collective needs every
        rank, so a wait for set-up need not go on."""
        ctx = self.comm._ctx
        dead = [r for r, w in enumerate(self.comm.world_ranks) if ctx.has_ended(w)]
        if dead:
            raise LostPeerError(f"the process of rank(s) {_ranges(dead)} has ended", ranks=dead)

    def scratch(self, nbytes):
        if self._scratch.size < nbytes:
            self._scratch = np.empty(max(nbytes, 2 * self._scratch.size), np.uint8)
        return self._scratch.__array_interface__["data"][0]

    def gpu(self):
        """The GPU dispatcher of this communicator (gpucoll/gpu/dispatch.py), made on first use."""
        if self._gpu is None:
            from .gpu.dispatch import GpuDispatcher

            self._gpu = GpuDispatcher(self.comm, self)
        return self._gpu

    def close(self):
        if self._gpu is not None:
            self._gpu.close()
        if self._direct is not None:
            self._direct.close()
        if self._channels is not None:
            self._channels.close()
        if self._hier is not None:
            self._hier.close()

    # --- execution -------------------------------------------------------------------------
    def number(self, call):
        """Give the call the communicator's next sequence number, in the caller's thread: the
        order in which every rank issues its calls, whether they then run inline, on the
        engine's worker (nonblocking host calls) or at the end of a group."""
        call.seq = self.seq
        self.seq += 1
        return call

    def execute(self, call):
        seq = call.seq
        if seq is None:  # an internal call (a host-staged GPU call's host half)
            seq = self.seq
            self.seq += 1
        if call.gpu:
            return self.gpu().execute(call, seq)
        comm = self.comm
        algo = None
        try:
            if self._broken:
                raise GpucollError(f"this communicator is unusable: {self._broken}")
            if self.checks and comm.size > 1:
                self._cross_check(call, seq)
            itemsize = dtypes.ITEMSIZE[call.code]
            nbytes = call.count * itemsize
            algo = self._choose(call, nbytes)
            comm._stats.host[algo] += 1
            if log.enabled("info", "COLL"):
                via = {"direct": "SHM/direct", "hierarchical": "SHM+TCP"}.get(algo, self.transport.upper())
                log.info("COLL", "%s #%d %d B %s%s%s %s via %s", call.kind, seq, nbytes,
                         dtypes.name(call.code), f" {call.op.name}" if call.op else "",
                         f" root {call.root}" if call.kind in ("bcast", "reduce", "gather", "scatter") else "",
                         algo, via)
            if algo == "direct":
                self._run_direct(call)
            elif algo == "hierarchical":
                self._hier.allreduce(call)
            else:
                self._run_schedule(call, algo)
        except GpucollError as exc:
            self.failed(call, seq, algo, exc)

    def failed(self, call, seq, algo, exc):
        """Raise what call #seq's failure `exc` means: the mismatch another rank found, the
        late or dead ranks named, the call and the communicator in the message."""
        comm = self.comm
        err = exc
        if algo not in (None, "hierarchical"):
            err = self._call_failed(exc)
        if isinstance(err, GpucollTimeout) and not getattr(err, "ranks", ()):
            err = self._name_late_ranks(err, seq, call)
        elif isinstance(err, LostPeerError):
            self._name_dead_ranks(err)
        err.args = (f"{call.kind} #{seq} on communicator {comm.name} (rank {comm.rank} of {comm.size}): "
                    f"{err.args[0] if err.args else err}",) + err.args[1:]
        if err is exc:
            raise err
        raise err from exc

    # --- mismatched calls (without GPUCOLL_DEBUG_CHECKS) ------------------------------------------
    # The direct engine compares call signatures in its segment, the executor the message headers
    # (count, dtype, op, root). A rank that finds a mismatch says so in the store and closes its
    # channels: the ranks waiting for it then fail at once (lost peer), or at their deadline, and
    # report the mismatch it found instead. The communicator is unusable afterwards.
    def _mismatch_key(self):
        return f"gpucoll/mismatch/{self.comm._id}/report"

    def _call_failed(self, exc):
        """The error to raise for `exc`, raised by a collective: a mismatch is told to the others;
        a timeout or a lost peer becomes the mismatch another rank found, if it found one."""
        if isinstance(exc, MismatchError):
            self._tell_mismatch(exc)
            return exc
        if not isinstance(exc, (GpucollTimeout, LostPeerError)):
            return exc
        store = getattr(self.comm._ctx.boot, "store", None)
        try:
            if store is None or not store.num_keys(self._mismatch_key()):
                return exc
            told = json.loads(store.get(self._mismatch_key(), timeout=1.0))
        except GpucollError:
            return exc
        err = MismatchError(f"rank {told['by']} found: {told['message']}")
        err.ranks = tuple(told["ranks"])
        self._tell_mismatch(err, store=False)
        return err

    def _tell_mismatch(self, exc, store=True):
        comm = self.comm
        message = exc.args[0] if exc.args else str(exc)
        self._broken = f"rank {comm.rank} found mismatched calls: {message}"
        st = getattr(comm._ctx.boot, "store", None) if store else None
        if st is not None:
            told = {"by": comm.rank, "ranks": list(getattr(exc, "ranks", ())), "message": message}
            try:
                st.compare_set(self._mismatch_key(), None, json.dumps(told).encode())
            except GpucollError:
                pass
        if self._channels is not None:
            self._channels.close()

    def _name_dead_ranks(self, exc):
        """A schedule notices a lost peer through the neighbour it talks to, which may only
        have left the call because it saw the failure first. Name the ranks of this host whose
        process is really gone."""
        comm, ctx = self.comm, self.comm._ctx
        dead = [r for r, w in enumerate(comm.world_ranks) if ctx.has_ended(w)]
        if dead and set(dead) != set(getattr(exc, "ranks", ())):
            exc.ranks = tuple(dead)
            exc.args = (f"{exc.args[0] if exc.args else exc}; the process of rank(s) "
                        f"{', '.join(map(str, dead))} has ended",) + exc.args[1:]

    def _name_late_ranks(self, exc, seq, call):
        """A schedule that times out only knows the peer it waited for, which may itself be
        waiting for someone else. Ranks that time out in call `seq` say so in the store, with
        the signature of their call; the ranks that have not said so within a short grace never
        reached the call (or are stuck before it), and are named in the error and in
        `exc.ranks`. When ranks that did time out called it differently (a bcast whose ranks
        all wait for a different root), the error returned is that MismatchError instead."""
        comm = self.comm
        store = getattr(comm._ctx.boot, "store", None)
        if store is None or comm.size == 1:
            return exc
        prefix = f"gpucoll/late/{comm._id}/{seq}/"
        # Ranks blocked in the same call time out within the spread of their arrival times.
        began = time.monotonic()
        deadline = began + min(self.timeout, 2.0)
        try:
            store.set(prefix + f"sig/{comm.rank}", json.dumps(call.signature()).encode())
            store.add(prefix + str(comm.rank), 1)
            while True:
                late = [r for r in range(comm.size) if r != comm.rank and store.add(prefix + str(r), 0) == 0]
                if not late or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            sigs = {r: tuple(json.loads(store.get(prefix + f"sig/{r}", timeout=1.0)))
                    for r in range(comm.size) if r != comm.rank and r not in late}
        except GpucollError:  # no store to ask: keep what the schedule knew
            return exc
        mine = call.signature()
        differ = sorted(r for r, sig in sigs.items() if sig != mine)
        if differ:
            err = MismatchError(f"rank {differ[0]} called {_describe(sigs[differ[0]])}, this rank "
                                f"{_describe(mine)} (found after a timeout); every rank must call "
                                "collectives in the same order with matching counts, dtypes, ops and roots")
            err.ranks = tuple(differ)
            self._tell_mismatch(err)
            return err
        if late:
            # Say how long the extra wait was, so that the time in the message adds up to when
            # the error came.
            exc.ranks = tuple(late)
            exc.args = (f"{exc.args[0] if exc.args else exc}; rank(s) {', '.join(map(str, late))} did not "
                        f"reach this call in {time.monotonic() - began:.1f} s more either (every other rank "
                        "timed out inside it)",) + exc.args[1:]
        return exc

    def _choose(self, call, nbytes):
        """The algorithm for this call; the same (collective, size) always gets the same
        answer on a communicator, so it is worked out once."""
        key = (call.kind, nbytes)
        algo = self._choices.get(key)
        if algo is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            algo = self._choices[key] = self._hierarchical(call, nbytes) or selector.select(
                call.kind, nbytes, self.comm.size, self.transport, forced=self.forced, available=self.available)
        return algo

    def _hierarchical(self, call, nbytes):
        """"hierarchical" when the communicator spans hosts with several ranks on one and
        the cost model prefers it to the flat schedule (allreduce; GPUCOLL_ALGO unset)."""
        if self.shm or self.forced != "auto" or call.kind != "allreduce" or not nbytes:
            return None
        if self._hier is None:
            from .algorithms.hierarchical import Hierarchy

            self._hier = Hierarchy(self.comm)
        return "hierarchical" if self._hier.prefer(nbytes) else None

    def _buffers(self, call):
        """(buffer 0, buffer 1) addresses with MPI's IN_PLACE aliasing (docs/internals.md):
        allgather and gather read this rank's (the root's) block of the receive buffer,
        scatter's root keeps its own block of the send buffer, the rest use one buffer."""
        kind = call.kind
        send, recv = _addr(call.send), _addr(call.recv)
        block = call.count * dtypes.ITEMSIZE[call.code]
        if call.send is None and call.recv is not None:
            if kind == "allgather":
                send = recv + self.comm.rank * block
            elif kind == "gather":
                send = recv + call.root * block
            elif kind != "scatter":
                send = recv
        elif call.recv is None and kind == "scatter" and self.comm.rank == call.root:
            recv = send + call.root * block
        return send, recv

    def _run_direct(self, call):
        group = self.direct()
        kind, t, n, root = call.kind, self.timeout, call.count, call.root
        op = call.op.code if call.op is not None else 0
        isz = dtypes.ITEMSIZE[call.code]
        send, recv = self._buffers(call)
        if kind == "allreduce":
            group.allreduce(send, recv, n, call.code, op, t)
            if self.comm._host_fast is None and not self.checks and not log.enabled("info", "COLL"):
                self._install_fast(group)
        elif kind == "bcast":
            group.bcast(recv, n, isz, root, t)
        elif kind == "reduce":
            group.reduce(send, recv, n, call.code, op, root, t)
        elif kind == "allgather":
            group.allgather(send, recv, n, isz, t)
        elif kind == "reduce_scatter":
            group.reduce_scatter_block(send, recv, n, call.code, op, t)
        elif kind == "alltoall":
            group.alltoall(send, recv, n, isz, t)
        elif kind == "gather":
            group.gather(send, recv, n, isz, root, t)
        elif kind == "scatter":
            group.scatter(send, recv, n, isz, root, t)
        else:
            group.barrier(t)

    def _install_fast(self, group):
        """Let later host all-reduces of NumPy arrays take the native fast path (HostAllreduce)."""
        from ._native.direct import HostAllreduce
        from .buffers import _CODES
        from .comm import IN_PLACE

        def make_call(count, code, op):
            return Call(self, "allreduce", None, None, count, code, op)

        self.comm._host_fast = HostAllreduce(group, self, self.comm._engine, IN_PLACE, np.ndarray, _ops.Op,
                                             _CODES, make_call)

    def _run_schedule(self, call, algo):
        from ._native import core

        comm = self.comm
        isz = dtypes.ITEMSIZE[call.code]
        sched = build_schedule(call.kind, algo, comm.rank, comm.size, call.count, root=call.root,
                               inplace=call.send is None or call.send.addr == _addr(call.recv))
        send, recv = self._buffers(call)
        scratch = self.scratch(sched.scratch_count * isz) if sched.scratch_count else 0
        # AVG travels as AVG (the executor reduces it as SUM), so that a peer's SUM differs
        op = call.op.code if call.op is not None else _ops.SUM.code
        root = call.root if call.kind in _ROOTED else -1
        if root >= 0 and sched.nsteps:
            # A rooted schedule's data does not reach every rank (a bcast's root receives
            # nothing), so ranks that disagree on the root would return with their own data or
            # wait for a root that never sends. First a dissemination barrier whose empty
            # messages carry the call's header: a rank that completes it has a chain of
            # matching headers from every rank, and every rank runs it whatever root it took.
            # Its own run, before the data schedule's channels are made: on first use a
            # rank waits for the peers of its schedule to connect, which differ with the root.
            bar = build_schedule("barrier", "dissemination", comm.rank, comm.size)
            core.run_schedule(bar.steps, self.channels().pointers(_peers_of(bar)), send, recv, 0, isz, call.code,
                              op, self.timeout, root=root)
        chans = self.channels().pointers(_peers_of(sched))
        core.run_schedule(sched.steps, chans, send, recv, scratch, isz, call.code, op, self.timeout, root=root)
        if call.op is _ops.AVG and call.recv is not None and (call.kind != "reduce" or comm.rank == call.root):
            core.scale_avg(call.recv.array[:call.count], call.code, comm.size)

    def agree(self, call, seq):
        """Raise MismatchError on every rank, as call #seq's error, unless every rank makes
        `call` alike: for calls that run where nothing compares signatures (GPU kernels).
        Over the direct segment, one barrier that carries the call's signature (a mismatch
        breaks the communicator, as one found by a host collective does); elsewhere the
        cross-check's all-gather."""
        algo = None
        try:
            if "direct" in self.available:
                algo = "direct"
                op = call.op.code if call.op is not None else -1
                self.direct().announce(KIND_IDS[call.kind], call.count, call.code, op, call.root, self.timeout)
            else:
                self._cross_check(call, seq)
        except GpucollError as exc:
            self.failed(call, seq, algo, exc)

    # --- GPUCOLL_DEBUG_CHECKS ------------------------------------------------------------------
    def _cross_check(self, call, seq):
        """Allgather every rank's (kind, count, dtype, op, root) and raise on every rank,
        naming the ranks that differ, when they do not all agree."""
        from ._native import core

        comm = self.comm
        mine = np.array(call.signature(), dtype=np.int64)
        table = np.empty(comm.size * mine.size, dtype=np.int64)
        sched = build_schedule("allgather", "ring", comm.rank, comm.size, mine.size)
        core.run_schedule(sched.steps, self.channels().pointers(_peers_of(sched)), mine.__array_interface__["data"][0],
                          table.__array_interface__["data"][0], 0, 8, dtypes.INT64, 0, self.timeout)
        rows = table.reshape(comm.size, mine.size)
        if (rows == rows[0]).all():
            return
        fields = ("operation", "count", "dtype", "op", "root")
        groups = {}  # signature -> ranks that called it, so a large job gets a short message
        for r, row in enumerate(rows):
            groups.setdefault(tuple(int(v) for v in row), []).append(r)
        ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
        described = []
        for (kind, count, code, op, root), ranks in ordered:
            op_name = _ops.ALL[op].name if op >= 0 else "-"
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
            described.append(f"{who}: {_KIND_NAMES.get(kind, kind)} count={count} "
                             f"dtype={dtypes.name(code)} op={op_name} root={root}")
        differing = sorted({fields[j] for r in range(comm.size) for j in range(mine.size)
                            if rows[r, j] != rows[0, j]})
        err = MismatchError(f"ranks called different collectives (differing: {', '.join(differing)}); "
                            + "; ".join(described))
        err.ranks = tuple(sorted(r for _, ranks in ordered[1:] for r in ranks))  # all but the largest group
        raise err


def _describe(signature):
    """A Call.signature() in words: 'bcast count=4 dtype=float32 op=- root=1'."""
    kind, count, code, op, root = signature
    op_name = _ops.ALL[op].name if op >= 0 else "-"
    return f"{_KIND_NAMES.get(kind, kind)} count={count} dtype={dtypes.name(code)} op={op_name} root={root}"


def _ranges(ranks):
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    parts, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(parts)
