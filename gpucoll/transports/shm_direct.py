"""The direct shared-memory segment of a communicator: naming, creation, attach, cleanup.

All ranks of a communicator that live on one host map one segment,
``/dev/shm/gpucoll-<job>-<comm>-direct``, and run the collectives of
gpucoll._native.direct over it (layout and protocol: cython_src/include/gc_direct.h)::

    group = create_or_attach(job_id, comm_id, local_rank, local_size, timeout=60.0)
    group.allreduce(x.ctypes.data, y.ctypes.data, x.size, dtypes.FLOAT32, ops.SUM.code, 300.0)
    group.close()

Life cycle, chosen so that nothing is left in /dev/shm, even after a crash:

* Local rank 0 creates the file under a private temporary name, sizes and formats it, then
  renames it to the public name. Rename is atomic, so an attacher never sees a half-made
  segment, and a leftover of a crashed job with the same name is replaced, not reused.
* The other ranks retry opening the public name until it exists and holds a segment whose
  creator is alive (a leftover's creator is dead), or until `timeout`; `check()`, called
  while they wait, stops the wait when it raises (the caller's way to notice that local
  rank 0 has ended and will never create it).
* Every rank counts itself in the header when it has mapped the segment; the last one to do so
  unlinks the name. From then on the memory lives only as long as some rank maps it, and the
  kernel frees it when the last rank exits, however it exits.
* The name stays only if a rank dies between creation and the last attach. A launcher that
  outlives the ranks (gpurun) covers that window by removing ``/dev/shm/gpucoll-<job>-*``
  when the job ends.
"""
import mmap
import os
import time

from .. import config
from ..errors import InvalidUsageError, TimeoutError
from .._native import direct as _direct

SHM_DIR = "/dev/shm"


def segment_name(job_id, comm_id):
    """The file name (under /dev/shm) of a communicator's direct segment."""
    name = f"gpucoll-{job_id}-{comm_id}-direct"
    if "/" in name or len(name) > 255:
        raise InvalidUsageError(f"job id {job_id!r} / communicator id {comm_id!r} do not make a "
                                "valid shared-memory name")
    return name


def _map(fd, size):
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _create(path, local_size, slot_bytes):
    size = _direct.segment_size(local_size, slot_bytes)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)  # tmpfs hands out zero pages lazily: flags start at epoch 0
        mm = _map(fd, size)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    try:
        _direct.format_segment(mm, local_size, slot_bytes, os.getpid())
        os.rename(tmp, path)
    except BaseException:
        mm.close()
        os.unlink(tmp)
        raise
    return mm


def _try_attach(path, local_size):
    """The mapped segment, or None when it is not there yet (or is a leftover)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        mm = _map(fd, size)
    finally:
        os.close(fd)
    state = _direct.probe_segment(mm, local_size)
    if state == "ok":
        return mm
    mm.close()
    if state == "mismatch":
        raise InvalidUsageError(f"{path} is a direct segment for a different number of ranks "
                                f"than {local_size}: two jobs share a job id?")
    return None


def create_or_attach(job_id, comm_id, local_rank, local_size, timeout=None, slot_bytes=None, check=None):
    """Map the communicator's direct segment and return this rank's DirectGroup.

    Local rank 0 creates it (slots of `slot_bytes`, default GPUCOLL_BUFFSIZE), the others wait
    up to `timeout` seconds (default GPUCOLL_TIMEOUT: the segment is made in a communicator's
    first collective, which rank 0 may reach late) for it to appear, calling `check()` about
    every 0.1 s, which may raise to stop waiting. Raises TimeoutError when it does not appear.
    """
    if not 0 <= local_rank < local_size:
        raise InvalidUsageError(f"local rank {local_rank} is not in [0, {local_size})")
    path = os.path.join(SHM_DIR, segment_name(job_id, comm_id))
    timeout = config.TIMEOUT.get() if timeout is None else timeout
    if local_rank == 0:
        mm = _create(path, local_size, config.BUFFSIZE.get() if slot_bytes is None else slot_bytes)
    else:
        deadline = time.monotonic() + timeout
        delay, checked = 0.0005, time.monotonic()
        while (mm := _try_attach(path, local_size)) is None:
            if check is not None and time.monotonic() - checked >= 0.1:
                check()
                checked = time.monotonic()
            if time.monotonic() > deadline:
                err = TimeoutError(f"local rank {local_rank} waited {timeout:g} s for local rank 0 "
                                   f"to create the shared-memory segment {path}")
                err.ranks = (0,)
                raise err
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    try:
        group = _direct.DirectGroup(mm, local_rank, local_size)
    except BaseException:
        mm.close()
        raise
    if group.nattached == local_size:
        try:
            os.unlink(path)  # everyone has it mapped: the name is no longer needed
        except FileNotFoundError:
            pass
    return group
