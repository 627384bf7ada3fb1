"""MPI.Request, Prequest (persistent) and Grequest (generalized): mpi4py's request API.

A Request is a handle on an operation's state: a gpucoll request (what Isend, Irecv and
the nonblocking collectives return, or a composite of several, gpucoll/mpi/composite.py),
with Wait(status), Test(status) and, for object receives, `_value`. Completing a request
through the handle makes the handle null (MPI.REQUEST_NULL), as in MPI; a persistent request
becomes inactive instead, ready for the next Start(). Every blocking wait has gpucoll's
deadline (GPUCOLL_TIMEOUT).
"""
import time

from ..base import config
from ..base.errors import InvalidUsageError, ProcFailedPendingError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.mpi_constants import INTEGERS as _C
from ..engines.p2p.host import MPIP2PRequest, OwnState, P2PRequest, RequestHandle
from .status import reset

UNDEFINED = _C["UNDEFINED"]
ERR_REQUEST = _C["ERR_REQUEST"]

_REGISTRY = {}  # handle -> state, for Request.fromint


def request_error(message):
    return InvalidUsageError(message, error_class=ERR_REQUEST)


class Request(RequestHandle):
    """A nonblocking operation's handle; Request() is the null request. Its fields (`_s`, the
    state; `_cancelled`) are native (RequestHandle), so that the short paths of point to point
    make handles without a Python call."""

    __slots__ = ()

    def __new__(cls, request=None):
        req = RequestHandle.__new__(cls)
        req._s, req._cancelled = None, False
        if request is not None:
            if not isinstance(request, Request) or not cls._accepts(request):
                raise TypeError(f"{cls.__name__}() takes a {cls.__name__} or None, not {type(request).__name__}")
            req._s, req._cancelled = request._s, request._cancelled
            req._copy_extra(request)
        return req

    @classmethod
    def _accepts(cls, request):
        return True

    def _copy_extra(self, request):
        """What a subclass's handle carries beyond the state (a persistent request's start)."""

    @classmethod
    def _of(cls, state):
        """A handle on a gpucoll request (or composite state); None stays null."""
        req = RequestHandle.__new__(cls)
        req._s = state
        return req

    # --- handle semantics ------------------------------------------------------------------
    def __bool__(self):
        return self._s is not None

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        return _operation(self) is _operation(other)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # a handle (completion nulls it): unhashable, as in mpi4py

    def __lt__(self, other):
        raise TypeError("requests are not ordered")

    __le__ = __gt__ = __ge__ = __lt__

    def __repr__(self):
        return f"<gpucoll.MPI.{type(self).__name__} {'null' if self._s is None else self._s!r}>"

    def __reduce__(self):
        if self._s is not None:
            raise ValueError(f"cannot pickle {self!r}: only MPI.REQUEST_NULL can be pickled")
        return (_null, ()) if self is REQUEST_NULL else (type(self), ())

    @property
    def handle(self):
        if self._s is None:
            return 0
        h = id(_operation(self))
        _REGISTRY[h] = self._s
        return h

    def toint(self):
        return self.handle

    py2f = toint

    @classmethod
    def fromint(cls, value):
        return cls._of(_REGISTRY.get(value))

    f2py = fromhandle = fromint

    # --- completion ------------------------------------------------------------------------
    def _complete(self, status):
        """Finish the operation (it is done or waited for): fill status, release the handle,
        return the received object (object receives) or None."""
        state = self._s
        if status is not None:
            reset(status)
        try:
            state.Wait(status)
        except ProcFailedPendingError:
            raise   # ULFM: a receive from ANY_SOURCE is still posted; the handle stays
        except BaseException:
            self._release()
            raise
        self._release()
        if self._cancelled and status is not None and hasattr(status, "cancelled"):
            status.cancelled = True
        return getattr(state, "_value", None)

    def _release(self):
        if _REGISTRY:  # only handles that were asked for (.handle) are registered
            _REGISTRY.pop(id(_operation(self)), None)
        self._s = None

    def _done(self):
        return self._s is None or self._s.Test(None)

    def _active(self):
        """Not null, and (persistent requests) started: what Waitany and friends wait for."""
        return self._s is not None and self._s is not _INACTIVE

    def Wait(self, status=None):
        """Wait for the operation; True. The handle becomes null."""
        if self._s is None:
            if status is not None:
                reset(status)
            return True
        self._complete(status)
        return True

    def wait(self, status=None):
        """Wait; the received object of an object receive (irecv), else None."""
        if self._s is None:
            if status is not None:
                reset(status)
            return None
        return self._complete(status)

    def Test(self, status=None):
        if self._s is None:
            if status is not None:
                reset(status)
            return True
        if not self._s.Test(None):
            return False
        self._complete(status)
        return True

    def test(self, status=None):
        if self._s is None:
            if status is not None:
                reset(status)
            return True, None
        if not self._s.Test(None):
            return False, None
        return True, self._complete(status)

    def Get_status(self, status=None):
        """Whether the operation is done, without completing it (the handle stays)."""
        if self._s is None:
            if status is not None:
                reset(status)
            return True
        if not self._s.Test(None):
            return False
        if status is not None:
            reset(status)
            self._s.Test(status)
            if self._cancelled and hasattr(status, "cancelled"):
                status.cancelled = True
        return True

    get_status = Get_status

    def Cancel(self):
        """Cancel a receive that no message matched yet (its status then says cancelled); sends
        are eager in gpucoll and always complete, which MPI allows."""
        if self._s is None:
            raise request_error("Cancel: the request is MPI.REQUEST_NULL")
        cancel = getattr(self._s, "_mpi_cancel", None) or _cancel_receive
        if cancel(self._s):
            self._cancelled = True

    cancel = Cancel

    def Free(self):
        """Release the handle; the operation itself still completes."""
        if self._s is None:
            raise request_error("Free: the request is MPI.REQUEST_NULL")
        self._release()

    def free(self):
        """Free unless null."""
        if self._s is not None:
            self.Free()

    # --- arrays of requests ----------------------------------------------------------------
    @staticmethod
    def Waitany(requests, status=None):
        """Index of a request that completed (waiting for one); UNDEFINED when all are null."""
        requests = handles(requests)
        return _waitany(requests, status)[0]

    @staticmethod
    def waitany(requests, status=None):
        requests = handles(requests)
        return _waitany(requests, status)

    @staticmethod
    def Testany(requests, status=None):
        requests = handles(requests)
        index, flag, _ = _testany(requests, status)
        return index, flag

    @staticmethod
    def testany(requests, status=None):
        requests = handles(requests)
        return _testany(requests, status)

    @staticmethod
    def Get_status_any(requests, status=None):
        requests = handles(requests)
        for i, req in enumerate(requests):
            if req._active() and req.Get_status(status):
                return i, True
        if not any(r._active() for r in requests):
            if status is not None:
                reset(status)
            return UNDEFINED, True
        return UNDEFINED, False

    get_status_any = Get_status_any

    @staticmethod
    def Waitall(requests, statuses=None):
        # a window of point-to-point requests with no statuses asked for: waited for, settled and
        # nulled in one native call (anything else, or an error, takes _waitall)
        if statuses is None and not _REGISTRY and type(requests) in (list, tuple) \
                and P2PRequest._wait_handles(requests, Request):
            return True
        requests = handles(requests)
        _waitall(requests, statuses)
        return True

    @staticmethod
    def waitall(requests, statuses=None):
        requests = handles(requests)
        return _waitall(requests, statuses)

    @staticmethod
    def Testall(requests, statuses=None):
        requests = handles(requests)
        return Request.testall(requests, statuses)[0]

    @staticmethod
    def testall(requests, statuses=None):
        requests = handles(requests)
        slots = _status_slots(statuses, len(requests))
        if not all(req._done() for req in requests):
            return False, None
        return True, _waitall(requests, statuses, slots)

    @staticmethod
    def Get_status_all(requests, statuses=None):
        requests = handles(requests)
        slots = _status_slots(statuses, len(requests))
        if not all(req._done() for req in requests):
            return False
        for i, req in enumerate(requests):
            req.Get_status(slots[i] if i < len(slots) else None)
        return True

    get_status_all = Get_status_all

    @staticmethod
    def Waitsome(requests, statuses=None):
        requests = handles(requests)
        return _some(requests, statuses, block=True)[0]

    @staticmethod
    def waitsome(requests, statuses=None):
        requests = handles(requests)
        return _some(requests, statuses, block=True)

    @staticmethod
    def Testsome(requests, statuses=None):
        requests = handles(requests)
        return _some(requests, statuses, block=False)[0]

    @staticmethod
    def testsome(requests, statuses=None):
        requests = handles(requests)
        return _some(requests, statuses, block=False)

    @staticmethod
    def Get_status_some(requests, statuses=None):
        requests = handles(requests)
        if not any(r._active() for r in requests):
            return None
        done = [i for i, req in enumerate(requests) if req._active() and req._s.Test(None)]
        slots = statuses if isinstance(statuses, list) else []
        for k, i in enumerate(done):
            if k < len(slots):
                requests[i].Get_status(slots[k])
        return done

    get_status_some = Get_status_some

    @staticmethod
    def Startall(requests):
        for req in requests:
            req.Start()

    def Start(self):
        raise request_error("Start: only persistent requests (Prequest) can be started")


