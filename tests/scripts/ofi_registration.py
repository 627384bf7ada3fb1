"""Registrations of reads over OFI, through gpucoll.MPI (tests/test_ofi.py). Rank 0 sends
64 MiB messages; rank 1 receives them into MPI.Alloc_mem memory three times, frees it, then
receives twice into a NumPy array that the allocator placed at the same address. JSON on
rank 1: each message whole, whether the address was reused, and the domain's registration
counts (registrations made, reads that reused one) after each part."""
import json

import numpy as np

import gpucoll.api.world
from gpucoll import MPI

N = 64 << 20    # above glibc's largest mmap threshold: freeing unmaps, the next one maps again
comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def pattern(i):
    return (np.arange(N, dtype=np.uint32) * 2654435761 + i).astype(np.uint8)


def counts():
    return gpucoll.api.world.world().seam.context.ofi().domain.stats()


def step(i, into=None):
    if rank == 0:
        comm.Send([pattern(i), MPI.BYTE], 1, tag=i)
        return None
    comm.Recv([into, N, MPI.BYTE], 0, tag=i)
    return bool(np.array_equal(np.frombuffer(into, np.uint8, N), pattern(i)))


out = {"whole": [], "counts": []}
mem = MPI.Alloc_mem(N) if rank == 1 else None
for i in range(3):
    out["whole"].append(step(i, mem))
out["counts"].append(counts() if rank == 1 else None)
if rank == 1:
    old = mem.address
    MPI.Free_mem(mem)
    del mem
    held = []
    for _ in range(8):      # the kernel hands the freed range out again (held ones keep others off it)
        plain = np.empty(N, np.uint8)
        if plain.ctypes.data == old:
            break
        held.append(plain)
    out["same_address"] = plain.ctypes.data == old
else:
    plain = None
for i in (3, 4):
    out["whole"].append(step(i, plain))
out["counts"].append(counts() if rank == 1 else None)
comm.Barrier()
if rank == 1:
    print("RESULT " + json.dumps(out))
