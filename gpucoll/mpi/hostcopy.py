"""Which memory is a GPU's, and host copies of GPU buffers: gpu_buffer_of (gpucoll's GpuBuffer of a
buffer object whose memory is on a GPU), device_buffer (the same for a message specification) and
HostStage (a call's GPU buffers replaced by host copies, what it wrote copied back). A leaf of
gpucoll.MPI's buffers: the message layer (message.py), Datatype.Pack/Unpack, MPI-IO and the staged
calls (staging.py) build on it."""
import contextlib
import ctypes
import os
import sys
import threading

import numpy as np

from .._native.exporter import AddressConstant
from ..api.comm import IN_PLACE
from ..base import dtypes as _dtypes
from ..calls.buffers import maybe_gpu_buffer


def _is_device_pointer(ptr):
    """Whether CUDA (when this process has it) knows ptr as device memory."""
    try:
        from .._native import cuda
    except ImportError:
        return False
    if not cuda.available():
        return False
    try:
        cuda.pointer_device(ptr)
        return True
    except Exception:  # CUDA does not know this pointer: it is ordinary host memory
        return False


_CUDA_LOADED = False
# The libraries that allocate device memory for Python programs: until one is imported, no address
# a program hands over is device memory (asking CUDA would cost a CPU-only program its start-up).
_GPU_LIBRARIES = ("cupy", "torch", "numba", "jax", "pycuda", "cuda", "tensorflow")


def _cuda_loaded():
    """Whether this process has CUDA's driver loaded (then an address may be device memory)."""
    global _CUDA_LOADED
    if not _CUDA_LOADED and any(name in sys.modules for name in _GPU_LIBRARIES):
        try:
            ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)  # loaded already, or not: never loads it
            _CUDA_LOADED = True
        except OSError:
            pass
    return _CUDA_LOADED


def gpu_buffer_of(obj, what):
    """gpucoll's GpuBuffer when obj's memory is on a GPU; None for host memory (NumPy, the buffer
    protocol, CPU DLPack tensors, interfaces over memory CUDA does not know)."""
    if isinstance(obj, (np.ndarray, bytes, bytearray, memoryview)):
        return None
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        data = cai.get("data")
        ptr = data[0] if isinstance(data, tuple) and data and isinstance(data[0], int) else 0
        if not (ptr and _is_device_pointer(ptr)):
            return None
        from ..calls.gpu_buffers import _from_cai

        return maybe_gpu_buffer(obj, what) or _from_cai(obj, what)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        from .dlpack import device_of, read

        if device_of(obj)[0] == 1:  # kDLCPU
            return None
        if not _is_device_pointer(read(obj, False).address):
            return None  # memory CUDA does not know (no CUDA in this process): host memory
        return maybe_gpu_buffer(obj, what)
    return maybe_gpu_buffer(obj, what)


def device_buffer(spec, what):
    """The GpuBuffer of a message specification's buffer (bare or its first item), or None."""
    buf = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    if buf is None or buf is IN_PLACE or isinstance(buf, AddressConstant):  # MPI.BOTTOM and the like
        return None
    return gpu_buffer_of(buf, what)


def _cuda():
    from .._native import cuda  # only where GPU memory was found: CUDA is loaded then

    return cuda


def _sync(device):
    import cupy

    with cupy.cuda.Device(device):
        cupy.cuda.runtime.deviceSynchronize()


def _copy(dst, src, nbytes, device):
    import cupy

    with cupy.cuda.Device(device):
        cupy.cuda.runtime.memcpy(dst, src, nbytes, cupy.cuda.runtime.memcpyDefault)


_active = threading.local()  # .stage: the HostStage of the call this thread is reading, if any


def active_stage():
    """The HostStage that MPI.BOTTOM blocks addressing GPU memory are staged through, or None."""
    return getattr(_active, "stage", None)


class HostStage:
    """The host copies of one call's GPU buffers and what goes back to the GPU at the end."""

    def __init__(self):
        self.back = []       # (device address, bytes, device, host array): copied back at finish()
        self.runs_back = []  # (device address, host copy, positions, lengths, device): MPI.BOTTOM blocks

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
            self.back.append((gpu.addr, gpu.nbytes, gpu.device, host))
        if isinstance(spec, (list, tuple)):
            return type(spec)((host,) + tuple(spec[1:]))
        return host

    def block(self, lo, nbytes, positions, lengths, writable):
        """A host copy (uint8, nbytes) of the GPU memory from address lo that one block of an
        MPI.BOTTOM message covers: the runs (positions from lo, lengths) of its bytes are copied
        in, and copied back when writable; the bytes between them (holes of its datatype, other
        arrays) are neither read nor written."""
        host = np.empty(nbytes, np.uint8)  # pages the runs do not touch are never made
        device = _cuda().pointer_device(lo)
        _sync(device)
        base = host.ctypes.data
        for position, length in zip(positions.tolist(), lengths.tolist()):
            _copy(base + position, lo + position, length, device)
        if writable:
            self.runs_back.append((lo, host, positions, lengths, device))
        return host

    @contextlib.contextmanager
    def reading(self):
        """While the call reads its message specifications: MPI.BOTTOM blocks that address GPU
        memory are staged here (message.at_address asks active_stage())."""
        outer = active_stage()
        _active.stage = self
        try:
            yield self
        finally:
            _active.stage = outer

    def finish(self):
        """The host results into the GPU memory they stand for."""
        for address, nbytes, device, host in self.back:
            _copy(address, host.ctypes.data, nbytes, device)
        for lo, host, positions, lengths, device in self.runs_back:
            base = host.ctypes.data
            for position, length in zip(positions.tolist(), lengths.tolist()):
                _copy(lo + position, base + position, length, device)
        for device in {entry[2] for entry in self.back} | {entry[4] for entry in self.runs_back}:
            _sync(device)
