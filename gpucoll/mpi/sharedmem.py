"""The shared-memory segment of a window of Allocate_shared: one segment per window, every
process's part at its own offset, each aligned to 64 bytes.

The communicator's rank 0 creates the segment (POSIX shared memory, created exclusively with
mode 0600 under a random name) and hands its name to the others through the communicator (the
job's authenticated channels); every process maps it; rank 0 unlinks it once all have mapped
it, so the memory goes away with the last process that holds it, even after a crash.
"""
from multiprocessing import resource_tracker, shared_memory

import numpy as np

ALIGN = 64


class Segment:
    """A mapped segment: `array` (uint8) over all of it."""

    def __init__(self, shm, nbytes):
        self.shm = shm
        self.array = np.ndarray((nbytes,), np.uint8, buffer=shm.buf)

    def close(self):
        self.array = None
        try:
            self.shm.close()
        except BufferError:  # a buffer from Shared_query/tomemory is still alive: the mapping stays
            pass


def attach(core, sizes):
    """(Segment, [offset of each rank's part]) for parts of `sizes` bytes (collective over core)."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // ALIGN) * ALIGN
    total = max(at, 1)
    name = None
    if core.rank == 0:
        shm = shared_memory.SharedMemory(create=True, size=total)
        name = shm.name
    name = core.bcast(name, 0)
    if core.rank != 0:
        shm = shared_memory.SharedMemory(name=name)
        resource_tracker.unregister(shm._name, "shared_memory")  # rank 0 owns (and unlinks) it
    core.Barrier()  # everyone has it mapped: the name can go
    if core.rank == 0:
        shm.unlink()
    return Segment(shm, total), offsets
