"""From a validated GPU call to kernel launches: algorithm, grid, registration, fallbacks.

One GpuEngine per communicator (made by gpucoll.dispatch.dispatcher.Dispatcher on the first GPU
call). Small and medium messages go through the IPC staging buffers of the communicator's
Team (one launch per slot-sized piece); messages above GPUCOLL_GPU_STAGE_MAX register the
caller's buffers and move data directly between them (all-reduce, reduce-scatter,
all-gather, broadcast, all-to-all). Without P2P (or with GPUCOLL_P2P_DISABLE=1) the call
copies to host memory and runs the host collective. Every launch goes on the caller's
stream; nothing here waits for the GPU except that host fallback. As with NCCL, a caller
that switches streams between operations of one communicator orders them itself (for
example s2.wait_stream(s1)): operations of a communicator must not run concurrently.

The eager fast path (fast_allreduce, installed on the communicator once a small all-reduce
has run): an all-reduce that goes out as one staged launch is packed once per (buffers,
count, dtype, op) into a cuda.Prepared; a repeated call with the same arguments checks them
against that key (pointers, sizes, dtypes, contiguity: the checks the first call made) and
costs one Python call and one cuLaunchKernel. Anything else takes the general path.

A kernel that gives up waiting for a peer records (seq << 8) | (1 + peer) in the team's
mapped host word; the next launch, GpuRequest.Wait/Test and Free() see it and raise
gpucoll.TimeoutError naming the operation, its sequence number and the peer. When a peer's
process ends, or the communicator is revoked, the team's abort word releases the kernels that
wait at once (team.py); they record the release the same way, and the same calls raise
ProcFailedError naming the lost rank (RevokedError after a revoke).
"""
import numpy as np

from ..._native import cuda
from ...algorithms import selector
from ...base import config, dtypes, log
from ...base import ops as _ops
from ...base.call import IN_PLACE, KINDS, ROOTED, Call, addresses
from ...base.errors import InvalidUsageError, ProcFailedError, RevokedError
from ...base.errors import TimeoutError as GpucollTimeout
from ...base.ranks import ranges
from . import ipc, streams
from .staged import HostStaging

_FAST_MAX = 1024  # packed launches kept per communicator

_BOOL_OPS = {_ops.SUM.code: _ops.BOR.code, _ops.MAX.code: _ops.BOR.code, _ops.BOR.code: _ops.BOR.code,
             _ops.AVG.code: _ops.BOR.code, _ops.PROD.code: _ops.BAND.code, _ops.MIN.code: _ops.BAND.code,
             _ops.BAND.code: _ops.BAND.code, _ops.BXOR.code: _ops.BXOR.code}
_COMPLEX = {dtypes.COMPLEX64: dtypes.FLOAT32, dtypes.COMPLEX128: dtypes.FLOAT64}
_ROOTED = ROOTED
_STAGED_COPY = {"allgather": "ag_staged", "bcast": "bc_staged", "alltoall": "a2a_staged", "gather": "ga_staged",
                "scatter": "sc_staged"}
_REGISTERED_COPY = {"allgather": "ag_registered", "alltoall": "a2a_registered"}
_REG_ROW = 8 + 2 * 72  # ok, has-send, has-recv, pad; then (IPC handle, offset) of send and recv
# Bytes per thread block (see _grid). Through staging, 8 KiB: one 16-byte access for each of
# 512 threads, so a 256 KiB all-reduce runs on 32 SMs, not 4 (a block's NVLink stores are in
# flight one after another). On registered buffers, 64 KiB, up to one block per SM.
_STAGED_BLOCK_BYTES = 8 << 10
_REGISTERED_BLOCK_BYTES = 64 << 10


