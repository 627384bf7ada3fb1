"""Operations that gpucoll.MPI builds from several of gpucoll's own: the state behind their requests.

A composite is issued at once (every part is started in the caller's thread, in call order, so
ranks agree on the order of operations) and finishes in whichever thread waits on it or tests
it: once all its parts are done, its `finish` step runs exactly once (unpacking, a local
reduction, copying a block out). Its parts are gpucoll requests; their errors are re-raised.
"""
import threading

from ..base.request import CompletedRequest

VCOLL_TAG = -1101  # point-to-point messages of gpucoll.MPI's composite collectives (below user tags)
# ... and of the vector collectives that the direct group declined within a host: they are
# posted in the communicator's call order (its ordered queue), while the others are posted as
# they are called, so the two must never match each other's messages
VDIRECT_TAG = -1102


class Composite:
    """Parts (gpucoll requests) plus a step to run when they are all done."""

    __slots__ = ("parts", "finish", "name", "status_part", "_lock", "_finished", "_error", "_value")

    def __init__(self, parts, finish=None, name="composite", status_part=None):
        self.parts, self.finish, self.name = list(parts), finish, name
        self.status_part = status_part  # the receive whose status Wait(status) and Test(status) report
        self._lock = threading.Lock()
        self._finished = False
        self._error = None
        self._value = None

    def _run_finish(self):
        with self._lock:
            if self._finished:
                return
            try:
                if self.finish is not None:
                    self._value = self.finish()
            except BaseException as exc:  # raised to every waiter, not only the first
                self._error = exc
            self._finished = True

    def Test(self, status=None):
        if not self._finished:
            if not all(p.Test(None) for p in self.parts):
                return False
            self._run_finish()
        if self._error is not None:
            raise self._error
        if status is not None and self.status_part is not None:
            self.status_part.Test(status)
        return True

    def Wait(self, status=None):
        if not self._finished:
            first = None
            for p in self.parts:
                try:
                    p.Wait(status if p is self.status_part else None)
                except BaseException as exc:  # wait for the rest: their buffers are in use
                    first = first or exc
            if first is not None:
                raise first
            self._run_finish()
        elif status is not None and self.status_part is not None:
            self.status_part.Test(status)
        if self._error is not None:
            raise self._error
        return True

    def __repr__(self):
        return f"{self.name} {'done' if self._finished else 'pending'}"


def done(value=None, name="completed"):
    """An operation with nothing left to do (zero bytes, PROC_NULL, a communicator of one)."""
    return CompletedRequest(name, value)
