"""gpucoll.MPI with GPU arrays: whole CuPy arrays (bare or as [array, datatype]) go to gpucoll's GPU
path; what it lacks raises NotImplementedError; an object with __cuda_array_interface__ over
host memory is a host buffer even where CUDA runs.

    gpurun -np 2 python mpi_gpu.py      -> "RESULT {json}" per rank
"""
import json

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
# probes of GPU messages (small: through an outbox slot; large: pulled) report the announced size
for count, tag in ((5, 6), (70_000, 7)):
    if r == 0:
        comm.Send(cp.arange(count, dtype=cp.float32), 1, tag=tag)
    elif r == 1:
        pst, ist = MPI.Status(), MPI.Status()
        comm.Probe(0, tag, pst)
        while not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, ist):
            pass
        try:
            comm.Mprobe(0, tag)
            mprobe = "no error"
        except NotImplementedError as exc:
            mprobe = str(exc)
        got = cp.zeros(count, cp.float32)
        comm.Recv(got, 0, tag)
        out[f"probe {count}"] = [pst.Get_source(), pst.Get_tag(), pst.Get_count(MPI.FLOAT), ist.Get_tag(),
                                 ist.Get_count(MPI.FLOAT), "matched probe" in mprobe,
                                 bool((got == cp.arange(count, dtype=cp.float32)).all())]
refused = {}
for name, call in (("land", lambda: comm.Allreduce(a, b, op=MPI.LAND)),
                   ("allgatherv", lambda: comm.Allgatherv(a, [cp.zeros(5 * n, cp.float32), [5] * n, None,
                                                                MPI.FLOAT]))):
    try:
        call()
        refused[name] = "no error"
    except NotImplementedError as exc:
        refused[name] = str(exc)
out["refused"] = refused


class HostInterface:
    """__cuda_array_interface__ over host memory: not device memory, whatever it claims."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = {"version": 3, "shape": array.shape, "typestr": array.dtype.str,
                                         "data": (array.ctypes.data, False), "strides": None}


h_in, h_out = HostInterface(np.full(3, r + 1.0)), HostInterface(np.zeros(3))
comm.Allreduce(h_in, h_out, op=MPI.SUM)
out["host_interface"] = h_out.array.tolist()
print("RESULT " + json.dumps(out), flush=True)
