"""The gpucoll demo: every collective on 4 ranks, with results a person can check.

    gpurun -np 4 python examples/demo.py
"""
import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
rank, size = comm.rank, comm.size
n = 1 << 20  # one million float32 per rank for the all-reduce

x = np.full(n, rank + 1, dtype=np.float32)
comm.Allreduce(gpucoll.IN_PLACE, x, op=gpucoll.SUM)
expected = size * (size + 1) / 2
print(f"allreduce  : every element = {x[0]:g} (expected 1+2+..+{size} = {expected:g}), "
      f"all equal: {bool((x == expected).all())}")

gathered = np.empty(size * 2, dtype=np.int64)
comm.Allgather(np.array([rank, rank * rank], dtype=np.int64), gathered)
print(f"allgather  : {gathered.tolist()} (pairs rank, rank^2)")

b = np.arange(4, dtype=np.int32) if rank == 0 else np.zeros(4, dtype=np.int32)
comm.Bcast(b, root=0)
print(f"bcast      : {b.tolist()} (expected [0, 1, 2, 3] from rank 0)")

block = np.empty(2, dtype=np.int32)
comm.Reduce_scatter_block(np.arange(2 * size, dtype=np.int32), block, op=gpucoll.SUM)
print(f"reduce_scatter: {block.tolist()} (expected [{2 * rank * size}, {(2 * rank + 1) * size}])")

send = np.array([rank * 10 + j for j in range(size)], dtype=np.int32)
recv = np.empty(size, dtype=np.int32)
comm.Alltoall(send, recv)
print(f"alltoall   : {recv.tolist()} (expected [{', '.join(str(j * 10 + rank) for j in range(size))}])")

req = comm.Iallreduce(np.array([float(rank)]), out := np.empty(1))
req.Wait()
print(f"iallreduce : {out[0]:g} (expected {size * (size - 1) / 2:g})")

total = comm.allreduce({"rank": rank}["rank"], op=gpucoll.MAX)
names = comm.allgather(f"r{rank}")
print(f"objects    : max rank {total}, names {names}")

right, left = (rank + 1) % size, (rank - 1) % size
got = comm.sendrecv(f"hello from {rank}", dest=right, source=left)
print(f"sendrecv   : got '{got}' from rank {left}")
comm.Barrier()
