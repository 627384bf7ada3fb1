"""From a validated GPU call to kernel launches: algorithm, grid, registration, fallbacks.

One GpuDispatcher per communicator (made by gpucoll.dispatch.Dispatcher on the first GPU
call). Small and medium messages go through the IPC staging buffers of the communicator's
Team (one launch per slot-sized piece); messages above GPUCOLL_GPU_STAGE_MAX register the
caller's buffers and move data directly between them (all-reduce, reduce-scatter,
all-gather, broadcast, all-to-all). Without P2P (or with GPUCOLL_P2P_DISABLE=1) the call
copies to host memory and runs the host collective. Every launch goes on the caller's
stream; nothing here waits for the GPU except that host fallback.
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


def _cdiv(a, b):
    return -(-a // b)


class GpuDispatcher:
    def __init__(self, comm, host):
        self.comm, self.host = comm, host
        self.device = config.DEVICE.get()
        self.forced = config.ALGO.get()
        self.maxblocks = min(config.GPU_BLOCKS.get() or 64, 256)
        self._ctx = None
        self._team = None
        self._kernels = None
        self._last_stream = None
        self._order_event = None

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

    def _order(self, stream):
        """Keep this communicator's operations in issue order when callers switch streams."""
        from .._native import cuda

        last = self._last_stream
        self._last_stream = stream
        if last is None or cuda.stream_is_capturing(stream) or cuda.stream_is_capturing(last):
            return
        if self._order_event is None:
            self._order_event = cuda.event_create()
        cuda.event_record(self._order_event, last)
        cuda.stream_wait_event(stream, self._order_event)

    # --- execution ------------------------------------------------------------------------------
    def execute(self, call, seq):
        from .._native import cuda

        buf = self._check(call)
        if self._ctx is None:
            self._ctx = cuda.primary_context(self.device)
        else:
            cuda.set_current(self._ctx)
        stream = streams.resolve(call.stream, buf)
        call.stream = stream
        if stream != self._last_stream:
            self._order(stream)
        if call.count == 0:
            return
        if self.comm.size == 1:
            self._single(call, stream, seq)
            return
        team = self.team()
        if not team.ok:
            self._via_host(call, stream, seq)
            return
        self._launch(team, call, stream, seq)

    def _log(self, call, seq, nbytes, algo, via="P2P/IPC"):
        if log.enabled("info", "COLL"):
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

    def _grid(self, nbytes, per_block):
        return max(1, min(self.maxblocks, _cdiv(nbytes, per_block)))

    def _register(self, team, send, recv):
        """Exchange the IPC handles of every rank's send and receive buffers (collective).
        False, on every rank, when some rank's buffers cannot be shared."""
        mine = (team.export(send) if send else None, team.export(recv) if recv else None)
        ok = (not send or mine[0] is not None) and (not recv or mine[1] is not None)
        table = self.comm.allgather((ok, mine))
        if not all(row[0] for row in table):
            return False
        r = self.comm.rank
        psend = [send if q == r else (team.import_(row[1][0]) if row[1][0] else 0) for q, row in enumerate(table)]
        precv = [recv if q == r else (team.import_(row[1][1]) if row[1][1] else 0) for q, row in enumerate(table)]
        team.launcher.set_peer_buffers(psend, precv)
        return True

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
                L.launch(fns["ar_oneshot"], self._grid(nbytes, 16 << 10), 256 if nbytes <= (64 << 10) else 512,
                         stream, send, recv, count, 0, op, 0, n)
                return
            if nbytes > team.stage_max and self._register(team, send, recv):
                self._log(call, seq, nbytes, "two-shot direct")
                L.launch(fns["ar_direct"], self._grid(nbytes // n, 64 << 10), 512, stream, send, recv, count, 0,
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
                L.launch(fns["rs_direct"], self._grid(nbytes, 64 << 10), 512, stream, send, recv, count, count, op,
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
                self._log(call, seq, block * n, "direct")
                L.launch(fns["ag_direct"], self._grid(block, 64 << 10), 512, stream, send, recv, block, block)
                return
            self._log(call, seq, block * n, "staged")
            self._pieces(fns["ag_staged"], stream, send, recv, block, 1, slot, block, 0, 0)
        elif kind == "bcast":
            if block > team.stage_max and self._register(team, 0, recv):
                self._log(call, seq, block, "direct")
                L.launch(fns["bc_direct"], self._grid(block // max(1, n - 1), 64 << 10), 512, stream, 0, recv,
                         block, 0, 0, call.root)
                return
            self._log(call, seq, block, "staged")
            self._pieces(fns["bc_staged"], stream, 0, recv, block, 1, slot, 0, 0, call.root)
        elif kind == "alltoall":
            if block * n > team.stage_max and send != recv and self._register(team, send, recv):
                self._log(call, seq, block * n, "direct")
                L.launch(fns["a2a_direct"], self._grid(block, 64 << 10), 512, stream, send, recv, block, block)
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
