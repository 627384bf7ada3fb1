"""gpucoll.MPI with GPU arrays: whole CuPy arrays (bare or as [array, datatype]) and the elements
that counts and displacements of a basic datatype name go to gpucoll's GPU path, as do derived
datatypes (packed on the device); the vector, neighbourhood, scan and counted reduce-scatter
collectives, reductions with an op the GPU path lacks (LAND, LOR, a user op, Reduce_local),
synchronous sends, matched receives, one-sided origins and the collectives across an
intercommunicator, Pack/Unpack, MPI-IO and a complex PROD go through host memory; an object with
__cuda_array_interface__ over host memory is a host buffer even where CUDA runs.

    gpurun -np 2 python mpi_gpu.py      -> "RESULT {json}" per rank
"""
import json
import os
import tempfile

import cupy as cp
import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {}
a = cp.full(5, r + 1, cp.float32)
b = cp.zeros(5, cp.float32)
comm.Allreduce(a, b, op=MPI.SUM)
c = cp.zeros(5, cp.float32)
comm.Allreduce([a, MPI.FLOAT], [c, MPI.FLOAT], op=MPI.MAX)
d = cp.arange(4, dtype=cp.int32) if r == 0 else cp.zeros(4, cp.int32)
comm.Bcast(d, root=0)
cp.cuda.get_current_stream().synchronize()
out["collectives"] = [b.get().tolist(), c.get().tolist(), d.get().tolist()]
st = MPI.Status()
if r == 0:
    comm.Send(cp.arange(3, dtype=cp.float64), 1, tag=4)
elif r == 1:
    got = cp.zeros(3, cp.float64)
    comm.Recv(got, 0, 4, st)
    cp.cuda.get_current_stream().synchronize()
    out["recv"] = [got.get().tolist(), st.Get_source(), st.Get_count(MPI.DOUBLE)]
# probes of GPU messages (small: through an outbox slot; large: pulled) report the announced size;
# a matched probe takes the second message, which its Message then receives into GPU memory
for count, tag in ((5, 6), (70_000, 7)):
    if r == 0:
        comm.Send(cp.arange(count, dtype=cp.float32), 1, tag=tag)
        comm.Send(cp.arange(count, dtype=cp.float32) + 1, 1, tag=tag)
    elif r == 1:
        pst, ist, mst = MPI.Status(), MPI.Status(), MPI.Status()
        comm.Probe(0, tag, pst)
        while not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, ist):
            pass
        got = cp.zeros(count, cp.float32)
        comm.Recv(got, 0, tag)
        matched = comm.Mprobe(0, tag, mst)
        second = cp.zeros(count, cp.float32)
        matched.Recv(second)
        out[f"probe {count}"] = [pst.Get_source(), pst.Get_tag(), pst.Get_count(MPI.FLOAT), ist.Get_tag(),
                                 ist.Get_count(MPI.FLOAT), mst.Get_count(MPI.FLOAT),
                                 bool((got == cp.arange(count, dtype=cp.float32)).all()),
                                 bool((second == cp.arange(count, dtype=cp.float32) + 1).all())]
# counts and displacements of a basic datatype over GPU arrays: the elements they name, in place
part = cp.full(6, -1.0, cp.float32)
if r == 0:
    part[2:5] = cp.arange(3, dtype=cp.float32)
comm.Bcast([part, 0, MPI.FLOAT], root=0)  # no elements: an empty message, nothing written
comm.Bcast([part, (3, 2), MPI.FLOAT], root=0)
whole = cp.full(4, float(r + 1), cp.float64)
comm.Allreduce(MPI.IN_PLACE, [whole, 2, MPI.DOUBLE], op=MPI.SUM)
if r == 0:
    comm.Send([cp.arange(8, dtype=cp.int32), 4, MPI.INT], 1, tag=8)
elif r == 1:
    got = cp.full(6, -1, cp.int32)
    comm.Recv([got, (4, 1), MPI.INT], 0, 8)
    out["counted recv"] = got.get().tolist()
# a count per rank (Allgather, Scatter): the buffer holds every rank's block, the rest untouched
blocks = cp.full(n + 2, -1.0, cp.float32)
comm.Allgather(cp.full(1, float(r), cp.float32), [blocks, 1, MPI.FLOAT])
dealt = cp.full(2, -1.0, cp.float32)
comm.Scatter([cp.arange(2 * n + 1, dtype=cp.float32), 2, MPI.FLOAT], [dealt, 2, MPI.FLOAT], root=0)
cp.cuda.get_current_stream().synchronize()
out["counted"] = [part.get().tolist(), whole.get().tolist()]
out["per rank"] = [blocks.get().tolist(), dealt.get().tolist()]

