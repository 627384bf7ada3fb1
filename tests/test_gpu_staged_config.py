"""GPU calls through host memory read GPUCOLL_GPU_HOST_CHUNK once, when their communicator's
staging is made, not on every call (gpucoll/engines/gpu/staged.py). No GPU needed: how a call is cut
is decided before any copy."""
from gpucoll.base import dtypes
from gpucoll.base.call import Call
from gpucoll.engines.gpu.staged import HostStaging


def test_the_chunk_size_is_read_once_when_the_staging_is_made(monkeypatch):
    monkeypatch.setenv("GPUCOLL_GPU_HOST_CHUNK", "64K")
    staging = HostStaging()
    call = Call("allreduce", None, None, 100_000, dtypes.FLOAT32, None, 0)   # 400000 B
    assert staging.chunk_bytes == 64 << 10
    assert staging.chunks(call) == 7                  # 16384 floats a chunk
    monkeypatch.setenv("GPUCOLL_GPU_HOST_CHUNK", "0")
    assert staging.chunks(call) == 7                  # what it read when made
    assert HostStaging().chunks(call) == 0            # a new one reads the new value: whole
    assert staging.chunks(Call("allgather", None, None, 100_000, dtypes.FLOAT32, None, 0)) == 0
