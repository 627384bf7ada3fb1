"""gpucoll-bench on GPU buffers: CuPy arrays, CUDA-event timing, CUDA graphs, NCCL and torch beside.

Used when CuPy and a GPU are present (-g/--gpu, the default there). Local rank k uses GPU k
(modulo the count). The input and the check are the host
runner's (runner.Case), copied to and from the GPU around the timed calls.

Timing: -w warm-up calls, the buffers refilled (fresh input, cleared output), a barrier, then
-n calls launched eagerly from Python on one stream between two CUDA events, or with -G N the
same call captured N times in one CUDA graph and the graph replayed (time per call = elapsed /
calls, the slowest rank's); with --group K, K calls go out in one group (gpucoll's
`with comm.group()`, NCCL's groupStart/groupEnd) and time per call = elapsed / calls. The
check reads the output those timed calls left. The peers run
in the same job, on the same stream and buffers' sizes, right after gpucoll's rows:

    nccl    NCCL through cupy.cuda.nccl; the unique id travels by gpucoll's own bcast. CuPy
            does not bind ncclCommRegister, and NCCL registers only VMM (cuMem) allocations
            by default, so NCCL copies through its own buffers; gpucoll registers the caller's
            buffers above GPUCOLL_GPU_STAGE_MAX (its `registered` algorithms). For a comparison
            on equal terms at large sizes run with GPUCOLL_ALGO=two-shot (all-reduce) or
            staged, and GPUCOLL_GPU_STAGE_MAX at least the largest size: the table's
            preamble and the JSON list these settings.
    torch   torch.distributed's nccl backend (its TCPStore on a free port that rank 0 picks;
            gpurun's MASTER_ADDR/MASTER_PORT point at gpucoll's store, not a torch one),
            with the benchmark's stream made torch's current stream once, at set-up

    gpucoll-bench -np 2 -b 8 -e 512M -f 4 --vs nccl
    gpucoll-bench -np 2 -b 8 -e 64K -f 8 -G 100 --vs nccl
"""
import contextlib
import functools
import os

import numpy as np

from ..base import config
from . import runner, table, torch_peer

# NVLink multicast stays off in everything a GPU run starts (NCCL, torch, NVSHMEM); the
# table's preamble and the JSON show these settings.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def multicast_off():
    """Set MULTICAST_OFF in this process's environment (the job's ranks inherit it); a value
    the caller set already is kept, and shown."""
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)


def available():
    """True when CuPy imports and the CUDA driver sees a GPU (checked without importing CuPy first)."""
    try:
        from .._native import cuda

        if not cuda.available():
            return False
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


def device():
    """One GPU per rank: local rank k uses GPU k, modulo the count."""
    import cupy as cp

    return (config.LOCAL_RANK.get() or 0) % cp.cuda.runtime.getDeviceCount()


class GpuCase:
    """runner.Case's buffers on the GPU: the host case computes the input and the expected
    result; send and recv are CuPy arrays (bcast: one array)."""

    def __init__(self, collective, count, dtype, redop, root, rank, nranks):
        import cupy as cp

        self.cp = cp
        self.host = runner.Case(collective, count, dtype, redop, root, rank, nranks)
        self.collective, self.count = collective, count
        self.send = cp.asarray(self.host.send)
        self.recv = self.send if self.host.recv is self.host.send else cp.asarray(self.host.recv)
        cp.cuda.Device().synchronize()

    def fill(self):
        self.host.fill()
        self.send.set(self.host.send)
        if self.recv is not self.send:
            self.recv.set(self.host.recv)
        self.cp.cuda.Device().synchronize()

    def wrong(self, calls=1):
        """runner.Case.wrong on a host copy of recv (after the device finished)."""
        self.cp.cuda.Device().synchronize()
        self.host.recv[...] = self.recv.get()
        return self.host.wrong(calls)


