"""A typical mpi4py program (pi by the midpoint rule, plus a parallel sum), unchanged but for
its first import: `from gpucoll import MPI` instead of `from mpi4py import MPI`.

    gpurun -np 4 python mpi_pi.py          # or, with mpi4py:  mpiexec -n 4 python mpi_pi.py
"""
import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
t0 = MPI.Wtime()

# rank 0 decides the number of intervals, everyone learns it
n = np.array(0, dtype="i")
if rank == 0:
    n[()] = 1_000_000
comm.Bcast([n, MPI.INT], root=0)

# each rank integrates 4 / (1 + x^2) over its share of the intervals
h = 1.0 / int(n)
x = h * (np.arange(rank, int(n), size, dtype="d") + 0.5)
mypi = np.array(h * np.sum(4.0 / (1.0 + x * x)), dtype="d")
pi = np.array(0.0, dtype="d")
comm.Reduce([mypi, MPI.DOUBLE], [pi, MPI.DOUBLE], op=MPI.SUM, root=0)

# a parallel sum of a distributed vector, in place, and a max
local = np.arange(rank * 10, rank * 10 + 10, dtype="d")
total = np.array([local.sum()])
comm.Allreduce(MPI.IN_PLACE, [total, MPI.DOUBLE], op=MPI.SUM)
biggest = np.zeros(1, dtype="i")
comm.Allreduce([np.array([rank * rank], dtype="i"), MPI.INT], [biggest, MPI.INT], op=MPI.MAX)

# scatter rows, square them, gather them back
rows = np.arange(size * 3, dtype="d").reshape(size, 3) if rank == 0 else None
row = np.empty(3, dtype="d")
comm.Scatter([rows, MPI.DOUBLE] if rank == 0 else None, [row, MPI.DOUBLE], root=0)
back = np.empty((size, 3), dtype="d") if rank == 0 else None
comm.Gather([row * row, MPI.DOUBLE], [back, MPI.DOUBLE] if rank == 0 else None, root=0)

# a neighbour exchange with a status, and the object methods
status = MPI.Status()
left = np.zeros(2, dtype="i")
comm.Sendrecv([np.array([rank, 1], dtype="i"), MPI.INT], dest=(rank + 1) % size, sendtag=7,
              recvbuf=[left, MPI.INT], source=MPI.ANY_SOURCE, recvtag=MPI.ANY_TAG, status=status)
names = comm.allgather(MPI.Get_processor_name())
comm.Barrier()
elapsed = MPI.Wtime() - t0

if rank == 0:
    print(f"pi {float(pi):.12f} error {abs(float(pi) - np.pi):.2e}")
    print(f"sum {total[0]:.1f} max {int(biggest[0])}")
    print(f"gathered {back.ravel().tolist()}")
print(f"rank {rank} of {size}: left neighbour {left.tolist()} source {status.Get_source()} "
      f"tag {status.Get_tag()} count {status.Get_count(MPI.INT)} hosts {len(names)} "
      f"elapsed_ok {0 <= elapsed < 60}")
