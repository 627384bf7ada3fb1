"""Memory whose life gpucoll knows: what MPI.Alloc_mem hands out, noted until it is freed.

A transport that registers memory with a device (OFI) keeps one registration for such memory
instead of one per transfer: it is told when the memory appears and, before it can be freed,
when it goes. Memory gpucoll did not allocate is never noted: nothing would say that it was
freed and its address given to another buffer, whose pages an old registration does not name::

    release = lasting.note(owner, address, nbytes)   # freed no earlier than `owner` is collected
    release()                                        # MPI.Free_mem: gone now (idempotent)
    lasting.watch(domain)    # domain.add_region(address, nbytes), .drop_region(address)
"""
import threading
import weakref

_lock = threading.Lock()
_live = {}          # address -> nbytes
_watchers = []


def note(owner, address, nbytes):
    """Note memory that lives at least as long as `owner`; returns the call that forgets it."""
    with _lock:
        _live[address] = nbytes
        for w in _watchers:
            w.add_region(address, nbytes)
    forget = weakref.finalize(owner, _forget, address)
    forget.atexit = False   # the process's domain closes on its own at exit
    return forget


def _forget(address):
    with _lock:
        if _live.pop(address, None) is None:
            return
        for w in _watchers:
            w.drop_region(address)


def watch(watcher):
    """Tell `watcher` of every noted memory, now and from now on."""
    with _lock:
        _watchers.append(watcher)
        for address, nbytes in _live.items():
            watcher.add_region(address, nbytes)
