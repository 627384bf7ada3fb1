"""The gpucoll demo: every kind of collective on N ranks, each result checked on every rank.

    gpurun -np 4 python examples/demo.py

Rank 0 prints one line per operation: what was computed, the value a person can check by
hand, and whether every rank got exactly the expected result.
"""
import time

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
rank, size = comm.rank, comm.size
results = []


def check(name, shown, expected, ok):
    """Record one operation; every rank's verdict is gathered before rank 0 prints it."""
    results.append((name, shown, expected, bool(ok)))


n = 1 << 20  # one million float32 per rank
x = np.full(n, rank + 1, dtype=np.float32)
t0 = time.perf_counter()
comm.Allreduce(gpucoll.IN_PLACE, x, op=gpucoll.SUM)
ms = (time.perf_counter() - t0) * 1e3
total = size * (size + 1) // 2
check(f"Allreduce SUM of 1M float32 ({ms:.1f} ms)", f"{x[0]:g} everywhere", f"1+..+{size} = {total}",
      (x == total).all())

m = np.array([rank * 7 % size], dtype=np.int32)
comm.Allreduce(gpucoll.IN_PLACE, m, op=gpucoll.MAX)
check("Allreduce MAX of rank*7 % size", m[0], size - 1 if size > 1 else 0, m[0] == max(r * 7 % size for r in range(size)))

gathered = np.empty(size * 2, dtype=np.int64)
comm.Allgather(np.array([rank, rank * rank], dtype=np.int64), gathered)
check("Allgather of (rank, rank^2)", gathered[:6].tolist(), "[0, 0, 1, 1, 2, 4, ...]",
      (gathered.reshape(size, 2) == [[r, r * r] for r in range(size)]).all())

b = np.arange(4, dtype=np.int32) if rank == 0 else np.zeros(4, dtype=np.int32)
comm.Bcast(b, root=0)
check("Bcast from rank 0", b.tolist(), [0, 1, 2, 3], (b == np.arange(4)).all())

block = np.empty(2, dtype=np.int32)
comm.Reduce_scatter_block(np.arange(2 * size, dtype=np.int32), block, op=gpucoll.SUM)
check("Reduce_scatter_block of arange(2*size)", f"rank 0 holds {block.tolist() if rank == 0 else '...'}",
      "[0, size]", (block == [2 * rank * size, (2 * rank + 1) * size]).all())

send = np.array([rank * 10 + j for j in range(size)], dtype=np.int32)
recv = np.empty(size, dtype=np.int32)
comm.Alltoall(send, recv)
check("Alltoall of rank*10 + j", f"rank 0 got {recv.tolist() if rank == 0 else '...'}", "[0, 10, 20, ...]",
      (recv == [j * 10 + rank for j in range(size)]).all())

root_buf = np.empty(size, dtype=np.float64) if rank == 0 else None
comm.Gather(np.array([rank / 2]), root_buf, root=0)
check("Gather of rank/2 to rank 0", root_buf.tolist()[:4] if rank == 0 else "", "[0.0, 0.5, 1.0, ...]",
      rank != 0 or (root_buf == np.arange(size) / 2).all())

out = np.empty(1)
req = comm.Iallreduce(np.array([float(rank)]), out)
busy = sum(i * i for i in range(10000))  # work that overlaps the nonblocking call
req.Wait()
check("Iallreduce SUM of rank (overlapped)", out[0], size * (size - 1) / 2, out[0] == size * (size - 1) / 2)

names = comm.allgather(f"r{rank}")
check("allgather of Python objects", names[:4], "['r0', 'r1', ...]", names == [f"r{r}" for r in range(size)])

right, left = (rank + 1) % size, (rank - 1) % size
got = comm.sendrecv(f"hello from {rank}", dest=right, source=left)
check("sendrecv around a ring", f"rank 0 got '{got}'" if rank == 0 else "", f"'hello from {size - 1}'",
      got == f"hello from {left}")

verdicts = comm.gather([ok for _, _, _, ok in results], root=0)
nhosts = len(set(comm.allgather(comm.host)))
if rank == 0:
    print(f"gpucoll demo: {size} ranks on {nhosts} host(s)")
    for i, (name, shown, expected, _) in enumerate(results):
        bad = [r for r, v in enumerate(verdicts) if not v[i]]
        status = "OK on every rank" if not bad else f"WRONG on rank(s) {bad}"
        print(f"  {name:44s} -> {str(shown):34s} (expected {expected}): {status}")
    failed = sum(not all(v) for v in verdicts)
    print("all results correct" if not failed else f"{failed} rank(s) saw a wrong result")
    raise SystemExit(1 if failed else 0)
