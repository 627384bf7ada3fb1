"""submit(call): validate, number, choose an engine by the cost table, route failures.

The dispatcher of a communicator takes each validated Call (gpucoll/base/call.py) from the API:
it resolves the call's stream (host buffers take none), gives the call the communicator's
next sequence number (the order in which every rank issues its calls), and runs it in that
order: GPU calls on the caller's stream (gpucoll/engines/gpu), host calls inline or on the ordered
queue's worker (gpucoll/engines/queue.py). A host call's algorithm is the cost model's
(gpucoll.algorithms.selector, or GPUCOLL_ALGO) among the rows the engines serve
(gpucoll/engines); every failure goes to gpucoll/dispatch/diagnosis.py, whose errors name the
operation, its sequence number and the ranks involved.
"""
import functools

from ..algorithms import selector
from ..base import config, dtypes, log
from ..base.call import ROOTED, Call, check_host_stream
from ..base.errors import GpucollError
from ..engines.direct import FAST_KINDS, DirectEngine
from ..engines.hierarchical import HierarchicalEngine
from ..engines.queue import OrderedQueue
from ..engines.schedules import ScheduleEngine
from ..transports import net
from .diagnosis import Diagnosis, compare_signatures

_VIA = {"direct": "SHM/direct", "hierarchical": "SHM+{}"}


