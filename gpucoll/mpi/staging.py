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

from .composite import Composite
from .hostcopy import HostStage, device_buffer  # noqa: F401 - device_buffer: also staging's, for its users


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
