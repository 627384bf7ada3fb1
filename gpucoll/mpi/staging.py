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

from . import message as _m
from .composite import Composite
from .hostcopy import HostStage, _cuda_loaded, device_buffer  # noqa: F401 - device_buffer: also staging's


def staged(name, specs, start, blocking):
    """start(*host_specs): each (spec, writable, label) of specs through a HostStage (a GPU buffer
    replaced by a host copy, copied back when writable); a blocking call's results are back on the
    GPU when it returns (with what start returned), a nonblocking one's (start returns its
    request) when that completes."""
    what = name.capitalize()
    stage = HostStage()
    with stage.reading():  # an MPI.BOTTOM specification beside a GPU array: its GPU blocks too
        state = start(*[stage.spec(spec, writable, f"{what} {label}") for spec, writable, label in specs])
    return _finished(stage, state, blocking, name)


def _finished(stage, state, blocking, name):
    """What the call returns once its stage is set: the results copied back now (blocking: what
    the call returned), or when its request completes."""
    if blocking:
        stage.finish()
        return state
    return Composite([state] if state is not None else [], stage.finish, f"I{name}")


def _at_bottom(spec):
    """Whether a message specification addresses its blocks from MPI.BOTTOM (or a None buffer)."""
    return isinstance(spec, (list, tuple)) and len(spec) > 1 and (spec[0] is None or spec[0] is _m.BOTTOM)


def through_host(run):
    """For a method run(self, sendbuf, recvbuf, ..., blocking, ...) that returns its started
    request (or None once done): GPU buffers in sendbuf or recvbuf go through a HostStage, and so
    do the blocks of an MPI.BOTTOM specification that address GPU memory (staged as the call reads
    them: message.at_address)."""
    blocking_at = list(inspect.signature(run).parameters).index("blocking")
    name = run.__name__.strip("_")

    @functools.wraps(run)
    def staged_run(self, sendbuf, recvbuf, *args, **kwargs):
        what = name.capitalize()
        gpu = device_buffer(sendbuf, what) is not None or device_buffer(recvbuf, what) is not None
        bottom = not gpu and (_at_bottom(sendbuf) or _at_bottom(recvbuf)) and _cuda_loaded()
        if not (gpu or bottom):
            return run(self, sendbuf, recvbuf, *args, **kwargs)
        blocking = kwargs["blocking"] if "blocking" in kwargs else args[blocking_at - 3]
        if gpu:
            return staged(name, [(sendbuf, False, "sendbuf"), (recvbuf, True, "recvbuf")],
                          lambda send, recv: run(self, send, recv, *args, **kwargs), blocking)
        stage = HostStage()
        with stage.reading():
            state = run(self, sendbuf, recvbuf, *args, **kwargs)
        return _finished(stage, state, blocking, name)
    return staged_run