class Dispatcher:
    def __init__(self, view):
        self.view = view
        self.timeout = config.TIMEOUT.get()
        self.checks = config.DEBUG_CHECKS.get()
        self.forced = config.ALGO.get()
        self.queue = OrderedQueue(view.id)
        self.next_seq = self.queue.gate.next_seq  # the one place that numbers calls
        self.choices = {}           # (kind, table bytes) -> algorithm: the cost table's answers, cached
        single_host = view.local_size == view.size
        self.shm = single_host and not config.SHM_DISABLE.get()
        # the cost table's link, and the name the COLL log gives it (net.py chooses between hosts)
        if self.shm:
            self.transport, self.label = "shm", "SHM"
        else:
            between = net.between_hosts()
            self.transport, self.label = between.link, between.label
        self.schedules = ScheduleEngine(view, self.shm, self.timeout, self.check_alive)
        self.diagnosis = Diagnosis(view, self.timeout, on_broken=self.schedules.close_channels)
        self.direct = DirectEngine(view, self.timeout, self.check_alive) if self.shm and view.size > 1 else None
        self.hierarchical = None if self.shm else HierarchicalEngine(view)
        self._rows = {}             # cost-table row -> engine (the schedule engine serves the rest)
        for engine in (self.direct, self.hierarchical):
            if engine is not None:
                self._rows.update(dict.fromkeys(engine.rows, engine))
        self.available = frozenset({"direct"}) if self.direct is not None else frozenset()
        # The packed host fast path: not under GPUCOLL_DEBUG_CHECKS (it cross-checks nothing) nor
        # COLL logs (it logs nothing).
        self.fast_ok = self.direct is not None and not self.checks and not log.enabled("info", "COLL")
        self._gpu = None

    def _via(self, algo):
        return _VIA.get(algo, "{}").format(self.label)

    # --- hooks for engines, the native fast paths and the GPU layer -----------------------------
    def check_alive(self):
        self.diagnosis.check_alive()

    @property
    def seq(self):
        """The next call's sequence number (next_seq() hands them out)."""
        return self.queue.gate.seq

    def fast_failed(self, kind, count, code, op, root, seq, exc):
        """A native fast path's call #seq failed with `exc`: raise what it means."""
        call = Call(kind, None, None, count, code, op, root)
        call.seq = seq
        self.diagnosis.failed(call, "direct", exc)

    def gpu(self):
        """The GPU engine of this communicator (gpucoll/engines/gpu/engine.py), made on first use."""
        if self._gpu is None:
            from ..engines.gpu.engine import GpuEngine

            self._gpu = GpuEngine(self.view, self)
        return self._gpu

    def quiesce(self):
        """Before Free: no peer may still be using this rank's GPU memory."""
        if self._gpu is not None:
            self._gpu.quiesce()

    def revoke(self):
        """Fail the waits of this communicator's collectives (ULFM's revoke): on this host's
        segment, over the channels to other hosts, on the GPU."""
        if self.direct is not None:
            self.direct.revoke()
        self.schedules.revoke()
        if self._gpu is not None:
            self._gpu.revoke()

    def close(self):
        self.queue.close()
        if self._gpu is not None:
            self._gpu.close()
        for engine in (self.direct, self.schedules, self.hierarchical):
            if engine is not None:
                engine.close()

    # --- submit ------------------------------------------------------------------------------------
    def _resolve_stream(self, call):
        """Before the call is numbered: a refused stream leaves the numbering as it was, on
        this rank as on the others."""
        if call.gpu:
            from ..engines.gpu import streams

            buf = call.recv if call.recv is not None and call.recv.is_gpu else call.send
            call.stream = streams.resolve(call.stream, buf)
        else:
            check_host_stream(call.stream)

    def submit(self, call, group=None):
        """Run a blocking call: in order after what is pending, result in place on return
        (GPU calls: enqueued on their stream; inside a group: kept for its end)."""
        self._resolve_stream(call)  # before the number: a refused stream= leaves it alone
        call.seq = self.next_seq()
        if call.gpu:
            if group is not None:
                group.calls.append((call, None))
            else:
                self.gpu().execute(call, call.seq)
            return
        queue = self.queue
        if queue.enter():  # nothing pending: inline, in the caller's thread
            try:
                self.execute(call)
            finally:
                queue.leave()
        else:
            queue.submit(functools.partial(self.execute, call), "blocking").wait()

    def submit_nonblocking(self, call, group=None):
        """Start a call; return its Request."""
        self._resolve_stream(call)
        call.seq = self.next_seq()
        if call.gpu:
            from ..engines.gpu.request import GpuRequest

            if group is not None:  # its event is recorded when the group ends
                req = GpuRequest(call.kind, None, self.gpu())
                group.calls.append((call, req))
                return req
            self.gpu().execute(call, call.seq)
            return GpuRequest(call.kind, call.stream, self.gpu())
        return self.queue.submit(functools.partial(self.execute, call), call.kind)

    def run_group(self, calls):
        """The GPU calls a comm.group() deferred, in order (the GPU engine fuses what it can)."""
        self.gpu().execute_group(calls)

    # --- host calls ----------------------------------------------------------------------------------
    def choose(self, call):
        """The algorithm for this call; the same (collective, size) always gets the same
        answer on a communicator, so it is worked out once."""
        nbytes = call.table_bytes(self.view.size)
        key = (call.kind, nbytes)
        algo = self.choices.get(key)
        if algo is None:
            if len(self.choices) > 4096:
                self.choices.clear()
            hier = self.hierarchical
            if (hier is not None and self.forced == "auto" and nbytes and hier.can_run(call)
                    and hier.prefer(nbytes)):
                algo = "hierarchical"
            else:
                algo = selector.select(call.kind, nbytes, self.view.size, self.transport, forced=self.forced,
                                       available=self.available)
            self.choices[key] = algo
        return algo

    def execute(self, call):
        """Run numbered host call `call` with the engine of its algorithm."""
        h = self.view
        algo = None
        try:
            if self.diagnosis.broken:
                raise GpucollError(f"this communicator is unusable: {self.diagnosis.broken}")
            if self.checks and h.size > 1:
                self.cross_check(call)
            algo = self.choose(call)
            h.stats.host[algo] += 1
            if log.enabled("info", "COLL"):
                mode = self.direct.mode(call) if algo == "direct" else ""
                log.info("COLL", "%s #%d %d B %s%s%s %s%s via %s", call.kind, call.seq, call.nbytes,
                         dtypes.name(call.code), f" {call.op.name}" if call.op else "",
                         f" root {call.root}" if call.kind in ROOTED else "",
                         algo, f" {mode}" if mode else "", self._via(algo))
            self._rows.get(algo, self.schedules).run(call, algo)
        except GpucollError as exc:
            self.diagnosis.failed(call, algo, exc)
        if algo == "direct" and self.fast_ok and h.fast.host is None and call.kind in FAST_KINDS:
            h.fast.host = self.direct.fast_path(self)

    def agree(self, call):
        """Raise MismatchError on every rank, as the call's error, unless every rank makes
        `call` alike: for calls that run where nothing compares signatures (GPU kernels).
        Over the direct segment, one barrier that carries the call's signature (a mismatch
        breaks the communicator, as one found by a host collective does); elsewhere the
        cross-check's all-gather."""
        algo = None
        try:
            if self.direct is not None:
                algo = "direct"
                self.direct.announce(call)
            else:
                self.cross_check(call)
        except GpucollError as exc:
            self.diagnosis.failed(call, algo, exc)

    def cross_check(self, call):
        """GPUCOLL_DEBUG_CHECKS: allgather every rank's (kind, count, dtype, op, root) and raise
        on every rank, naming the ranks that differ, when they do not all agree."""
        compare_signatures(self.schedules.gather_signatures(call))