def _operation(handle):
    """What a handle is a handle on: its state, or the request itself where a request is its own
    handle (P2PHandle; its `_s` is a view made on each read); None when null."""
    state = handle._s
    return state.request if type(state) is OwnState else state


class P2PHandle(MPIP2PRequest, Request):
    """A request of gpucoll.MPI's short paths (Isend, Irecv of a plain buffer): the engine's
    request and its MPI.Request in one object, so that a message costs one request on either
    API. Completing it nulls it in place (MPIP2PRequest, native); the handle code above reads its
    `_s` as a state through a view (OwnState)."""

    __slots__ = ()

    _s = property(MPIP2PRequest._state, RequestHandle._s.__set__,
                  doc="the state as the handle code reads it: None once null, else a view of this request")

    # MPI's meaning of what gpucoll's own request (P2PRequest) also names
    Get_status = Request.Get_status
    Cancel = Request.Cancel
    Free = Request.Free
    Waitall = Request.__dict__["Waitall"]
    Testall = Request.__dict__["Testall"]
    Waitany = Request.__dict__["Waitany"]
    waitall = Request.__dict__["waitall"]

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        return _operation(self) is _operation(other)

    __hash__ = None

    def __repr__(self):
        return f"<gpucoll.MPI.Request {'null' if self._s is None else P2PRequest.__repr__(self)}>"


