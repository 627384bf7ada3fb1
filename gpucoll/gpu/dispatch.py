"""From a validated GPU call to kernel launches: algorithm, grid, registration, fallbacks.

One GpuDispatcher per communicator (made by gpucoll.dispatch.Dispatcher on the first GPU
call). Small and medium messages go through the IPC staging buffers of the communicator's
Team (one launch per slot-sized piece); messages above GPUCOLL_GPU_STAGE_MAX register the
caller's buffers and move data directly between them (all-reduce, reduce-scatter,
all-gather, broadcast, all-to-all). Without P2P (or with GPUCOLL_P2P_DISABLE=1) the call
copies to host memory and runs the host collective. Every launch goes on the caller's
stream; nothing here waits for the GPU except that host fallback. As with NCCL, a caller
that switches streams between operations of one communicator orders them itself (for
example s2.wait_stream(s1)): operations of a communicator must not run concurrently.
"""
import numpy as np

from .. import config, dtypes, log
from .. import ops as _ops
from ..errors import InvalidUsageError
from . import streams

_BOOL_OPS = {_ops.SUM.code: _ops.BOR.code, _ops.MAX.code: _ops.BOR.code, _ops.BOR.code: _ops.BOR.code,
             _ops.AVG.code: _ops.BOR.code, _ops.PROD.code: _ops.BAND.code, _ops.MIN.code: _ops.BAND.code,
             _ops.BAND.code: _ops.BAND.code, _ops.BXOR.code: _ops.BXOR.code}
_COMPLEX = {dtypes.COMPLEX64: dtypes.FLOAT32, dtypes.COMPLEX128: dtypes.FLOAT64}
_ROOTED = ("bcast", "reduce", "gather", "scatter")
_REG_ROW = 8 + 2 * 72  # ok, has-send, has-recv, pad; then (IPC handle, offset) of send and recv


