"""gpucoll.MPI's one-sided communication (MPI.Win), with exact results.

    gpurun -np 3 python mpi_rma.py      -> "RESULT {json}" per rank

Fence epochs (Put, Get, Accumulate), a counter on rank 0 incremented under exclusive locks by
every rank at once (Fetch_and_op: atomic), Compare_and_swap, contended counters (Fetch_and_op
under shared locks; Get, add, Put under exclusive locks), a strided target layout and a target
past the window's end, Post/Start/Complete/Wait, request-based Rput/Rget, a dynamic window with
attached memory, and a shared window read directly through Shared_query. "direct" says whether
the window reached its targets' memory directly (GPUCOLL_RMA_DIRECT). tests/test_mpi_rma.py
computes what each must be.
"""
import json

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
ROUNDS = 100
r, n = comm.Get_rank(), comm.Get_size()
right, left = (r + 1) % n, (r - 1) % n
out = {}

# --- fence epochs on Allocate'd memory: n ints per rank -----------------------------------------------
win = MPI.Win.Allocate(n * 4, 4, comm=comm)
mem = np.frombuffer(win.tomemory(), "i")
mem[:] = 0
win.Fence()
win.Put(np.array([100 + r], "i"), right, r)           # my slot r of my right neighbour
win.Fence()
after_put = mem.tolist()
got = np.full(n, -1, "i")
win.Get(got, left)                                     # all of my left neighbour's window
win.Fence()
win.Accumulate(np.array([r + 1] * n, "i"), 0, op=MPI.SUM)
win.Fence()
out["fence"] = [after_put, got.tolist(), mem.tolist() if r == 0 else None, win.Get_attr(MPI.WIN_DISP_UNIT),
                win.flavor == MPI.WIN_FLAVOR_ALLOCATE, win.model == MPI.WIN_UNIFIED]

# --- a counter on rank 0: 20 increments from every rank under exclusive locks -----------------------------
mem[:] = 0
win.Fence()
one, before = np.array([1], "i"), np.zeros(1, "i")
seen = []
for _ in range(20):
    win.Lock(0, MPI.LOCK_EXCLUSIVE)
    win.Fetch_and_op(one, before, 0, 0, op=MPI.SUM)
    win.Unlock(0)
    seen.append(int(before[0]))
win.Fence()
# compare-and-swap: only the first rank to arrive swaps 0 -> its rank + 1 in slot 1
old = np.zeros(1, "i")
win.Lock_all()
win.Compare_and_swap(np.array([r + 1], "i"), np.array([0], "i"), old, 0, 1)
win.Flush(0)
win.Unlock_all()
win.Fence()
out["atomic"] = [sorted(set(seen)) == sorted(seen), int(mem[0]) if r == 0 else None, int(old[0]),
                 int(mem[1]) if r == 0 else None]

# --- atomicity without exclusive locks: every rank at once, under shared locks ------------------------------
# Fetch_and_op is atomic by itself; a read, add and write back is safe only under an exclusive lock.
mem[:] = 0
win.Fence()
fetched = []
win.Lock_all()
for _ in range(ROUNDS):
    win.Fetch_and_op(one, before, 0, 1, op=MPI.SUM)
    win.Flush(0)
    fetched.append(int(before[0]))
win.Unlock_all()
value = np.zeros(1, "i")
for _ in range(ROUNDS):
    win.Lock(0, MPI.LOCK_EXCLUSIVE)
    win.Get(value, 0, 2)
    win.Flush(0)
    win.Put(value + 1, 0, 2)
    win.Unlock(0)
win.Fence()
out["contended"] = [sorted(set(fetched)) == sorted(fetched), mem[1:3].tolist() if r == 0 else None]

# --- a strided target layout (a vector datatype) and a target past the window's end -------------------------
mem[:] = -1
win.Fence()
every_other = MPI.INT.Create_vector(2, 1, 2).Commit()
win.Put(np.array([r, r + 10], "i"), right, (0, 1, every_other))
win.Fence()
strided = mem.tolist()
both = np.zeros(2, "i")
win.Get(both, left, (0, 1, every_other))
win.Fence()
win.Accumulate(np.array([1, 1], "i"), right, (0, 1, every_other), op=MPI.SUM)
win.Fence()
every_other.Free()
try:
    win.Lock(right)
    try:
        win.Put(np.zeros(2, "i"), right, n - 1)   # one int too many
        win.Flush(right)
    finally:
        win.Unlock(right)
    beyond = "no error"
except MPI.Exception as exc:
    beyond = str(exc)
win.Fence()
out["layouts"] = [strided, both.tolist(), mem.tolist(), beyond]
out["direct"] = win._s.direct is not None

# --- Post/Start/Complete/Wait: ranks 1.. write into rank 0 ------------------------------------------------
group = comm.Get_group()
if r == 0:
    win.Post(group.Excl([0]))
    win.Wait()
    out["pscw"] = mem.tolist()
else:
    win.Start(group.Incl([0]))
    win.Put(np.array([50 + r], "i"), 0, r)
    win.Complete()
    out["pscw"] = None
win.Fence()
# request-based: Rput to the right, Rget from the left
req = win.Rput(np.array([7 * r], "i"), right, 0)
req.Wait()
win.Fence()
into = np.zeros(1, "i")
win.Lock(left, MPI.LOCK_SHARED)
win.Rget(into, left, 0).Wait()
win.Unlock(left)
out["requests"] = [int(mem[0]), int(into[0])]
win.Free()

# --- a dynamic window: targets are addresses of attached memory ----------------------------------------------
dyn = MPI.Win.Create_dynamic(comm=comm)
region = MPI.Alloc_mem(8)
region[:] = bytes(8)
dyn.Attach(region)
addresses = comm.allgather(MPI.Get_address(region))
dyn.Fence()
dyn.Put(np.array([r + 1], "i"), right, addresses[right] + 4)
dyn.Fence()
out["dynamic"] = np.frombuffer(region, "i").tolist()
dyn.Detach(region)
dyn.Free()
MPI.Free_mem(region)

# --- a shared window: every rank reads the others' memory directly ---------------------------------------------
host = comm.Split_type(MPI.COMM_TYPE_SHARED)
shared = MPI.Win.Allocate_shared(4 * (host.rank + 1), 4, comm=host)
np.frombuffer(shared.tomemory(), "i")[:] = host.rank + 10
shared.Fence()
views = [np.frombuffer(shared.Shared_query(k)[0], "i").tolist() for k in range(host.size)]
shared.Fence()
out["shared"] = [host.size == n, views]
shared.Free()
host.Free()
print("RESULT " + json.dumps(out), flush=True)