class _GpuTiming:
    """CUDA-event timing and CUDA-graph capture, shared by gpucoll's GPU backend and the peers.
    Subclasses set self.stream (a cupy Stream), self.graphs (0: eager) and self.group (calls
    per group, 0: none) and give group_of_calls() (a context manager) where they can group."""

    make_case = GpuCase

    def time_per_call(self, call, plan, refill):
        """(seconds per call, timed calls): warm-up, refill() (it synchronizes the device),
        then the timed calls between two events on self.stream."""
        cp = self.cp
        s = self.stream
        iters = plan.iters
        if self.group:
            call, iters = self._grouped(call), max(1, -(-plan.iters // self.group))
        for _ in range(plan.warmup):
            call()
        s.synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        if self.graphs:
            try:
                with s:
                    s.begin_capture()
                    try:
                        for _ in range(self.graphs):
                            call()
                    finally:
                        graph = s.end_capture()
            except Exception as exc:  # the peer's row shows n/a
                raise runner.Unsupported(f"{self.name}: capture in a CUDA graph failed: {exc}") from None
            graph.launch(s)
            s.synchronize()
            refill()
            self.barrier()
            reps = max(1, -(-plan.iters // self.graphs))
            start.record(s)
            for _ in range(reps):
                graph.launch(s)
            end.record(s)
            end.synchronize()
            calls = reps * self.graphs
        else:
            refill()
            self.barrier()
            start.record(s)
            for _ in range(iters):
                call()
            end.record(s)
            end.synchronize()
            calls = iters * max(1, self.group)
        return cp.cuda.get_elapsed_time(start, end) * 1e-3 / calls, calls

    def _grouped(self, call):
        """self.group calls of `call` in one group: the unit a timed iteration issues."""
        group_of_calls, k = getattr(self, "group_of_calls", None), self.group
        if group_of_calls is None:
            raise runner.Unsupported(f"{self.name}: gpucoll-bench cannot group its calls")

        def grouped():
            with group_of_calls():
                for _ in range(k):
                    call()
        return grouped

    def _setup_gpu(self, graphs, group=0):
        import cupy as cp

        self.cp = cp
        self.device = device()
        cp.cuda.Device(self.device).use()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.graphs, self.group = graphs, group

    def device_name(self):
        props = self.cp.cuda.runtime.getDeviceProperties(self.device)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def ranks_info(self):
        info = dict(runner.here(), rank=self.rank, device=self.device,
                    bus=self.cp.cuda.Device(self.device).pci_bus_id, gpu=self.device_name())
        return self.comm.allgather(info)


class GpucollGpuBackend(_GpuTiming, runner.GpucollBackend):
    """gpucoll's collectives on CuPy arrays, on the benchmark's stream (stream= as a raw handle)."""

    def __init__(self, comm=None, graphs=0, group=0):
        runner.GpucollBackend.__init__(self, comm)
        self._setup_gpu(graphs, group)

    def group_of_calls(self):
        return self.comm.group()

    def prepare(self, collective, send, recv, redop, root):
        c, op, sp = self.comm, self._ops[redop], self.stream.ptr
        if collective == "allreduce":
            return functools.partial(c.Allreduce, send, recv, op, sp)
        if collective == "reduce_scatter":
            return functools.partial(c.Reduce_scatter_block, send, recv, op, sp)
        if collective == "allgather":
            return functools.partial(c.Allgather, send, recv, sp)
        if collective == "alltoall":
            return functools.partial(c.Alltoall, send, recv, sp)
        if collective == "bcast":
            return functools.partial(c.Bcast, send, root, sp)
        raise runner.Unsupported(f"gpucoll-bench does not measure {collective}")


class _HostChannel:
    """barrier / reduce_max / reduce_sum of a peer backend, over gpucoll's host collectives
    (the peer's own collectives are what is being measured)."""

    def _host(self, comm):
        self._g = runner.GpucollBackend(comm)
        self.comm = self._g.comm
        self.rank, self.size = self._g.rank, self._g.size

    def barrier(self):
        self._g.barrier()

    def reduce_max(self, value):
        return self._g.reduce_max(value)

    def reduce_sum(self, value):
        return self._g.reduce_sum(value)


class NcclBackend(_GpuTiming, _HostChannel):
    """NCCL through cupy.cuda.nccl on the same ranks; the unique id goes out by gpucoll's bcast."""

    name = "nccl"

    def __init__(self, comm=None, graphs=0, group=0):
        from cupy.cuda import nccl

        self._host(comm)
        self._setup_gpu(graphs, group)
        self.nccl = nccl
        uid = None
        if self.rank == 0:  # bytes in CuPy 14, a tuple of (signed) chars before
            uid = nccl.get_unique_id()
            uid = bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes(b & 0xff for b in uid)
        uid = self.comm.bcast(uid)
        try:
            self.ncomm = nccl.NcclCommunicator(self.size, uid, self.rank)
        except TypeError:
            self.ncomm = nccl.NcclCommunicator(self.size, tuple(b if b < 128 else b - 256 for b in uid), self.rank)
        n = nccl
        self._types = {np.dtype(k): getattr(n, v) for k, v in (
            ("int8", "NCCL_INT8"), ("uint8", "NCCL_UINT8"), ("int32", "NCCL_INT32"), ("uint32", "NCCL_UINT32"),
            ("int64", "NCCL_INT64"), ("uint64", "NCCL_UINT64"), ("float16", "NCCL_FLOAT16"),
            ("float32", "NCCL_FLOAT32"), ("float64", "NCCL_FLOAT64"))}
        self._ops = {k: getattr(n, v) for k, v in (("sum", "NCCL_SUM"), ("prod", "NCCL_PROD"), ("max", "NCCL_MAX"),
                                                    ("min", "NCCL_MIN"), ("avg", "NCCL_AVG")) if hasattr(n, v)}

    @contextlib.contextmanager
    def group_of_calls(self):
        self.nccl.groupStart()
        try:
            yield
        finally:
            self.nccl.groupEnd()

    @staticmethod
    def version():
        from cupy.cuda import nccl

        v = nccl.get_version()
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"

    def prepare(self, collective, send, recv, redop, root):
        t = self._types.get(send.dtype)
        if t is None:
            raise runner.Unsupported(f"NCCL does not reduce or move {send.dtype}")
        nc, sp, s, r = self.ncomm, self.stream.ptr, send.data.ptr, recv.data.ptr
        if collective == "reduce":
            raise runner.Unsupported("gpucoll-bench does not measure NCCL's reduce")
        if collective in table.REDUCING:
            if redop not in self._ops:
                raise runner.Unsupported(f"this NCCL has no {redop} reduction")
            op = self._ops[redop]
            if collective == "allreduce":
                return functools.partial(nc.allReduce, s, r, recv.size, t, op, sp)
            return functools.partial(nc.reduceScatter, s, r, recv.size, t, op, sp)
        if collective == "allgather":
            return functools.partial(nc.allGather, s, r, send.size, t, sp)
        if collective == "bcast":
            return functools.partial(nc.bcast, r, recv.size, t, root, sp)
        raise runner.Unsupported(f"NCCL through CuPy has no {collective}")

    def close(self):
        self.ncomm.destroy()


class TorchNcclBackend(_GpuTiming, _HostChannel):
    """torch.distributed's nccl backend on torch views of the CuPy buffers (torch_peer.py), on the
    same stream."""

    name = "torch"

    def __init__(self, comm=None, graphs=0, group=0):
        import torch

        from .peers import _free_port

        self._host(comm)
        self._setup_gpu(graphs, group)
        self.torch = torch
        torch.cuda.set_device(self.device)
        device = torch.device("cuda", self.device)
        port = self.comm.bcast(_free_port() if self.rank == 0 else None)
        self.peer = torch_peer.TorchPeer("nccl", device, init_method=f"tcp://127.0.0.1:{port}", rank=self.rank,
                                         world_size=self.size, device_id=device)
        # The benchmark's stream becomes torch's current stream once, here: every call (and the
        # in-place all-reduce's input copy) is issued on it without a context switch per call.
        self.tstream = torch.cuda.ExternalStream(self.stream.ptr, device=device)
        self._previous_stream = torch.cuda.current_stream(self.device)
        torch.cuda.set_stream(self.tstream)

    def prepare(self, collective, send, recv, redop, root):
        return self.peer.prepare(collective, send, recv, redop, root)

    def close(self):
        self.peer.close()
        self.torch.cuda.set_stream(self._previous_stream)


PEERS = {"nccl": NcclBackend, "torch": TorchNcclBackend}


def peer_label(peer):
    if peer == "nccl":
        return f"NCCL {NcclBackend.version()} through cupy.cuda.nccl, same job and stream"
    if peer == "torch":
        return f"{torch_peer.label('nccl')}, same job and stream"
    return peer
