"""The direct shared-memory segment of a communicator: naming, creation, attach, cleanup.

All ranks of a communicator that live on one host map one segment (its file name under
/dev/shm derives from the job secret, see shm_segment.py) and run the collectives of
gpucoll._native.direct over it (layout and protocol: cython_src/include/gc_direct.h)::

    group = create_or_attach(JobSegments(job_id, secret), comm_id, local_rank, local_size,
                             creator_pid=pid_of_local_rank_0, timeout=60.0)
    group.allreduce(x.ctypes.data, y.ctypes.data, x.size, dtypes.FLOAT32, ops.SUM.code, 300.0)
    group.close()

Life cycle, chosen so that nothing is left in /dev/shm, even after a crash, and that nothing
but this job's own file is ever mapped:

* Local rank 0 creates the file exclusively (mode 0600; a leftover of an earlier run whose
  creator is gone is removed first, any other file of that name is refused), sizes it and
  formats it; the magic, written last, tells attachers the segment is ready.
* The other ranks retry opening it until it exists and holds a formatted segment of this job
  (owner, mode and token checked: a file that someone else made raises SharedMemoryError at
  once) made by local rank 0 (the creator pid the job's table gives), or until `timeout`; `check()`,
  called while they wait, stops the wait when it raises (the caller's way to notice that local
  rank 0 has ended and will never create it).
* Every rank counts itself in the header when it has mapped the segment; the last one to do so
  unlinks the name. From then on the memory lives only as long as some rank maps it, and the
  kernel frees it when the last rank exits, however it exits.
* The name stays only if a rank dies between creation and the last attach. A launcher that
  outlives the ranks (gpurun) covers that window by removing the job's segments when the job
  ends, and a later job removes those whose creator is gone.
"""
import mmap
import os
import time

from .._native import direct as _direct
from ..base import config
from ..base.errors import InvalidUsageError, LostPeerError, TimeoutError
from . import shm_segment


def segment_path(segments, comm_id):
    """The file of communicator `comm_id`'s direct segment (segments: a shm_segment.JobSegments)."""
    return segments.path(f"direct:{comm_id}")


def _map(fd, size):
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _create(path, token, local_size, slot_bytes):
    size = _direct.segment_size(local_size, slot_bytes)
    fd = shm_segment.create(path, size, token)  # tmpfs hands out zero pages lazily: flags start at 0
    try:
        mm = _map(fd, size)
        _direct.format_segment(mm, local_size, slot_bytes, os.getpid(), token)
    except BaseException:
        shm_segment.unlink_quietly(path)
        raise
    finally:
        os.close(fd)
    return mm


def _try_attach(path, token, local_size, creator_pid):
    """(the mapped segment or None, the probe's verdict); raises for a file this job did not
    make or one formatted for another number of ranks."""
    fd = shm_segment.open_checked(path)
    if fd is None:
        return None, "absent"
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None, "not ready"
        mm = _map(fd, size)
    finally:
        os.close(fd)
    state = _direct.probe_segment(mm, local_size, token, creator_pid)
    if state == "ready":
        return mm, state
    mm.close()
    if state == "foreign":
        raise shm_segment.squatted(path, "holds a segment with another job's token")
    if state == "mismatch":
        raise InvalidUsageError(f"{path} is a direct segment of this job for a different number of "
                                f"ranks than {local_size}, or of another gpucoll version")
    return None, state


def create_or_attach(segments, comm_id, local_rank, local_size, creator_pid=0, timeout=None,
                     slot_bytes=None, check=None):
    """Map the communicator's direct segment and return this rank's DirectGroup.

    `segments` (a shm_segment.JobSegments) names the job's segments. Local rank 0 creates it
    (slots of `slot_bytes`, default GPUCOLL_BUFFSIZE), the others wait up to `timeout` seconds
    (default GPUCOLL_TIMEOUT: the segment is made in a communicator's first collective, which
    rank 0 may reach late) for local rank 0, whose pid is `creator_pid` (0: unknown), to make
    it, calling `check()` about every 0.1 s (1 s with 256 ranks and more: a check may read /proc
    for every rank, and every rank waits here), which may raise to stop waiting. Raises
    TimeoutError when it does not, LostPeerError when it died after making it,
    SharedMemoryError when the name holds a file that this job did not make.
    """
    if not 0 <= local_rank < local_size:
        raise InvalidUsageError(f"local rank {local_rank} is not in [0, {local_size})")
    path = segment_path(segments, comm_id)
    token = segments.token(path)
    timeout = config.TIMEOUT.get() if timeout is None else timeout
    if local_rank == 0:
        mm = _create(path, token, local_size, config.BUFFSIZE.get() if slot_bytes is None else slot_bytes)
    else:
        deadline = time.monotonic() + timeout
        delay, checked = 0.0005, time.monotonic()
        check_every = min(1.0, max(0.1, local_size / 256))
        while True:
            mm, state = _try_attach(path, token, local_size, creator_pid)
            if mm is not None:
                break
            if state == "creator gone" and creator_pid:
                if check is not None:
                    check()  # names every rank found gone: the creator may have quit over another
                raise LostPeerError(f"local rank 0 (pid {creator_pid}) ended after creating the "
                                    f"shared-memory segment {path}, before local rank {local_rank} "
                                    "attached", ranks=(0,))
            if check is not None and time.monotonic() - checked >= check_every:
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
