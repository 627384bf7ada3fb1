"""Calls back, from a thread of its own, when a process of this host ends.

A GPU kernel that waits on a peer's flag cannot see the peer die: only the host can, and the
host thread that launched it may be anywhere (in the program's own code, in a stream
synchronisation). So whoever must release such waits (the GPU teams and outboxes set their
abort word) registers the peers' pids here:

    token = watch([pid, ...], on_end)   # on_end(pid) runs in the watcher thread, once per pid
    unwatch(token)

One daemon thread per process sleeps in poll() on a pidfd per watched pid (Linux >= 5.3) and
a pipe that wakes it for new registrations, so watching costs nothing while every peer lives
and a death is seen within a millisecond. Where pidfd_open is refused, the thread looks at the
pids every POLL_S instead. A process that is a zombie counts as ended (gpucoll/transports/shm.py
pid_alive's rule). Callbacks must be quick and must not raise (an exception is logged).
"""
import itertools
import os
import select
import threading

from ..base import log

POLL_S = 0.01  # how often the pids are looked at where pidfds are refused

_lock = threading.Lock()
_watches = {}            # token -> (frozenset of pids, on_end)
_ended = set()           # pids seen ended (each reported once per watch)
_tokens = itertools.count(1)
_thread = []
_wake = []               # (read end, write end) of the pipe that wakes the thread


def watch(pids, on_end):
    """Call on_end(pid) once for each of `pids` that ends (at once for one already gone).
    Returns a token for unwatch()."""
    from .shm import pid_alive

    pids = frozenset(p for p in pids if p)
    token = next(_tokens)
    with _lock:
        for p in pids:  # as the pids are now (a pid seen ended may belong to a new process)
            (_ended.discard if pid_alive(p) else _ended.add)(p)
        _watches[token] = (pids, on_end)
        gone = pids & _ended
        if not _thread:
            _wake.append(os.pipe())
            thread = threading.Thread(target=_run, name="gpucoll-process-watch", daemon=True)
            _thread.append(thread)
            thread.start()
        else:
            os.write(_wake[0][1], b"w")
    for pid in gone:
        _call(on_end, pid)
    return token


def unwatch(token):
    with _lock:
        _watches.pop(token, None)


def _call(on_end, pid):
    try:
        on_end(pid)
    except Exception as exc:  # noqa: BLE001 - the thread must go on for the other watches
        log.warn("INIT", "a callback for the end of process %d failed: %s", pid, exc)


def _open(pid, fds):
    """A pidfd for pid in fds, or why not: 'gone' (it ended) or 'refused' (no pidfds here)."""
    try:
        fds[pid] = os.pidfd_open(pid)
        return None
    except ProcessLookupError:
        return "gone"
    except (AttributeError, OSError):
        return "refused"


def _run():
    from .shm import pid_alive

    fds = {}         # pid -> pidfd
    polled = set()   # pids looked at every POLL_S (no pidfd)
    wake = _wake[0][0]
    while True:
        with _lock:
            wanted = set().union(*(p for p, _ in _watches.values())) - _ended
        for pid in wanted - fds.keys() - polled:
            why = _open(pid, fds)
            if why == "gone":
                _report(pid)
            elif why == "refused":
                polled.add(pid)
        for pid in list(fds):
            if pid not in wanted:
                os.close(fds.pop(pid))
        polled &= wanted
        poller = select.poll()
        poller.register(wake, select.POLLIN)
        by_fd = {fd: pid for pid, fd in fds.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        events = poller.poll(int(POLL_S * 1000) if polled else None)
        for fd, _ in events:
            if fd == wake:
                os.read(wake, 4096)
            else:
                pid = by_fd[fd]
                os.close(fds.pop(pid))
                _report(pid)
        for pid in [p for p in polled if not pid_alive(p)]:
            polled.discard(pid)
            _report(pid)


def _forget_in_child():
    """A forked child has no watcher thread (and none of its parent's watches)."""
    global _lock
    _lock = threading.Lock()
    _watches.clear()
    _ended.clear()
    _thread.clear()
    _wake.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _report(pid):
    with _lock:
        _ended.add(pid)
        callbacks = [cb for pids, cb in _watches.values() if pid in pids]
    for cb in callbacks:
        _call(cb, pid)