def handles(requests):
    """The requests as MPI.Request handles: gpucoll's own requests (what gpucoll.COMM_WORLD's Isend
    returns) are wrapped, MPI handles are used as they are (so that completing them nulls them)."""
    return [r if isinstance(r, Request) else Request._of(r if r else None) for r in requests]  # a null one stays null


def _names(requests):
    return ", ".join(sorted({getattr(r._s, "name", None) or "request" for r in requests if r._active()}))


def _cancel_receive(state):
    """Withdraw a posted receive of gpucoll's point to point; True when it was still unmatched."""
    p2p = getattr(state, "_p2p", None)
    if p2p is None or not hasattr(p2p, "withdraw") or state.Test(None):
        return False
    return p2p.withdraw(state.request if type(state) is OwnState else state)


def _deadline(what, requests):
    timeout = config.TIMEOUT.get()
    return time.monotonic() + timeout, timeout


def _poll_sleep(delay):
    time.sleep(delay)
    return min(delay * 2, 0.001)


def _waitany(requests, status):
    if not any(r._active() for r in requests):
        if status is not None:
            reset(status)
        return UNDEFINED, None
    deadline, timeout = _deadline("Waitany", requests)
    delay = 0.00002
    while True:
        for i, req in enumerate(requests):
            if req._active() and req._s.Test(None):
                return i, req._complete(status)
        if time.monotonic() > deadline:
            raise GpucollTimeout(f"Waitany: none of {sum(r._active() for r in requests)} requests "
                                 f"({_names(requests)}) completed within {timeout:g} s (GPUCOLL_TIMEOUT)")
        delay = _poll_sleep(delay)


