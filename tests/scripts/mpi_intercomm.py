"""gpucoll.MPI's intercommunicators, with exact results.

    gpurun -np 4 python mpi_intercomm.py      -> "RESULT {json}" per rank

Group A is world ranks 0 and 1, group B ranks 2 and 3. Over the intercommunicator between them:
point to point, rooted collectives with MPI.ROOT / MPI.PROC_NULL, all-to-all forms, reductions
(each group gets the other's), Merge, Split, Dup, and the same meeting made through a port
(Open_port, Accept, Connect). tests/test_mpi_intercomm.py computes what each must be.
"""
import json

import numpy as np

from gpucoll import MPI

world = MPI.COMM_WORLD
w = world.Get_rank()
color = 0 if w < 2 else 1
local = world.Split(color, 0)
inter = local.Create_intercomm(0, world, 2 if color == 0 else 0, tag=5)
r, rsize = inter.Get_rank(), inter.Get_remote_size()
out = {"identity": [type(inter).__name__, inter.Is_inter(), inter.size, rsize, inter.Get_remote_group().Get_size(),
                    type(MPI.Comm.fromint(inter.toint())).__name__]}

# point to point: local rank i and remote rank i swap their world ranks
got = np.zeros(1, "i")
inter.Sendrecv(np.array([w], "i"), r, 3, got, r, 3)
out["p2p"] = int(got[0])
# remote rank 2 does not exist (the remote group has 2): refused, not delivered to the bridge's
# rank 2, which is a rank of this group (the two talk first, so that their channel is open)
world.Sendrecv(np.zeros(1, "i"), w ^ 1, 12, np.zeros(1, "i"), w ^ 1, 12)
try:
    inter.Send(np.zeros(1, "i"), rsize, 4)
    out["p2p_bad_rank"] = "sent"
except MPI.Exception as exc:
    out["p2p_bad_rank"] = exc.Get_error_class() == MPI.ERR_RANK

# Bcast from rank 1 of group A: MPI.ROOT there, PROC_NULL for rank 0 of A, remote rank 1 for group B
buf = np.array([w * 10] * 3, "i") if w == 1 else np.full(3, -1, "i")
root = (MPI.ROOT if r == 1 else MPI.PROC_NULL) if color == 0 else 1
inter.Bcast(buf, root=root)
out["bcast"] = buf.tolist()

# Allgather, Alltoall, Allreduce: each group gets the other's data
ag = np.full(rsize, -1, "i")
inter.Allgather(np.array([w], "i"), ag)
a2a = np.full(rsize, -1, "i")
inter.Alltoall(np.array([100 * w + k for k in range(rsize)], "i"), a2a)
red = np.zeros(2, "d")
inter.Allreduce(np.array([w, 1.0]), red, op=MPI.SUM)
out["all"] = [ag.tolist(), a2a.tolist(), red.tolist(), inter.allgather(w)]

# Gatherv to rank 0 of group B: remote rank j sends j + 1 values
if color == 1:
    gv = np.full(3, -1, "i")
    inter.Gatherv(None, [gv, [1, 2], [0, 1], MPI.INT], root=MPI.ROOT if r == 0 else MPI.PROC_NULL) \
        if r == 0 else inter.Gatherv(None, None, root=MPI.PROC_NULL)
    out["gatherv"] = gv.tolist() if r == 0 else None
else:
    inter.Gatherv(np.array([w] * (r + 1), "i"), None, root=0)
    out["gatherv"] = None
value = inter.reduce(w, op=MPI.MAX, root=(MPI.ROOT if r == 0 else MPI.PROC_NULL) if color == 0 else 0)
inter.Barrier()

# Merge (group B first: it passes high=False), Split, Dup
merged = inter.Merge(high=(color == 0))
half = inter.Split(r, 0)
dup = inter.Dup()
out["derived"] = [value, merged.Get_rank(), merged.Get_size(), half.Get_size(), half.Get_remote_size(),
                  dup.Get_remote_size(), MPI.Comm.Compare(inter, dup)]
for c in (merged, half, dup):
    c.Free()

# the same meeting through a port: group A accepts, group B connects
if color == 0:
    port = MPI.Open_port() if r == 0 else None
    if r == 0:
        world.send(port, 2)
    via_port = local.Accept(port, root=0)
    if r == 0:
        MPI.Close_port(port)
else:
    port = world.recv(source=0) if r == 0 else None
    via_port = local.Connect(port, root=0)
out["port"] = [via_port.Get_remote_size(), via_port.bcast("hello" if w == 0 else None,
                                                          root=(MPI.ROOT if r == 0 else MPI.PROC_NULL)
                                                          if color == 0 else 0)]
try:
    inter.Reduce_scatter_block(np.zeros(2), np.zeros(1))
    out["unsupported"] = "no error"
except NotImplementedError as exc:
    out["unsupported"] = str(exc)
via_port.Free()
inter.Free()
local.Free()
print("RESULT " + json.dumps(out), flush=True)
