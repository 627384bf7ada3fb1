"""Requests: handles of nonblocking operations (mpi4py's Request shape), and the Status of a receive."""
import abc
import threading
import time

from . import config
from .errors import TimeoutError as GpucollTimeout


_UNDEFINED = -32766  # gpucoll.UNDEFINED (comm.py imports this module)


class Status:
    """Source, tag and size of a received message (mpi4py's Status)."""

    def __init__(self):
        self.source = -1  # ANY_SOURCE
        self.tag = -1     # ANY_TAG
        self.nbytes = 0

    def Get_source(self):
        return self.source

    def Get_tag(self):
        return self.tag

    def Get_count(self, datatype=None):
        size = 1 if datatype is None else datatype.Get_size()
        return self.nbytes // size

    def Get_elements(self, datatype=None):
        return self.Get_count(datatype)


class Request(metaclass=abc.ABCMeta):
    """Completion handle of a nonblocking operation.

    `Wait()` blocks until it is done and re-raises its error; `Test()` says whether it is
    done without blocking. `wait()`/`test()` (lowercase) also return the received object
    of object methods such as `irecv`.

    `Request()` with no name is mpi4py's null request (`MPI.REQUEST_NULL`): false, already
    complete, and ignored by `Waitany`. Point-to-point requests are native (registered as
    Requests: gpucoll/engines/p2p/host.py) and share the methods below that do not touch the fields."""

    __slots__ = ("_done", "_error", "_value", "name")

    def __init__(self, name=None):
        self._done = threading.Event()
        self._error = None
        self._value = None
        self.name = name
        if name is None:
            self._done.set()

    def __bool__(self):
        return self.name is not None

    # --- completion, called by the engine -------------------------------------
    def _finish(self, value=None, error=None):
        self._value, self._error = value, error
        self._done.set()

    def _fill(self, status):
        """Copy what is known about the finished operation into the caller's Status
        (receives override this; other operations leave the status as it is)."""

    # --- mpi4py API --------------------------------------------------------------
    def Wait(self, status=None):
        self._done.wait()
        if status is not None:
            self._fill(status)
        if self._error is not None:
            raise self._error
        return True

    def Test(self, status=None):
        if not self._done.is_set():
            return False
        if status is not None:
            self._fill(status)
        if self._error is not None:
            raise self._error
        return True

    def wait(self, status=None):
        self.Wait(status)
        return self._value

    def test(self, status=None):
        return (True, self._value) if self.Test(status) else (False, None)

    def Get_status(self):
        return self._done.is_set()

    def Cancel(self):
        raise NotImplementedError("cancelling a started gpucoll operation is not supported")

    def Free(self):
        pass

    @staticmethod
    def Waitall(requests, statuses=None):
        """Wait for every request; `statuses` (a list as long as `requests`) gets each one's status."""
        wait_all = getattr(type(requests[0]), "_wait_all", None) if requests else None
        # point to point: one wait in native code, and with no statuses asked for, each request
        # settled there too; anything it leaves (an error to raise, a status to fill) is Wait's
        if wait_all is not None and wait_all(requests, -1.0, statuses is None):
            return True
        for i, req in enumerate(requests):
            req.Wait(statuses[i] if statuses is not None else None)
        return True

    @staticmethod
    def Testall(requests, statuses=None):
        if not all([req._done.is_set() for req in requests]):
            return False
        for i, req in enumerate(requests):
            req.Test(statuses[i] if statuses is not None else None)
        return True

    @staticmethod
    def Waitany(requests, status=None):
        """Index of a completed request (blocks until one is done); UNDEFINED when there is
        none to wait for, as in MPI."""
        requests = [(i, req) for i, req in enumerate(requests) if req]
        if not requests:
            return _UNDEFINED
        timeout = config.TIMEOUT.get()
        deadline = time.monotonic() + timeout
        wait_any = getattr(type(requests[0][1]), "_wait_any", None)  # one wait in native code (point to point)
        if wait_any is not None and all(type(req) is type(requests[0][1]) for _, req in requests):
            n = wait_any([req for _, req in requests], timeout)
            if n >= 0:
                requests[n][1].Wait(status)
                return requests[n][0]
        while True:
            for n, (i, req) in enumerate(requests):
                if req._done.wait(0 if n else 0.0005):
                    req.Wait(status)
                    return i
            if time.monotonic() > deadline:
                names = ", ".join(sorted({req.name for _, req in requests}))
                raise GpucollTimeout(f"Waitany: none of {len(requests)} requests ({names}) completed within "
                                     f"{timeout:g} s (GPUCOLL_TIMEOUT)")

    @staticmethod
    def waitall(requests, statuses=None):
        return [req.wait(statuses[i] if statuses is not None else None) for i, req in enumerate(requests)]

    def __repr__(self):
        if self.name is None:
            return "<Request null>"
        return f"<Request {self.name} {'done' if self._done.is_set() else 'pending'}>"


class CompletedRequest(Request):
    """A request that finished at creation (e.g. an operation on zero bytes)."""

    __slots__ = ()

    def __init__(self, name="completed", value=None):
        super().__init__(name)
        self._finish(value)