# through host memory: rank k sends k + 1 elements (value 10 k + i)
counts = [k + 1 for k in range(n)]
displs = [sum(counts[:k]) for k in range(n)]
mine = cp.arange(r + 1, dtype=cp.float64) + 10 * r
gathered = cp.zeros(sum(counts), cp.float64)
comm.Allgatherv(mine, [gathered, counts, displs, MPI.DOUBLE])
rooted = cp.zeros(sum(counts), cp.float64)
comm.Gatherv(mine, [rooted, counts, displs, MPI.DOUBLE] if r == 0 else None, root=0)
scattered = cp.zeros(r + 1, cp.float64)
comm.Scatterv([gathered, counts, displs, MPI.DOUBLE], scattered, root=0)
sends = cp.arange(n, dtype=cp.int64) + 100 * r  # block k (one element) to rank k
recvs = cp.zeros(n, cp.int64)
req = comm.Ialltoallv([sends, [1] * n, list(range(n)), MPI.INT64_T], [recvs, [1] * n, list(range(n)), MPI.INT64_T])
req.Wait()
rs_in = cp.arange(sum(counts), dtype=cp.float32)
rs_out = cp.zeros(counts[r], cp.float32)
comm.Reduce_scatter(rs_in, rs_out, counts, op=MPI.SUM)
inclusive, exclusive = cp.zeros(2, cp.int32), cp.zeros(2, cp.int32)
comm.Scan(cp.full(2, r + 1, cp.int32), inclusive, op=MPI.SUM)
comm.Exscan(cp.full(2, r + 1, cp.int32), exclusive, op=MPI.SUM)
ring = comm.Create_cart([n], periods=[True])
neighbours = cp.zeros(2, cp.float32)
ring.Neighbor_allgather(cp.full(1, float(r), cp.float32), neighbours)
# across an intercommunicator (a group of one on each side): through host memory
local = comm.Split(r, 0)
inter = local.Create_intercomm(0, comm, 1 - r, 12)
remote_sum = cp.zeros(2, cp.float32)
inter.Allreduce(cp.full(2, float(r + 1), cp.float32), remote_sum, op=MPI.SUM)
from_root = cp.full(3, -1, cp.int32)
if r == 0:
    inter.Bcast(cp.arange(3, dtype=cp.int32), root=MPI.ROOT)
else:
    inter.Bcast(from_root, root=0)
cp.cuda.get_current_stream().synchronize()
out["inter"] = [remote_sum.get().tolist(), from_root.get().tolist()]
inter.Free()
local.Free()
out["through host"] = {"allgatherv": gathered.get().tolist(), "gatherv": rooted.get().tolist(),
                       "scatterv": scattered.get().tolist(), "ialltoallv": recvs.get().tolist(),
                       "reduce_scatter": rs_out.get().tolist(), "scan": inclusive.get().tolist(),
                       "exscan": exclusive.get().tolist() if r else None, "neighbours": neighbours.get().tolist()}

# reductions with ops the GPU path lacks: through host memory, on every rank alike
flags = cp.asarray([[1, 0, 1, 1, 0], [1, 1, 0, 1, 0]][r], cp.int32)
land = cp.full(5, -1, cp.int32)
comm.Allreduce(flags, land, op=MPI.LAND)
lor = cp.full(5, -1, cp.int32)
comm.Ireduce(flags, lor if r == 0 else None, op=MPI.LOR, root=0).Wait()
absmax = MPI.Op.Create(lambda x, y, t: np.copyto(np.frombuffer(y, np.float64),
                                                 np.maximum(np.abs(np.frombuffer(x, np.float64)),
                                                            np.abs(np.frombuffer(y, np.float64)))), commute=True)
signed = cp.asarray([[-3.0, 1.0], [2.0, -0.5]][r])
comm.Allreduce(MPI.IN_PLACE, signed, op=absmax)
absmax.Free()
local = cp.arange(4, dtype=cp.int32)
MPI.SUM.Reduce_local(cp.full(4, 10, cp.int32), local)
cp.cuda.get_current_stream().synchronize()
if r == 0:  # a synchronous send of a GPU buffer: from a host copy
    comm.Ssend(cp.arange(4, dtype=cp.float32), 1, tag=9)
    comm.Issend([cp.arange(6, dtype=cp.int64), 3, MPI.INT64_T], 1, tag=10).Wait()
else:
    synced, isynced = cp.zeros(4, cp.float32), np.zeros(3, np.int64)
    comm.Recv(synced, 0, 9)
    comm.Recv(isynced, 0, 10)
    cp.cuda.get_current_stream().synchronize()
    out["ssend"] = [synced.get().tolist(), isynced.tolist()]
out["host ops"] = {"land": land.get().tolist(), "lor": lor.get().tolist() if r == 0 else None,
                   "user": signed.get().tolist(), "reduce_local": local.get().tolist()}