def _cdiv(a, b):
    return -(-a // b)


def _round_up(n, a):
    return _cdiv(n, a) * a


def _native_form(call):
    """(dtype code, count, op code) as the kernels see a call: bool as uint8 with the logical op's
    bitwise twin, complex as twice as many reals (SUM and AVG only)."""
    code, count = call.code, call.count
    op = call.op.code if call.op is not None else 0
    if code == dtypes.BOOL:
        return dtypes.UINT8, count, _BOOL_OPS[op]
    if code in _COMPLEX:
        if KINDS[call.kind].reducing and op not in (_ops.SUM.code, _ops.AVG.code):
            raise InvalidUsageError(f"{call.op.name} on complex GPU buffers is not supported; use SUM or AVG")
        return _COMPLEX[code], count * 2, op
    return code, count, op


class GpuEngine:
    """view: what the engine may use of its communicator (gpucoll/engines/comm_view.py); host: its
    dispatcher (numbering, the ordered host engine, agreement and cross-checks)."""

    def __init__(self, view, host):
        self.view, self.host = view, host
        self.stats = view.stats  # which path each call took (Communicator.stats())
        self.device = config.DEVICE.get()
        self.forced = config.ALGO.get()
        blocks = config.GPU_BLOCKS.get()
        self.maxblocks = min(blocks or 64, 256)                  # kernels through staging
        self.maxblocks_registered = min(blocks, 256) if blocks else None  # None: one per SM (Team.sms)
        self.copy_engine = config.GPU_COPY.get() == "ce"
        self.verbose = log.enabled("info", "COLL")
        self._ctx = None
        self._team = None
        self._kernels = None
        self._kinds = [None] * 256  # the kind of operation seq, at seq & 255 (timeout reports)
        self._fast = {}             # key of a repeated all-reduce -> cuda.Prepared
        self._choices = {}          # (kind, nbytes, registration possible) -> algorithm
        self._join_event = None     # orders the streams of a fused group
        self._staging = HostStaging()  # pinned buffers of the calls that go through host memory
        self._fast_ok = not host.checks and not self.verbose and view.size > 1
        self._in_place = IN_PLACE
        self._cupy_type = self._torch_type = None
        self._cupy_stream = self._torch_stream = None

    # --- resources ---------------------------------------------------------------------------
    def team(self):
        if self._team is None:
            from .team import Team

            self._team = Team(self.view, self.device)
        return self._team

    def kernels(self):
        if self._kernels is None:
            from .kernels import Kernels

            self._kernels = Kernels(self.team().arch)
        return self._kernels

    def quiesce(self):
        """Before the IPC memory is unmapped (Free): wait for this rank's kernels, then for
        every rank's (a host barrier), so no peer still reads or writes our memory. Raises the
        timeout a kernel recorded, if any (collective: every rank of a GPU team calls it)."""
        team = self._team
        if team is None or not team.ok:
            return
        cuda.set_current(team.ctx)
        cuda.ctx_synchronize()
        if team.aborted():  # a rank is gone or the communicator revoked: no barrier can end; the
            return          # survivors' kernels were released as ours were
        self.view.barrier()
        self.check_error()

    def revoke(self):
        """Release this rank's kernels that wait on the communicator's peers (ULFM's revoke)."""
        if self._team is not None and self._team.ok:
            self._team.abort(revoked=True)

    def close(self):
        self.view.fast.gpu = None
        self._fast.clear()
        if self._team is not None:
            self._team.close()
            self._team = None
        if self._staging._hosts:
            self._staging.close()

    # --- errors recorded by kernels -------------------------------------------------------------
    def check_error(self):
        """Raise gpucoll.TimeoutError when a kernel of this communicator gave up on a peer."""
        team = self._team
        if team is not None and team.launcher is not None:
            word = team.error_word()
            if word:
                raise self._timeout_error(word)

    def _timeout_error(self, word):
        seq, peer = (word & ~cuda.RELEASED) >> 8, (word & 0xff) - 1
        kind = self._kinds[seq & 255] if self.host.seq - seq <= 256 else None
        view = self.view
        if word & cuda.RELEASED:
            return self._released_error(f"{kind or 'collective'} #{seq} on communicator {view.name} (rank "
                                        f"{view.rank} of {view.size})")
        err = GpucollTimeout(
            f"{kind or 'collective'} #{seq} on communicator {view.name} (rank {view.rank} of {view.size}): a GPU "
            f"kernel waited more than {self.host.timeout:g} s (GPUCOLL_TIMEOUT) for rank {peer}, which did not "
            "reach this operation; the GPU collectives of this communicator cannot continue (free it and "
            "create a new one)")
        err.ranks = (peer,)
        err.seq = seq
        return err

    def _released_error(self, what):
        """What a call raises once the team's abort word released its kernels (or refused them)."""
        lost = sorted(set(self._team.lost))
        if lost:
            return ProcFailedError(
                f"{what}: rank(s) {ranges(lost)} failed (the process ended) and this rank's GPU kernels, which "
                "waited for it, were released; the communicator's GPU collectives cannot go on: revoke() and "
                "shrink() it to go on with the survivors", ranks=lost)
        return RevokedError(f"{what}: the communicator was revoked and this rank's GPU kernels were released; "
                            "shrink() it to go on with the survivors")

    # --- checks and streams -------------------------------------------------------------------
    def _check(self, call):
        first = None
        for buf, name in ((call.send, "sendbuf"), (call.recv, "recvbuf")):
            if buf is None:
                continue
            if not buf.is_gpu:
                raise InvalidUsageError(f"{call.kind}: {name} is in host memory but the other buffer is on a GPU; "
                                        "pass both on the GPU or both on the host")
            if self.device is None:
                self.device = buf.device
            if buf.device != self.device:
                raise InvalidUsageError(self._wrong_device(call, name, buf.device))
            first = first or buf
        return first

    def _wrong_device(self, call, name, device):
        if config.DEVICE.get() is not None:
            why = "GPUCOLL_DEVICE pins this rank to it"
        else:
            why = (f"its GPU collectives run on the GPU of its first GPU buffer; use one GPU per communicator, "
                   f"or Dup() it for GPU {device}")
        return (f"{call.kind}: {name} is on GPU {device} but this communicator ({self.view.name}, rank "
                f"{self.view.rank}) uses GPU {self.device} ({why}): allocate it on GPU {self.device}")

    # --- execution ------------------------------------------------------------------------------
    def execute(self, call, seq):
        team = self._prepare(call, seq)
        if team is not None:
            self._run(team, seq, self._launch, team, call, call.stream, seq)

    def _prepare(self, call, seq):
        """Check and resolve a call; run it at once where no IPC kernel is needed. The team when
        the call still has to be launched, else None."""
        buf = self._check(call)
        self._kinds[seq & 255] = call.kind
        if self._ctx is None:
            self._ctx = cuda.primary_context(self.device)
        stream = streams.resolve(call.stream, buf)
        call.stream = stream
        if self.host.checks and self.view.size > 1:
            self.host.cross_check(call)  # GPUCOLL_DEBUG_CHECKS: same signature on every rank
        if call.count == 0:
            return None
        if self.view.size == 1:
            cuda.set_current(self._ctx)
            self._single(call, stream, seq)
            return None
        team = self.team()
        if not team.ok:
            self._via_host(call, stream, seq)
            return None
        if call.kind in _ROOTED and not self.host.checks:
            # The kernels carry no call signature, and ranks that disagree on the root would
            # each keep their own data (every rank a root: nobody receives). So the ranks
            # compare their calls on the host first and all raise in this call, before any
            # launch (the host threads meet; the GPU streams are not waited for). Through the
            # host engine: after the host collectives still queued, which use the same segment.
            self.host.queue.run(lambda: self.host.agree(call))
        return team

    def _run(self, team, seq, launch, *args):
        """launch(*args), with a kernel's timeout reported as call #seq's."""
        team.launcher.set_seq(seq)
        try:
            launch(*args)
        except cuda.DeviceTimeout as exc:
            raise self._timeout_error(exc.word) from None

    # --- groups (comm.group()) --------------------------------------------------------------------
    def execute_group(self, calls):
        """Run the calls a group deferred, in their order, each with the sequence number it got
        when issued; the all-reduces that would go out one-shot are fused, per dtype, into
        ar_oneshot_multi launches (at most MAXFUSE entries and one staging slot each), issued
        after the others. Every rank makes the same batches: they depend only on the calls and
        the team."""
        batches = {}  # dtype code -> [[(call, seq, entry)], bytes of staging taken]
        fused = []
        for call in calls:
            seq = call.seq
            team = self._prepare(call, seq)
            if team is None:
                continue
            entry = self._fusable(team, call)
            if entry is None:
                self._run(team, seq, self._launch, team, call, call.stream, seq)
                continue
            code, room = entry[0], _round_up(entry[1], 256)
            batch = batches.get(code)
            if batch is None or len(batch[0]) == cuda.MAXFUSE or batch[1] + room > team.slot:
                batch = batches[code] = [[], 0]
                fused.append((code, batch))
            batch[0].append((call, seq, entry))
            batch[1] += room
        team = self._team
        for code, (items, _) in fused:
            call, seq, _ = items[0]
            if len(items) == 1:
                self._run(team, seq, self._launch, team, call, call.stream, seq)
            else:
                self._run(team, seq, self._launch_fused, team, code, items)

    def _fusable(self, team, call):
        """(dtype code as reduced, bytes, send, recv, count, op) of an all-reduce that would go out
        one-shot, else None."""
        if call.kind != "allreduce":
            return None
        try:
            code, count, op = _native_form(call)
        except InvalidUsageError:
            return None  # the general path says why it refuses
        nbytes = count * dtypes.ITEMSIZE[code]
        if self._choose(team, "allreduce", nbytes) != "one-shot":
            return None
        send, recv = addresses(call, self.view.rank)
        return code, nbytes, send, recv, count, op

    def _launch_fused(self, team, code, items):
        """One ar_oneshot_multi launch for the batch, on the first call's stream; the other
        calls' streams are joined before it and wait for it after, as NCCL's groups do."""
        first = items[0][0].stream
        others = list(dict.fromkeys(c.stream for c, _, _ in items if c.stream != first))
        for s in others:
            self._join(s, first)
        entries, offset, total = [], 0, 0
        for call, seq, (_, nbytes, send, recv, count, op) in items:
            entries.append((send, recv, count, offset, op))
            offset += _round_up(nbytes, 256)
            total += nbytes
        self.stats.fused_launches += 1
        self.stats.fused_calls += len(items)
        if self.verbose:
            log.info("COLL", "allreduce #%d-#%d (%d fused) %d B %s one-shot fused via P2P/IPC", items[0][1],
                     items[-1][1], len(items), total, dtypes.name(code))
        fn = self.kernels().reduce(code)["ar_oneshot_multi"]
        team.launcher.launch_fused(fn, self._grid(total), 512, first, entries, self.view.size)
        for s in others:
            self._join(first, s)

    def _join(self, before, after):
        """Stream `after` waits for the work issued so far on stream `before`."""
        event = self._join_event
        if event is None:
            event = self._join_event = cuda.event_create()
        cuda.event_record(event, before)
        cuda.stream_wait_event(after, event)

    # --- the eager fast path ----------------------------------------------------------------------
    def fast_allreduce(self, sendbuf, recvbuf, op, stream):
        """Launch a repeated all-reduce from its packed launch; False (nothing done) when this
        call is not one the general path packed before, which then runs it."""
        t = type(recvbuf)
        if t is self._cupy_type:
            if sendbuf is self._in_place:
                sendbuf = recvbuf
            elif type(sendbuf) is not t:
                return False
            if not (recvbuf._c_contiguous and sendbuf._c_contiguous):
                return False
            rd, sd = recvbuf.data, sendbuf.data
            prep = self._fast.get((rd.ptr, sd.ptr, rd.device_id, sd.device_id, recvbuf.size, sendbuf.size,
                                   recvbuf.dtype, sendbuf.dtype, op))
            if prep is None:
                return False
            if stream is None:
                stream = self._cupy_stream(self.device).ptr
        elif t is self._torch_type:
            if sendbuf is self._in_place:
                sendbuf = recvbuf
            elif type(sendbuf) is not t:
                return False
            if not (recvbuf.is_contiguous() and sendbuf.is_contiguous()):
                return False
            prep = self._fast.get((recvbuf.data_ptr(), sendbuf.data_ptr(), recvbuf.get_device(), sendbuf.get_device(),
                                   recvbuf.numel(), sendbuf.numel(), recvbuf.dtype, sendbuf.dtype, op))
            if prep is None:
                return False
            if stream is None:
                stream = self._torch_stream(self.device)
        else:
            return False
        if type(stream) is not int:
            stream = streams.handle(stream)
        seq = self.host.next_seq()
        self._kinds[seq & 255] = "allreduce"
        self.stats.gpu_fast += 1
        try:
            prep.go(stream, seq)
        except cuda.DeviceTimeout as exc:
            raise self._timeout_error(exc.word) from None
        return True

    def _remember(self, call, prep):
        """Keep the packed launch of an all-reduce made of one staged launch, under the key that
        fast_allreduce computes from the caller's objects (CuPy arrays and torch tensors)."""
        if not self._fast_ok:
            return
        recv, send = call.recv, call.send
        kind = recv.kind
        if kind not in ("cupy", "torch") or send.kind != kind:
            return
        r, s = recv.obj, send.obj
        if kind == "cupy":
            if self._cupy_type is None:
                import cupy

                self._cupy_type = cupy.ndarray
                self._cupy_stream = cupy.cuda.get_current_stream
            key = (r.data.ptr, s.data.ptr, r.data.device_id, s.data.device_id, r.size, s.size, r.dtype, s.dtype,
                   call.op)
        else:
            if self._torch_type is None:
                import torch

                self._torch_type = torch.Tensor
                self._torch_stream = streams.torch_current()
            key = (r.data_ptr(), s.data_ptr(), r.get_device(), s.get_device(), r.numel(), s.numel(), r.dtype,
                   s.dtype, call.op)
        if len(self._fast) >= _FAST_MAX:
            self._fast.clear()
        self._fast[key] = prep
        self.view.fast.gpu = self.fast_allreduce

    def _log(self, call, seq, algo, via="P2P/IPC"):
        """Count the path a call takes (Communicator.stats()) and log it at INFO."""
        self.stats.gpu[algo] += 1
        if self.verbose:
            log.info("COLL", "%s #%d %d B %s%s%s %s via %s", call.kind, seq, call.nbytes, dtypes.name(call.code),
                     f" {call.op.name}" if call.op else "",
                     f" root {call.root}" if call.kind in _ROOTED else "", algo, via)

    def _single(self, call, stream, seq):
        self._log(call, seq, "copy", "local")
        send, recv = addresses(call, self.view.rank)
        if send and recv and send != recv:
            cuda.memcpy_async(recv, send, call.nbytes, stream)

    def _via_host(self, call, stream, seq):
        """No P2P between the GPUs: host collectives on host copies (engines/gpu/staged.py; blocks)."""
        if cuda.stream_is_capturing(stream):  # a graph would replay the copies without the host collective
            raise InvalidUsageError(
                f"{call.kind} on communicator {self.view.name} goes through host memory ({self._team.reason}) and "
                "cannot be captured in a CUDA graph; issue it outside the capture, or give each rank its own GPU "
                "with P2P access")
        chunks = self._staging.chunks(call)
        self._log(call, seq, "host-pipelined" if chunks else "host-staged",
                  f"host memory{f' in {chunks} pinned chunk(s)' if chunks else ''} ({self._team.reason})")
        cuda.set_current(self._ctx)  # the staging's events belong to this communicator's GPU

        def run_host(send, recv, count):
            self.host.submit(Call(call.kind, send, recv, count, call.code, call.op, call.root))

        self._staging.run(call, stream, self.view.rank, run_host)

    def _grid(self, nbytes, registered=False):
        """Thread blocks for a kernel moving nbytes per rank. Through staging a block takes
        _STAGED_BLOCK_BYTES, so a medium message spreads over many SMs; on registered buffers
        (large messages) every SM streams."""
        if registered:
            most = self.maxblocks_registered or min(self._team.sms, 256)
            return max(1, min(most, _cdiv(nbytes, _REGISTERED_BLOCK_BYTES)))
        return max(1, min(self.maxblocks, _cdiv(nbytes, _STAGED_BLOCK_BYTES)))

    def _register(self, team, send, recv):
        """Exchange the IPC handles of every rank's send and receive buffers (collective: one
        fixed-size host all-gather). False, on every rank, when some rank's cannot be shared."""
        row = np.zeros(_REG_ROW, np.uint8)
        ok = True
        for i, ptr in enumerate((send, recv)):
            if not ptr:
                continue
            exported = ipc.export(ptr)
            if exported is None:
                ok = False
                continue
            handle, offset = exported
            base = 8 + i * 72
            row[base:base + 64] = np.frombuffer(handle, np.uint8)
            row[base + 64:base + 72] = np.frombuffer(np.uint64(offset).tobytes(), np.uint8)
            row[1 + i] = 1
        row[0] = ok
        table = np.empty(_REG_ROW * self.view.size, np.uint8)
        self.view.exchange_into(row, table)
        table = table.reshape(self.view.size, _REG_ROW)
        if not table[:, 0].all():
            return False
        r = self.view.rank
        peers = ([], [])
        for q in range(self.view.size):
            for i, own in enumerate((send, recv)):
                if q == r:
                    peers[i].append(own)
                elif table[q, 1 + i]:
                    base = 8 + i * 72
                    offset = int(table[q, base + 64:base + 72].view(np.uint64)[0])
                    owner = self.view.ctx.watch_pid(self.view.world_ranks[q])
                    peers[i].append(ipc.open_memory(table[q, base:base + 64].tobytes(), owner) + offset)
                else:
                    peers[i].append(0)
        team.launcher.set_peer_buffers(*peers)
        self._peers = peers
        return True

    def _copy_engine(self, team, stream, pairs):
        """Barrier kernel, cuMemcpyAsync of (dst, src, nbytes) pairs, barrier kernel: peers'
        buffers are ready before the copies and the copies are done before anyone goes on."""
        barrier = self.kernels().copy()["barrier"]
        L = team.launcher
        L.launch(barrier, 1, 32, stream, 0, 0, 0)
        for dst, src, nbytes in pairs:
            cuda.memcpy_async(dst, src, nbytes, stream)
        L.launch(barrier, 1, 32, stream, 0, 0, 0)

    def _choose(self, team, kind, nbytes, registered_ok=True):
        """The cost table's algorithm (gpucoll/algorithms/selector.py, transport "nvlink") among
        those that can run this call: staged ones up to GPUCOLL_GPU_STAGE_MAX, the one-shot
        all-reduce while the message fits a staging slot (GPUCOLL_GPU_ONESHOT_MAX, when set,
        decides it alone), registered ones on buffers that can be registered."""
        key = (kind, nbytes, registered_ok)
        algo = self._choices.get(key)
        if algo is not None:
            return algo
        available = set()
        if nbytes <= team.stage_max:
            available.add("two-shot" if kind == "allreduce" else "staged")
        if registered_ok and kind not in ("reduce", "gather", "scatter"):
            available.add("registered")
        if kind == "allreduce":
            oneshot_max = config.GPU_ONESHOT_MAX.get()
            fits = nbytes <= team.slot
            if oneshot_max is not None:
                if nbytes <= oneshot_max and fits:
                    available = {"one-shot"}
                else:
                    fits = False
            if fits:
                available.add("one-shot")
        if not available:  # above the staging capacity, registration failed: staged in pieces
            available.add("two-shot" if kind == "allreduce" else "staged")
        algo = selector.select(kind, nbytes, self.view.size, "nvlink", forced=self.forced, available=available)
        if len(self._choices) > 4096:
            self._choices.clear()
        self._choices[key] = algo
        return algo

    def _label(self, kind, algo):
        if algo != "registered":
            return algo
        if kind == "allreduce":
            return "two-shot registered"
        return "registered copy-engine" if self.copy_engine and kind in ("allgather", "bcast") else "registered"

    def _launch(self, team, call, stream, seq):
        kind, n = call.kind, self.view.size
        send, recv = addresses(call, self.view.rank)
        code, count, op = _native_form(call)
        isz = dtypes.ITEMSIZE[code]
        block = count * isz  # the per-rank block (the whole vector for allreduce, bcast, reduce): call.nbytes
        nbytes = call.table_bytes(n)  # the cost table's size: n x block for the per-rank kinds
        distinct = send != recv or kind in ("allreduce", "allgather", "bcast")
        algo = self._choose(team, kind, nbytes, distinct)
        if algo == "registered" and not self._register(team, 0 if kind == "bcast" else send, recv):
            algo = self._choose(team, kind, nbytes, registered_ok=False)  # not shareable (e.g. a pool allocator)
        self._log(call, seq, self._label(kind, algo))
        L = team.launcher
        slot = team.slot
        if kind == "allreduce":
            fns = self.kernels().reduce(code)
            if algo == "one-shot":
                prep = L.prepare(fns["ar_oneshot"], self._grid(nbytes), 256 if nbytes <= (64 << 10) else 512, send,
                                 recv, count, 0, op, 0, n)
                prep.go(stream, seq)
                self._remember(call, prep)
            elif algo == "registered":
                L.launch(fns["ar_registered"], self._grid(nbytes // n, True), 512, stream, send, recv, count, 0,
                         op, 0, n)
            else:
                per = n * (slot // isz)
                fn = fns["ar_twoshot"]
                if count <= per:
                    prep = L.prepare(fn, self._grid(count * isz // n), 512, send, recv, count, 0, op, 0, n)
                    prep.go(stream, seq)
                    self._remember(call, prep)
                    return
                for off in range(0, count, per):
                    c = min(per, count - off)
                    L.launch(fn, self._grid(c * isz // n), 512, stream, send + off * isz, recv + off * isz,
                             c, 0, op, 0, n)
            return
        if kind in ("reduce_scatter", "reduce"):
            fns = self.kernels().reduce(code)
            if algo == "registered":
                L.launch(fns["rs_registered"], self._grid(block, True), 512, stream, send, recv, count, count, op,
                         0, n)
            elif kind == "reduce":
                self._pieces(fns["red_staged"], stream, send, recv, count, isz, slot // isz, 0, op, call.root)
            else:
                self._pieces(fns["rs_staged"], stream, send, recv, count, isz, slot // isz, count, op, 0)
            return
        fns = self.kernels().copy()
        r = self.view.rank
        if algo == "registered":
            if kind == "allgather" and self.copy_engine:
                pairs = [(self._peers[1][p] + r * block, send, block) for p in range(n) if p != r]
                if send != recv + r * block:
                    pairs.append((recv + r * block, send, block))
                self._copy_engine(team, stream, pairs)
            elif kind == "bcast" and self.copy_engine:
                pairs = [(self._peers[1][p], recv, block) for p in range(n) if p != r] if r == call.root else []
                self._copy_engine(team, stream, pairs)
            elif kind == "bcast":
                L.launch(fns["bc_registered"], self._grid(block // max(1, n - 1), True), 512, stream, 0, recv,
                         block, 0, 0, call.root)
            else:  # allgather, alltoall: every rank writes its blocks into the peers' outputs
                L.launch(fns[_REGISTERED_COPY[kind]], self._grid(block, True), 512, stream, send, recv, block,
                         block)
            return
        stride = 0 if kind == "bcast" else block
        self._pieces(fns[_STAGED_COPY[kind]], stream, 0 if kind == "bcast" else send, recv, block, 1, slot, stride, 0,
                     call.root if kind in _ROOTED else 0)

    def _pieces(self, fn, stream, send, recv, count, isz, per, stride, op, root):
        """Launch fn over [0, count) in pieces of at most `per` units (one staging slot each)."""
        L = self._team.launcher
        n = self.view.size
        for off in range(0, count, per):
            c = min(per, count - off)
            L.launch(fn, self._grid(c * isz), 512, stream, send + off * isz if send else 0,
                     recv + off * isz if recv else 0, c, stride, op, root, n)
