"""GPU buffers of the calls gpucoll has no device path for (the vector collectives, Alltoallw, the
neighbourhood collectives, Reduce_scatter with counts, Scan, Exscan, and reductions with an op
the GPU path lacks: LAND, LOR, LXOR, MINLOC, MAXLOC, REPLACE, NO_OP, user ops), run through host memory as a
CUDA-aware MPI stages them: each GPU buffer of the call's message specifications is copied into host memory, the host
path runs the call, and the buffers it writes are copied back when it completes (a blocking call
before it returns, a nonblocking one when its request completes).

The device is synchronized before the copy out (the caller's kernels on any stream have written
the buffer, as MPI asks of a CUDA-aware program) and after the copy back (the results are in
place when the call or its request completes).
"""
import functools
import inspect

import numpy as np

from ..base import dtypes as _dtypes
from . import message as _m
from .composite import Composite


def device_buffer(spec, what):
    """The GpuBuffer of a message specification's buffer (bare or its first item), or None."""
    buf = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    if buf is None or buf is _m.BOTTOM or _m.is_in_place(buf):
        return None
    return _m._gpu_buffer(buf, what)


def _sync(device):
    import cupy

    with cupy.cuda.Device(device):
        cupy.cuda.runtime.deviceSynchronize()


def _copy(dst, src, nbytes, device):
    import cupy

    with cupy.cuda.Device(device):
        cupy.cuda.runtime.memcpy(dst, src, nbytes, cupy.cuda.runtime.memcpyDefault)


class HostStage:
    """The host copies of one call's GPU buffers and what goes back to the GPU at the end."""

    def __init__(self):
        self.back = []  # (GpuBuffer, host array)

    def spec(self, spec, writable, what):
        """spec with its GPU buffer replaced by a host copy of the same dtype (counts,
        displacements and datatypes stay as given); host specs as they are."""
        gpu = device_buffer(spec, what)
        if gpu is None:
            return spec
        host = np.empty(gpu.count, _dtypes.numpy_dtype(gpu.code))
        _sync(gpu.device)
        _copy(host.ctypes.data, gpu.addr, gpu.nbytes, gpu.device)
        if writable:
            self.back.append((gpu, host))
        if isinstance(spec, (list, tuple)):
            return type(spec)((host,) + tuple(spec[1:]))
        return host

    def finish(self):
        """The host results into the GPU buffers they stand for."""
        for gpu, host in self.back:
            _copy(gpu.addr, host.ctypes.data, gpu.nbytes, gpu.device)
        for device in {gpu.device for gpu, _ in self.back}:
            _sync(device)


def staged(name, specs, start, blocking):
    """start(*host_specs): each (spec, writable, label) of specs through a HostStage (a GPU buffer
    replaced by a host copy, copied back when writable); a blocking call's results are back on the
    GPU when it returns, a nonblocking one's (start returns its request) when that completes."""
    what = name.capitalize()
    stage = HostStage()
    state = start(*[stage.spec(spec, writable, f"{what} {label}") for spec, writable, label in specs])
    if blocking:
        stage.finish()
        return None
    return Composite([state] if state is not None else [], stage.finish, f"I{name}")


def through_host(run):
    """For a method run(self, sendbuf, recvbuf, ..., blocking, ...) that returns its started
    request (or None once done): GPU buffers in sendbuf or recvbuf go through a HostStage."""
    blocking_at = list(inspect.signature(run).parameters).index("blocking")
    name = run.__name__.strip("_")

    @functools.wraps(run)
    def staged_run(self, sendbuf, recvbuf, *args, **kwargs):
        what = name.capitalize()
        if device_buffer(sendbuf, what) is None and device_buffer(recvbuf, what) is None:
            return run(self, sendbuf, recvbuf, *args, **kwargs)
        blocking = kwargs["blocking"] if "blocking" in kwargs else args[blocking_at - 3]
        return staged(name, [(sendbuf, False, "sendbuf"), (recvbuf, True, "recvbuf")],
                      lambda send, recv: run(self, send, recv, *args, **kwargs), blocking)
    return staged_run