# derived datatypes over GPU memory: packed on the device, the GPU path moves the packed copy
five = MPI.FLOAT.Create_contiguous(5).Commit()
every_other = MPI.FLOAT.Create_vector(2, 1, 2).Commit()
shown = cp.full(5, float(10 + r), cp.float32)
comm.Bcast([shown, 1, five], root=1)
strided = cp.asarray([1.0, -1.0, 2.0, -2.0], cp.float32) * (r + 1)
comm.Allreduce(MPI.IN_PLACE, [strided, 1, every_other], op=MPI.SUM)
gathered_strided = cp.full(4 * n, -1.0, cp.float32)
comm.Iallgather([cp.asarray([5.0 + r, 0.0, 6.0 + r, 0.0], cp.float32), 1, every_other],
                [gathered_strided, 2, MPI.FLOAT]).Wait()
five.Free()
every_other.Free()
# a matched probe of a message from host memory, received into GPU memory
if r == 0:
    comm.Send(np.arange(3, dtype=np.float64), 1, tag=11)
elif r == 1:
    matched = cp.full(4, -1.0, cp.float64)
    comm.Mprobe(0, 11).Recv(matched)
# one-sided operations with GPU origins and results (a host window): through host copies
win = MPI.Win.Allocate(4 * 8, 8, comm=comm)
window = np.frombuffer(win.tomemory(), np.float64)
window[:] = 100.0 * r
win.Fence()
peer = (r + 1) % n
win.Put(cp.asarray([1.0 + r, 2.0 + r]), peer, (0, 2, MPI.DOUBLE))
win.Accumulate(cp.asarray([5.0]), peer, (3, 1, MPI.DOUBLE), op=MPI.SUM)
win.Fence()
fetched, old = cp.full(4, -1.0, cp.float64), cp.full(1, -1.0, cp.float64)
win.Get(fetched, peer)
win.Fence()
win.Fetch_and_op(cp.asarray([1.0]), old, peer, 2, op=MPI.SUM)
win.Fence()
out["rma"] = [fetched.get().tolist(), old.get().tolist(), window.tolist()]
win.Free()
cp.cuda.get_current_stream().synchronize()
out["derived"] = {"bcast": shown.get().tolist(), "allreduce": strided.get().tolist(),
                  "iallgather": gathered_strided.get().tolist()[:2 * n]}
if r == 1:
    out["mrecv"] = matched.get().tolist()


class HostInterface:
    """__cuda_array_interface__ over host memory: not device memory, whatever it claims."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = {"version": 3, "shape": array.shape, "typestr": array.dtype.str,
                                         "data": (array.ctypes.data, False), "strides": None}


# Alltoallw from MPI.BOTTOM with the addresses of GPU arrays: their blocks through host copies
sb, rb = cp.arange(3 * n, dtype=cp.float64) + 10 * r, cp.full(3 * n, -1.0, cp.float64)
sa, ra = MPI.Get_address(sb), MPI.Get_address(rb)
comm.Alltoallw([MPI.BOTTOM, ([3] * n, [sa + 24 * k for k in range(n)]), [MPI.DOUBLE] * n],
               [MPI.BOTTOM, ([3] * n, [ra + 24 * k for k in range(n)]), [MPI.DOUBLE] * n])
out["bottom"] = rb.get().tolist()
# Pack/Unpack, MPI-IO and a complex PROD on GPU buffers: through host copies
src, back, packed = cp.arange(4, dtype=cp.float64) + r, cp.zeros(4, cp.float64), cp.zeros(64, cp.uint8)
position = MPI.DOUBLE.Pack(src, packed, 0, comm)
MPI.DOUBLE.Unpack(packed, 0, back, comm)
z = cp.full(2, complex(1, r + 1), cp.complex128)
comm.Allreduce(MPI.IN_PLACE, z, op=MPI.PROD)   # (1+1j)(1+2j) on 2 ranks
path = comm.bcast(tempfile.mktemp(prefix="gpucoll-mpi-gpu-") if r == 0 else None, root=0)
fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
fh.Write_at(r * 32, cp.arange(4, dtype=cp.float64) + 10 * r)
comm.Barrier()
from_file = cp.zeros(4, cp.float64)
fh.Read_at((n - 1 - r) * 32, from_file)
fh.Close()
comm.Barrier()
if r == 0:
    os.unlink(path)
out["staged calls"] = [position, back.get().tolist(), [complex(v) == complex(-1, 3) for v in z.get()],
                       from_file.get().tolist()]

h_in, h_out = HostInterface(np.full(3, r + 1.0)), HostInterface(np.zeros(3))
comm.Allreduce(h_in, h_out, op=MPI.SUM)
out["host_interface"] = h_out.array.tolist()
print("RESULT " + json.dumps(out), flush=True)
