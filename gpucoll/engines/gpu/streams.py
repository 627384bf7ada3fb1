"""Stream arguments: a CuPy stream, a torch stream, or a raw cudaStream_t handle (int).

The default is the caller's current stream of the buffer's library: torch's for torch
tensors, CuPy's otherwise (0, the legacy default stream, when neither says otherwise).
"""
from ...base.errors import InvalidUsageError

_torch_raw = None


def handle(stream):
    """The cudaStream_t of a stream object or an int."""
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "ptr", None)          # cupy.cuda.Stream / ExternalStream
    if ptr is not None:
        return int(ptr)
    raw = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if raw is not None:
        return int(raw)
    raise InvalidUsageError(f"stream={stream!r} is not a CUDA stream: pass a CuPy or torch stream or a "
                            "cudaStream_t handle (int)")


def torch_current():
    """torch's cheapest lookup of a device's current stream: f(device) -> cudaStream_t."""
    global _torch_raw
    if _torch_raw is None:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _torch_raw = raw if raw is not None else (lambda dev: torch.cuda.current_stream(dev).cuda_stream)
    return _torch_raw


def current(buf):
    """The caller's current stream for buffer `buf` (a GpuBuffer)."""
    if buf.kind == "torch":
        return torch_current()(buf.device)
    import cupy

    return cupy.cuda.get_current_stream(buf.device).ptr


def resolve(stream, buf):
    return current(buf) if stream is None else handle(stream)