def _testany(requests, status):
    if not any(r._active() for r in requests):
        if status is not None:
            reset(status)
        return UNDEFINED, True, None
    for i, req in enumerate(requests):
        if req._active() and req._s.Test(None):
            return i, True, req._complete(status)
    return UNDEFINED, False, None


def _status_slots(statuses, n):
    """The statuses to fill, one per request: a list is extended with new Status objects."""
    if statuses is None:
        return ()
    if isinstance(statuses, list) and len(statuses) < n:
        from .status import Status

        statuses.extend(Status() for _ in range(n - len(statuses)))
    return statuses


def _wait_together(requests):
    """One wait in native code for a window of point-to-point requests (as gpucoll's
    Request.Waitall): their rendezvous copies run back to back, and each handle is then
    completed without waiting. A timeout raises as the first unfinished one's Wait would.
    Returns the states it waited for, or None where it did not."""
    states = [req._s for req in requests if req._active()]
    if len(states) > 1:
        kind = type(states[0])
        wait_all = getattr(kind, "_wait_all", None)
        if wait_all is not None and all(type(state) is kind for state in states):
            wait_all(states, config.TIMEOUT.get())
            return states
    return None


def _settle_together(requests, states):
    """Complete the handles whose states one native wait finished, when nothing else is asked
    (no statuses): each state settled in native code, each handle nulled; their values. None
    where each handle must complete on its own: a null, persistent or cancelled one, handles
    asked for by number, an error (raised there, after the others complete)."""
    if _REGISTRY or len(states) != len(requests) \
            or any(type(req) is not Request or req._cancelled for req in requests):
        return None
    try:
        for state in states:
            state.Wait(None)
    except Exception:
        return None
    for req in requests:
        req._s = None
    return [getattr(state, "_value", None) for state in states]


def _waitall(requests, statuses, slots=None):
    states = _wait_together(requests)
    slots = _status_slots(statuses, len(requests)) if slots is None else slots
    if states is not None and not slots:
        values = _settle_together(requests, states)
        if values is not None:
            return values
    values, first_error = [], None
    for i, req in enumerate(requests):
        try:
            values.append(req.wait(slots[i] if i < len(slots) else None))
        except Exception as exc:  # the others still complete; the first error is raised after
            values.append(None)
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    return values


def _some(requests, statuses, block):
    if not any(r._active() for r in requests):
        return None, None
    deadline, timeout = _deadline("Waitsome", requests)
    delay = 0.00002
    while True:
        done = [i for i, req in enumerate(requests) if req._active() and req._s.Test(None)]
        if done or not block:
            break
        if time.monotonic() > deadline:
            raise GpucollTimeout(f"Waitsome: none of {sum(r._active() for r in requests)} requests "
                                 f"({_names(requests)}) completed within {timeout:g} s (GPUCOLL_TIMEOUT)")
        delay = _poll_sleep(delay)
    slots = statuses if isinstance(statuses, list) else []
    if len(slots) < len(done) and isinstance(statuses, list):
        _status_slots(statuses, len(done))
    values = [requests[i].wait(slots[k] if k < len(slots) else None) for k, i in enumerate(done)]
    return done, values


