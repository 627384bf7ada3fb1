"""Requests of nonblocking GPU collectives, backed by a CUDA event recorded after the launch.

Wait() and a Test() that finds the event done also look at the communicator's error word: a
kernel that gave up waiting for a peer surfaces there as gpucoll.TimeoutError.
"""
import time

from ..._native import cuda
from ...base.errors import InvalidUsageError
from ...base.request import Request
from . import streams


class _EventFlag:
    """Stands in for the threading.Event of a host Request: set once the CUDA event is done."""

    __slots__ = ("event", "done")

    def __init__(self, event):
        self.event, self.done = event, False

    def is_set(self):
        if not self.done and self.event is not None:
            self.done = cuda.event_query(self.event)
        return self.done

    def wait(self, timeout=None):
        if self.event is None:
            raise InvalidUsageError("this request belongs to an operation issued inside comm.group(), which goes "
                                    "out when the group ends: wait for it after the with block")
        if timeout is None:
            cuda.event_synchronize(self.event)
            self.done = True
            return True
        deadline = time.monotonic() + timeout
        while not self.is_set():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0)
        return True

    def set(self):
        self.done = True


class GpuRequest(Request):
    """`Wait()` blocks the host until the operation is done on the GPU; `Wait(stream=s)` only
    makes stream `s` wait for it (nothing blocks); `Test()` asks without blocking."""

    __slots__ = ("_event", "_gpu")

    def __init__(self, name, stream, gpu=None):
        super().__init__(name)
        self._gpu = gpu  # the GpuEngine, for its error word
        self._event = None
        self._done = _EventFlag(None)
        if stream is not None:  # else (an operation of a group) record() once it is issued
            self.record(stream)

    def record(self, stream):
        """Tie the request to the work issued so far on `stream`."""
        self._event = cuda.event_create()
        cuda.event_record(self._event, stream)
        self._done = _EventFlag(self._event)

    def Wait(self, status=None, stream=None):
        if stream is not None:
            if self._event is None:
                self._done.wait()  # raises: issued inside a group that has not ended
            cuda.stream_wait_event(streams.handle(stream), self._event)
            return True
        self._done.wait()
        if self._gpu is not None:
            self._gpu.check_error()
        return True

    def Test(self, status=None):
        if not self._done.is_set():
            return False
        if self._gpu is not None:
            self._gpu.check_error()
        return True

    def wait(self, status=None, stream=None):
        self.Wait(status, stream)
        return None

    def __del__(self):
        try:
            if self._event is not None:
                cuda.event_destroy(self._event)
        except Exception:
            pass
