"""The pickle-based object methods, as mpi4py programs use them.

    gpurun -np 4 python objects_p2p.py

Prints "RESULT {json}" per rank; tests/test_objects_p2p.py asserts the values.
"""
import json

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
rank, size = comm.rank, comm.size
root = size - 1
out = {}

# bcast: a nested object, a large one (crosses slots and channel buffers), None
obj = {"step": 3, "names": ["a", "b"], "arr": np.arange(5)} if rank == root else None
got = comm.bcast(obj, root=root)
out["bcast"] = [got["step"], got["names"], got["arr"].tolist()]
big = comm.bcast(b"x" * (6 << 20) + b"end" if rank == 0 else None, root=0)
out["bcast_big"] = [len(big), big[-3:].decode()]
out["bcast_none"] = comm.bcast(None, root=root)

# allgather / gather: objects of different sizes on each rank
mine = {"rank": rank, "payload": "y" * (1000 * rank)}
out["allgather"] = [[d["rank"], len(d["payload"])] for d in comm.allgather(mine)]
g = comm.gather(("r", rank), root=root)
out["gather"] = [list(t) for t in g] if g is not None else None

# scatter: rank i gets item i of root's list
items = [{"for": i, "data": list(range(i))} for i in range(size)] if rank == root else None
out["scatter"] = comm.scatter(items, root=root)

# allreduce / reduce with every op; Python values, NumPy arrays and lists
out["allreduce"] = {
    "SUM": comm.allreduce(rank + 1),
    "PROD": comm.allreduce(rank + 1, op=gpucoll.PROD),
    "MAX": comm.allreduce(rank * 7 % 5, op=gpucoll.MAX),
    "MIN": comm.allreduce(rank * 7 % 5 - 2, op=gpucoll.MIN),
    "AVG": comm.allreduce(float(rank), op=gpucoll.AVG),
    "BOR": comm.allreduce(1 << rank, op=gpucoll.BOR),
    "list_sum": comm.allreduce([rank]),
    "array_sum": comm.allreduce(np.array([rank, 1])).tolist(),
}
r = comm.reduce(rank, op=gpucoll.SUM, root=root)
out["reduce"] = r
out["alltoall"] = comm.alltoall([f"{rank}->{j}" for j in range(size)])

# send / recv around a ring, a status naming the sender, isend / irecv, sendrecv
right, left = (rank + 1) % size, (rank - 1) % size
if size > 1:
    req = comm.isend({"from": rank, "arr": np.full(3, rank)}, dest=right, tag=4)
    st = gpucoll.Status()
    msg = comm.recv(source=gpucoll.ANY_SOURCE, tag=4, status=st)
    req.wait()
    out["ring"] = [msg["from"], msg["arr"].tolist(), st.Get_source(), st.Get_tag()]
    if rank == 0:
        comm.send("first", dest=1, tag=1)
        comm.send(list(range(100000)), dest=1, tag=2)
    elif rank == 1:
        ireq = comm.irecv(source=0, tag=2)
        first = comm.recv(source=0, tag=1)
        second = ireq.wait()
        out["send_recv"] = [first, len(second), second[-1]]
    st = gpucoll.Status()
    out["sendrecv"] = comm.sendrecv(("hi", rank), dest=right, sendtag=6, source=left, status=st)
    out["sendrecv"] = list(out["sendrecv"])
    out["sendrecv_status"] = [st.Get_source(), st.Get_tag()]

# the same methods on a sub-communicator
sub = comm.Split(rank % 2, key=rank)
out["sub_allgather"] = sub.allgather(rank)
out["sub_bcast"] = sub.bcast(f"from world {rank}" if sub.rank == 0 else None)
print("RESULT " + json.dumps(out), flush=True)
