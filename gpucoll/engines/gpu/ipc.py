"""CUDA IPC handles of this process: what it exported, what it opened of other processes.

One cache per process, shared by every communicator (collectives that register buffers and
GPU point-to-point):

* export(ptr) -> (handle, offset): the IPC handle of the allocation that holds ptr, cached by
  the driver's allocation id (unique and never reused, so a freed and re-made allocation at the
  same address gets a fresh handle), or None when the memory cannot be shared (pool allocators
  such as cudaMallocAsync's).
* open_memory(handle) -> base address of a peer allocation mapped here, opened once. At most
  MAX_OPEN stay open: past that the oldest half are closed, after a device synchronisation so
  that no kernel or copy still reads them (a peer that freed its buffer re-exports a new handle,
  so old mappings only ever age out).
* open_event(handle) -> another process's interprocess event, opened once.
* close_from(pids): unmap what was opened of these processes (given as open_memory's owner),
  once they have ended: nothing of theirs is read again.

The caller makes the right context current first (its device's primary context).
"""
import threading
from collections import OrderedDict

from ..._native import cuda
from ...base.errors import GpucollError

MAX_OPEN = 1024
MAX_EXPORTED = 4096

_lock = threading.Lock()
_exported = {}              # allocation id -> (base, handle)
_opened = OrderedDict()     # memory handle -> base address here, oldest first
_events = {}                # event handle -> event here
_owners = {}                # memory handle -> pid of the process that exported it, where known


def export(ptr):
    """(handle, offset of ptr in its allocation), or None when the memory cannot be shared."""
    try:
        key = cuda.buffer_id(ptr)
        with _lock:
            hit = _exported.get(key)
        if hit is None:
            base, _ = cuda.address_range(ptr)
            hit = (base, cuda.ipc_get_mem_handle(base))
            with _lock:
                if len(_exported) >= MAX_EXPORTED:
                    _exported.clear()
                _exported[key] = hit
        return hit[1], ptr - hit[0]
    except GpucollError:
        return None


def open_memory(handle, owner=0):
    """Base address, in this process, of the peer allocation behind an IPC memory handle
    (exported by process `owner`, where known)."""
    with _lock:
        base = _opened.get(handle)
        if base is not None:
            _opened.move_to_end(handle)
            return base
    if len(_opened) >= MAX_OPEN:
        _close_oldest(len(_opened) // 2)
    base = cuda.ipc_open_mem_handle(handle)
    with _lock:
        _opened[handle] = base
        if owner:
            _owners[handle] = owner
    return base


def _close_oldest(k):
    with _lock:
        handles = list(_opened)[:k]
    _close(handles)


def close_from(pids):
    """Unmap every allocation opened of the processes `pids` (ended ones); how many."""
    with _lock:
        handles = [h for h, pid in _owners.items() if pid in pids]
    _close(handles)
    return len(handles)


def _close(handles):
    if not handles:
        return
    cuda.ctx_synchronize()  # nothing in flight may still read what is unmapped
    with _lock:
        victims = [_opened.pop(h) for h in handles if h in _opened]
        for h in handles:
            _owners.pop(h, None)
    for base in victims:
        try:
            cuda.ipc_close_mem_handle(base)
        except GpucollError:
            pass


def open_event(handle):
    with _lock:
        event = _events.get(handle)
    if event is None:
        event = cuda.ipc_open_event_handle(handle)
        with _lock:
            _events[handle] = event
    return event


def open_count():
    """How many peer allocations are mapped here now."""
    return len(_opened)
