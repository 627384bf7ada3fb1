"""Ordered execution of one communicator's collectives.

Collectives must run in the order the caller issued them (every rank issues them in
the same order). Blocking calls run inline in the caller's thread when nothing is
queued, for the lowest latency; nonblocking calls, and blocking calls issued while
nonblocking ones are pending, go to one worker thread that runs them in order. The
native loops release the GIL, so queued operations overlap with the caller's work.
"""
import collections
import threading

from ..base.request import Request


class OrderedQueue:
    def __init__(self, name):
        self._name = name
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._queue = collections.deque()
        self._busy = False  # an operation is running (inline or on the worker)
        self._worker = None
        self._closed = False
        self._current = None  # the request the worker is running

    def enter(self):
        """Claim the engine for one operation run inline by the caller, when nothing is queued
        or running: True (then call leave() when it is done), else False (nothing claimed;
        queue the operation with submit() to keep the order). The public hook of every inline
        path, the native fast paths' included."""
        lock = self._lock  # the condition's own lock, taken directly: this is every call's path
        lock.acquire()
        inline = not self._queue and not self._busy
        if inline:
            self._busy = True
        lock.release()
        return inline

    def leave(self):
        """End the operation that enter() claimed; wake the worker if something is queued.
        `_busy` is cleared without the lock (this is every inline call's path): a worker that
        saw it set is waiting, or about to, on the condition, and is notified under its lock
        whenever there is something for it to do."""
        self._busy = False
        if self._queue or self._closed:
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
            self._queue.append((task, req))
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name=f"gpucoll-{self._name}", daemon=True)
                self._worker.start()
            self._cv.notify_all()
        return req

    def _loop(self):
        while True:
            with self._cv:
                # Never beside a running operation, even after close(): that one may be inline.
                while self._busy or (not self._queue and not self._closed):
                    self._cv.wait()
                if not self._queue:  # closed, and everything queued has run
                    return
                task, req = self._queue.popleft()
                self._busy = True
                self._current = req
            try:
                req._finish(task())
            except BaseException as exc:  # delivered to whoever waits on the request
                req._finish(error=exc)
            finally:
                with self._cv:
                    self._busy = False
                    self._current = None
                    self._cv.notify_all()

    def idle(self):
        with self._cv:
            return not self._queue and not self._busy

    def abandon(self, error):
        """In a forked child, where the worker thread does not exist: fail every request it
        would have run (the one running at the fork included) with `error`, so that no Wait
        blocks for ever, and take nothing more. The locks may have been held at the fork."""
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        pending = [req for _, req in self._queue] + ([self._current] if self._current is not None else [])
        self._queue.clear()
        self._closed, self._worker, self._current = True, None, None
        for req in pending:
            req._finish(error=error)

    def close(self):
        """Finish what is queued, then stop the worker."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
