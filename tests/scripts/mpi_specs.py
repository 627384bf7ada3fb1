"""Buffer specifications read as mpi4py reads them, on every rank count.

    gpurun -np N python mpi_specs.py      -> "RESULT {json}" per rank

An explicit count in `[buf, count, type]` is per rank for the per-rank buffers of
Allgather, Alltoall, Gather, Scatter and Reduce_scatter_block, and the total elsewhere;
the rest of a longer buffer is left alone.
"""
import json

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
out = {}
SPARE = 3  # elements past the spec's count, which no call may touch


def padded(values):
    return np.concatenate([np.asarray(values, np.int32), np.full(SPARE, -1, np.int32)])


# Alltoall: 2 elements to each rank; rank r sends r*10+j*2+{0,1} to rank j.
send = padded([r * 10 + j * 2 + k for j in range(n) for k in range(2)])
recv = padded([-1] * (2 * n))
comm.Alltoall([send, 2, MPI.INT], [recv, 2, MPI.INT])
out["alltoall"] = recv.tolist()

# Allgather, and IN_PLACE: 2 elements per rank.
recv = padded([-1] * (2 * n))
comm.Allgather([np.array([r, r + 100], np.int32), 2, MPI.INT], [recv, 2, MPI.INT])
out["allgather"] = recv.tolist()
recv = padded([-1] * (2 * n))
recv[2 * r:2 * r + 2] = (r, r + 100)
comm.Allgather(MPI.IN_PLACE, [recv, 2, MPI.INT])
out["allgather_in_place"] = recv.tolist()

# Gather to the last rank and Scatter from it: 2 elements per rank.
root = n - 1
recv = padded([-1] * (2 * n))
comm.Gather([np.array([r, -r], np.int32), 2, MPI.INT], [recv, 2, MPI.INT], root=root)
out["gather"] = recv.tolist()
send = padded([j * 7 + k for j in range(n) for k in range(2)])
recv = padded([-1, -1])
comm.Scatter([send, 2, MPI.INT], [recv, 2, MPI.INT], root=root)
out["scatter"] = recv.tolist()

# Reduce_scatter_block: sendbuf's count is per rank too (mpi4py compares it with recvbuf's).
send = padded([r + j for j in range(n) for _ in range(2)])
recv = padded([-1, -1])
comm.Reduce_scatter_block([send, 2, MPI.INT], [recv, 2, MPI.INT], op=MPI.SUM)
out["reduce_scatter_block"] = recv.tolist()

# Allreduce and Bcast: the count is the total.
buf = padded([r + 1, r + 2, r + 3])
comm.Allreduce(MPI.IN_PLACE, [buf, 3, MPI.INT], op=MPI.SUM)
out["allreduce"] = buf.tolist()

# The null request: false, complete at once, ignored by Waitany.
null = MPI.Request()
out["null"] = [bool(null), null.Test(), MPI.Request.Waitall([null, MPI.REQUEST_NULL]),
               MPI.Request.Waitany([null]) == MPI.UNDEFINED]
null.Wait()
print("RESULT " + json.dumps(out), flush=True)