class Prequest(Request):
    """A persistent request: Start() begins the operation again, Wait() leaves it inactive."""

    __slots__ = ("_start", "_started")

    def __new__(cls, request=None):
        req = super().__new__(cls, request)
        if request is None:
            req._start, req._started = None, False
        return req

    @classmethod
    def _accepts(cls, request):
        return isinstance(request, Prequest) or request._s is None

    def _copy_extra(self, request):
        self._start = getattr(request, "_start", None)
        self._started = getattr(request, "_started", False)

    @classmethod
    def _persistent(cls, start):
        req = RequestHandle.__new__(cls)
        req._s, req._cancelled, req._start, req._started = _INACTIVE, False, start, False
        return req

    def Start(self):
        if self._s is None:
            raise request_error("Start: the request is MPI.REQUEST_NULL")
        if self._started:
            raise request_error("Start: the persistent request is already active; Wait for it first")
        self._s = self._start()._s
        self._started = True

    def _release(self):
        if self._start is None:
            super()._release()
            return
        self._s, self._started = _INACTIVE, False

    def Free(self):
        if self._s is None:
            raise request_error("Free: the request is MPI.REQUEST_NULL")
        self._s, self._start = None, None

    # --- partitioned requests (partitioned.py) --------------------------------------------------
    def _part(self, what):
        state = self._s
        if state is None or state is _INACTIVE or not hasattr(state, "parrived"):
            raise request_error(f"{what}: the request is not an active partitioned one (Psend_init or "
                                "Precv_init, then Start)")
        return state

    def Pready(self, partition):
        """Mark a partition of a partitioned send ready to go."""
        self._part("Pready").pready([partition])

    def Pready_range(self, partition_low, partition_high):
        self._part("Pready_range").pready(range(partition_low, partition_high + 1))

    def Pready_list(self, partitions):
        self._part("Pready_list").pready(list(partitions))

    def Parrived(self, partition):
        """Whether a partition of a partitioned receive has arrived."""
        return self._part("Parrived").parrived(partition)


class _Inactive:
    """The state of a persistent request between operations: complete, with an empty status."""

    _value = None

    def Wait(self, status=None):
        return True

    def Test(self, status=None):
        return True

    def __repr__(self):
        return "inactive"


_INACTIVE = _Inactive()


class _GrequestState:
    """A generalized request: complete when the program calls Complete(). Its callbacks' errors
    are raised as MPI.Exception (an MPI error as it is, anything else as ERR_OTHER, with the
    traceback printed), as mpi4py does."""

    def __init__(self, query_fn, free_fn, cancel_fn, args, kwargs):
        self.query_fn, self.free_fn, self.cancel_fn = query_fn, free_fn, cancel_fn
        self.args, self.kwargs = tuple(args or ()), dict(kwargs or {})
        self.completed = False
        self._value = None

    def _call(self, fn, *args):
        from .attributes import _callback

        return _callback(fn, *args, *self.args, **self.kwargs)

    def Test(self, status=None):
        if not self.completed:
            return False
        if status is not None and self.query_fn is not None:
            self._call(self.query_fn, status)
        return True

    def Wait(self, status=None):
        deadline, timeout = _deadline("Wait", ())
        delay = 0.00002
        while not self.completed:
            if time.monotonic() > deadline:
                raise GpucollTimeout(f"Wait: the generalized request was not completed within {timeout:g} s "
                                     "(GPUCOLL_TIMEOUT)")
            delay = _poll_sleep(delay)
        try:
            if self.query_fn is not None:  # called even without a status, as MPI_Wait does
                from .status import Status

                self._call(self.query_fn, status if status is not None else Status())
        finally:
            if self.free_fn is not None:
                self._call(self.free_fn)
        return True

    def _mpi_cancel(self, state):
        if self.cancel_fn is not None:
            self._call(self.cancel_fn, self.completed)
        return False


class Grequest(Request):
    """A generalized request (Grequest.Start(query_fn, free_fn, cancel_fn, args, kwargs))."""

    __slots__ = ()

    @classmethod
    def _accepts(cls, request):
        return isinstance(request, Grequest) or request._s is None

    @classmethod
    def Start(cls, query_fn=None, free_fn=None, cancel_fn=None, args=None, kwargs=None):
        return cls._of(_GrequestState(query_fn, free_fn, cancel_fn, args, kwargs))

    def Complete(self):
        if self._s is None:
            raise request_error("Complete: the request is MPI.REQUEST_NULL")
        self._s.completed = True

    def complete(self, obj=None):
        """Complete, with obj as what wait()/test() return."""
        self.Complete()
        self._s._value = obj


REQUEST_NULL = Request()


def _null():
    return REQUEST_NULL
