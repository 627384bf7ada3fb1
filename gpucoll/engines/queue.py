"""Ordered execution of one communicator's collectives.

Collectives must run in the order the caller issued them (every rank issues them in
the same order). Blocking calls run inline in the caller's thread when nothing is
queued, for the lowest latency; nonblocking calls, and blocking calls issued while
nonblocking ones are pending, go to one worker thread that runs them in order. The
native loops release the GIL, so queued operations overlap with the caller's work.
"""
import collections
import threading

from .._native.direct import CallGate
from ..base.request import Request


class OrderedQueue:
    def __init__(self, name):
        self._name = name
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._queue = collections.deque()
        # busy / queued / the sequence numbers: native, so that the inline paths claim and
        # release a call without a lock or a Python call (see CallGate).
        self.gate = CallGate(self._wake)
        self.enter = self.gate.enter
        self.leave = self.gate.leave
        self._worker = None
        self._closed = False
        self._current = None  # the request the worker is running

    # enter(): claim the engine for one operation run inline by the caller, when nothing is
    # queued or running: True (then call leave() when it is done), else False (nothing claimed;
    # queue the operation with submit() to keep the order). leave(): end it, waking the worker
    # if something is queued. Both are the gate's, bound in __init__.

    def _wake(self):
        with self._cv:
            self._cv.notify_all()

    def run(self, task):
        """Run task() now, in order after anything pending; return its result."""
        if not self.enter():
            return self.submit(task, "blocking").wait()
        try:
            return task()
        finally:
            self.leave()

    def submit(self, task, name="request"):
        """Queue task(); the Request completes with its result or error."""
        req = Request(name)
        with self._cv:
            if self._closed:
                raise RuntimeError(f"communicator {self._name} is freed")
            self.gate.add_queued()  # first: an inline claim in another thread now declines
            self._queue.append((task, req))
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name=f"gpucoll-{self._name}", daemon=True)
                self._worker.start()
            self._cv.notify_all()
        return req

    def _loop(self):
        gate = self.gate
        while True:
            with self._cv:
                # Never beside a running operation, even after close(): that one may be inline.
                while not gate.claim_queued():
                    if self._closed and not gate.busy:  # closed, and everything queued has run
                        return
                    self._cv.wait()
                task, req = self._queue.popleft()
                self._current = req
            try:
                req._finish(task())
            except BaseException as exc:  # delivered to whoever waits on the request
                req._finish(error=exc)
            finally:
                with self._cv:
                    gate.busy = False
                    self._current = None
                    self._cv.notify_all()

    def idle(self):
        with self._cv:
            return not self.gate.queued and not self.gate.busy

    def abandon(self, error):
        """In a forked child, where the worker thread does not exist: fail every request it
        would have run (the one running at the fork included) with `error`, so that no Wait
        blocks for ever, and take nothing more. The locks may have been held at the fork."""
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        pending = [req for _, req in self._queue] + ([self._current] if self._current is not None else [])
        self._queue.clear()
        self.gate.drop_queued()
        self._closed, self._worker, self._current = True, None, None
        self.gate.closed = True
        for req in pending:
            req._finish(error=error)

    def close(self):
        """Finish what is queued, then stop the worker."""
        with self._cv:
            self._closed = True
            self.gate.closed = True
            self._cv.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