def _cdiv(a, b):
    return -(-a // b)


class GpuDispatcher:
    def __init__(self, comm, host):
        self.comm, self.host = comm, host
        self.device = config.DEVICE.get()
        self.forced = config.ALGO.get()
        self.maxblocks = min(config.GPU_BLOCKS.get() or 64, 256)          # kernels through staging
        self.maxblocks_direct = min(config.GPU_BLOCKS.get() or 128, 256)  # kernels on registered buffers
        self.copy_engine = config.GPU_COPY.get() == "ce"
        self.verbose = log.enabled("info", "COLL")
        self._ctx = None
        self._team = None
        self._kernels = None

    # --- resources ---------------------------------------------------------------------------
    def team(self):
        if self._team is None:
            from .team import Team

            self._team = Team(self.comm, self.device)
        return self._team

    def kernels(self):
        if self._kernels is None:
            from .kernels import Kernels

            self._kernels = Kernels(self.team().arch)
        return self._kernels

    def close(self):
        if self._team is not None:
            self._team.close()
            self._team = None

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
                raise InvalidUsageError(
                    f"{call.kind}: {name} is on GPU {buf.device} but this rank uses GPU {self.device} "
                    "(GPUCOLL_DEVICE; gpurun gives local rank k GPU k): allocate it on that device")
            first = first or buf
        return first

    # --- execution ------------------------------------------------------------------------------
    def execute(self, call, seq):
        from .._native import cuda

        buf = self._check(call)
        if self._ctx is None:
            self._ctx = cuda.primary_context(self.device)
        stream = streams.resolve(call.stream, buf)
        call.stream = stream
        if self.host.checks and self.comm.size > 1:
            self.host._cross_check(call, seq)  # GPUCOLL_DEBUG_CHECKS: same signature on every rank
        if call.count == 0:
            return
        if self.comm.size == 1:
            cuda.set_current(self._ctx)
            self._single(call, stream, seq)
            return
        team = self.team()
        if not team.ok:
            self._via_host(call, stream, seq)
            return
        self._launch(team, call, stream, seq)

    def _log(self, call, seq, nbytes, algo, via="P2P/IPC"):
        if self.verbose:
            log.info("COLL", "%s #%d %d B %s%s%s %s via %s", call.kind, seq, nbytes, dtypes.name(call.code),
                     f" {call.op.name}" if call.op else "",
                     f" root {call.root}" if call.kind in _ROOTED else "", algo, via)

    def _single(self, call, stream, seq):
        from .._native import cuda

        nbytes = call.count * dtypes.ITEMSIZE[call.code]
        self._log(call, seq, nbytes, "copy", "local")
        send, recv = self.host._buffers(call)
        if send and recv and send != recv:
            cuda.memcpy_async(recv, send, nbytes, stream)

    def _via_host(self, call, stream, seq):
        """No P2P: copy to host memory, run the host collective, copy back (blocks)."""
        from .._native import cuda
        from ..buffers import HostBuffer
        from ..dispatch import Call

        self._log(call, seq, call.count * dtypes.ITEMSIZE[call.code], "host-staged",
                  f"host memory ({self._team.reason})")
        cuda.stream_synchronize(stream)
        npdt = dtypes.numpy_dtype(call.code)

        def to_host(buf):
            arr = np.empty(buf.count, npdt)
            if buf.count:
                cuda.memcpy_dtoh(arr.__array_interface__["data"][0], buf.addr, arr.nbytes)
            return HostBuffer(arr, call.code)

        hrecv = to_host(call.recv) if call.recv is not None else None
        if call.send is None:
            hsend = None
        elif call.send is call.recv or (call.recv is not None and call.send.addr == call.recv.addr):
            hsend = hrecv
        else:
            hsend = to_host(call.send)
        hcall = Call(self.host, call.kind, hsend, hrecv, call.count, call.code, call.op, call.root)
        self.comm._engine.run(hcall.run)
        if hrecv is not None and hrecv.count:
            cuda.memcpy_htod(call.recv.addr, hrecv.addr, hrecv.array.nbytes)

    def _grid(self, nbytes, per_block, direct=False):
        return max(1, min(self.maxblocks_direct if direct else self.maxblocks, _cdiv(nbytes, per_block)))

    def _register(self, team, send, recv):
        """Exchange the IPC handles of every rank's send and receive buffers (collective: one
        fixed-size host all-gather). False, on every rank, when some rank's cannot be shared."""
        row = np.zeros(_REG_ROW, np.uint8)
        ok = True
        for i, ptr in enumerate((send, recv)):
            if not ptr:
                continue
            exported = team.export(ptr)
            if exported is None:
                ok = False
                continue
            handle, offset = exported
            base = 8 + i * 72
            row[base:base + 64] = np.frombuffer(handle, np.uint8)
            row[base + 64:base + 72] = np.frombuffer(np.uint64(offset).tobytes(), np.uint8)
            row[1 + i] = 1
        row[0] = ok
        table = np.empty(_REG_ROW * self.comm.size, np.uint8)
        self.comm.Allgather(row, table)
        table = table.reshape(self.comm.size, _REG_ROW)
        if not table[:, 0].all():
            return False
        r = self.comm.rank
        peers = ([], [])
        for q in range(self.comm.size):
            for i, own in enumerate((send, recv)):
                if q == r:
                    peers[i].append(own)
                elif table[q, 1 + i]:
                    base = 8 + i * 72
                    offset = int(table[q, base + 64:base + 72].view(np.uint64)[0])
                    peers[i].append(team.import_((table[q, base:base + 64].tobytes(), offset)))
                else:
                    peers[i].append(0)
        team.launcher.set_peer_buffers(*peers)
        self._peers = peers
        return True

    def _copy_engine(self, team, stream, pairs):
        """Barrier kernel, cuMemcpyAsync of (dst, src, nbytes) pairs, barrier kernel: peers'
        buffers are ready before the copies and the copies are done before anyone goes on."""
        from .._native import cuda

        barrier = self.kernels().copy()["barrier"]
        L = team.launcher
        L.launch(barrier, 1, 32, stream, 0, 0, 0)
        for dst, src, nbytes in pairs:
            cuda.memcpy_async(dst, src, nbytes, stream)
        L.launch(barrier, 1, 32, stream, 0, 0, 0)

    def _launch(self, team, call, stream, seq):
        kind, n = call.kind, self.comm.size
        send, recv = self.host._buffers(call)
        code, count = call.code, call.count
        op = call.op.code if call.op is not None else 0
        if code == dtypes.BOOL:
            code, op = dtypes.UINT8, _BOOL_OPS[op]
        elif code in _COMPLEX:
            if kind in ("allreduce", "reduce", "reduce_scatter") and op not in (_ops.SUM.code, _ops.AVG.code):
                raise InvalidUsageError(f"{call.op.name} on complex GPU buffers is not supported; use SUM or AVG")
            code, count = _COMPLEX[code], count * 2
        isz = dtypes.ITEMSIZE[code]
        L = team.launcher
        slot = team.slot
        if kind == "allreduce":
            nbytes = count * isz
            fns = self.kernels().reduce(code)
            forced = self.forced
            if (nbytes <= team.oneshot_max and forced != "two-shot") or (forced == "one-shot" and nbytes <= slot):
                self._log(call, seq, nbytes, "one-shot")
                L.launch(fns["ar_oneshot"], max(1, min(32, _cdiv(nbytes, 8 << 10))), 256 if nbytes <= (64 << 10) else 512,
                         stream, send, recv, count, 0, op, 0, n)
                return
            if nbytes > team.stage_max and self._register(team, send, recv):
                self._log(call, seq, nbytes, "two-shot direct")
                L.launch(fns["ar_direct"], self._grid(nbytes // n, 64 << 10, True), 512, stream, send, recv, count, 0,
                         op, 0, n)
                return
            self._log(call, seq, nbytes, "two-shot")
            per = n * (slot // isz)
            fn = fns["ar_twoshot"]
            for off in range(0, count, per):
                c = min(per, count - off)
                L.launch(fn, self._grid(c * isz // n, 32 << 10), 512, stream, send + off * isz, recv + off * isz,
                         c, 0, op, 0, n)
            return
        if kind == "reduce_scatter":
            fns = self.kernels().reduce(code)
            nbytes = count * isz
            if nbytes * n > team.stage_max and send != recv and self._register(team, send, recv):
                self._log(call, seq, nbytes * n, "direct")
                L.launch(fns["rs_direct"], self._grid(nbytes, 64 << 10, True), 512, stream, send, recv, count, count, op,
                         0, n)
                return
            self._log(call, seq, nbytes * n, "staged")
            self._pieces(fns["rs_staged"], stream, send, recv, count, isz, slot // isz, count, op, 0)
            return
        if kind == "reduce":
            fns = self.kernels().reduce(code)
            self._log(call, seq, count * isz, "staged")
            self._pieces(fns["red_staged"], stream, send, recv, count, isz, slot // isz, 0, op, call.root)
            return
        fns = self.kernels().copy()
        block = call.count * dtypes.ITEMSIZE[call.code]
        if kind == "allgather":
            if block * n > team.stage_max and self._register(team, send, recv):
                if self.copy_engine:
                    self._log(call, seq, block * n, "direct copy-engine")
                    r = self.comm.rank
                    pairs = [(self._peers[1][p] + r * block, send, block) for p in range(n) if p != r]
                    if send != recv + r * block:
                        pairs.append((recv + r * block, send, block))
                    self._copy_engine(team, stream, pairs)
                    return
                self._log(call, seq, block * n, "direct")
                L.launch(fns["ag_direct"], self._grid(block, 64 << 10, True), 512, stream, send, recv, block, block)
                return
            self._log(call, seq, block * n, "staged")
            self._pieces(fns["ag_staged"], stream, send, recv, block, 1, slot, block, 0, 0)
        elif kind == "bcast":
            if block > team.stage_max and self._register(team, 0, recv):
                if self.copy_engine:
                    self._log(call, seq, block, "direct copy-engine")
                    r = self.comm.rank
                    pairs = [(self._peers[1][p], recv, block) for p in range(n) if p != r] if r == call.root else []
                    self._copy_engine(team, stream, pairs)
                    return
                self._log(call, seq, block, "direct")
                L.launch(fns["bc_direct"], self._grid(block // max(1, n - 1), 64 << 10, True), 512, stream, 0, recv,
                         block, 0, 0, call.root)
                return
            self._log(call, seq, block, "staged")
            self._pieces(fns["bc_staged"], stream, 0, recv, block, 1, slot, 0, 0, call.root)
        elif kind == "alltoall":
            if block * n > team.stage_max and send != recv and self._register(team, send, recv):
                self._log(call, seq, block * n, "direct")
                L.launch(fns["a2a_direct"], self._grid(block, 64 << 10, True), 512, stream, send, recv, block, block)
                return
            self._log(call, seq, block * n, "staged")
            self._pieces(fns["a2a_staged"], stream, send, recv, block, 1, slot, block, 0, 0)
        elif kind == "gather":
            self._log(call, seq, block * n, "staged")
            self._pieces(fns["ga_staged"], stream, send, recv, block, 1, slot, block, 0, call.root)
        elif kind == "scatter":
            self._log(call, seq, block * n, "staged")
            self._pieces(fns["sc_staged"], stream, send, recv, block, 1, slot, block, 0, call.root)
        else:
            raise InvalidUsageError(f"{kind} is not a GPU collective")

    def _pieces(self, fn, stream, send, recv, count, isz, per, stride, op, root):
        """Launch fn over [0, count) in pieces of at most `per` units (one staging slot each)."""
        L = self._team.launcher
        n = self.comm.size
        for off in range(0, count, per):
            c = min(per, count - off)
            L.launch(fn, self._grid(c * isz, 64 << 10), 512, stream, send + off * isz if send else 0,
                     recv + off * isz if recv else 0, c, stride, op, root, n)
