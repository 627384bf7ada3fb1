"""What gpucoll.MPI offers beyond the common path, and how it refuses what it lacks.

    gpurun -np 2 python mpi_names.py      -> "RESULT {json}" per rank
"""
import json

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
out = {"initialized": MPI.Is_initialized(), "version": list(MPI.Get_version())}

# names that mpi4py has and gpucoll does not provide: they exist, and calling them raises
# NotImplementedError naming the missing piece (what programs probing for a feature catch)
missing = {}
for name, call in (("Get_hw_resource_info", lambda: MPI.Get_hw_resource_info()),
                   ("Register_datarep", lambda: MPI.Register_datarep("mine", None, None, None))):
    try:
        getattr(MPI, name)  # the name itself is there
        call()
        missing[name] = "no error"
    except NotImplementedError as exc:
        missing[name] = str(exc)
out["missing"] = missing
try:  # a pair reduction on a buffer of plain doubles: MAXLOC needs (value, index) pairs
    comm.Allreduce(MPI.IN_PLACE, [np.zeros(2), MPI.DOUBLE], op=MPI.MAXLOC)
    out["allreduce_maxloc"] = "no error"
except MPI.Exception as exc:
    out["allreduce_maxloc"] = [str(exc), exc.Get_error_class() == MPI.ERR_OP]
try:
    MPI.NO_SUCH_NAME
except AttributeError as exc:
    out["unknown_name"] = str(exc)

# COMM_SELF, Split with MPI.UNDEFINED, [buf, count, datatype], Datatype sizes, requests
self_comm = MPI.COMM_SELF
x = np.array([comm.Get_rank() + 1.0])
self_comm.Allreduce(MPI.IN_PLACE, [x, MPI.DOUBLE], op=MPI.SUM)
out["comm_self"] = [self_comm.Get_size(), self_comm.Get_rank(), float(x[0]), MPI.COMM_SELF is self_comm]
sub = comm.Split(MPI.UNDEFINED if comm.Get_rank() == 0 else 1, 0)
out["split_undefined_is_null"] = sub == MPI.COMM_NULL
buf = np.arange(6, dtype=np.int32) * (comm.Get_rank() + 1)
comm.Allreduce(MPI.IN_PLACE, [buf, 4, MPI.INT], op=MPI.SUM)  # only the first 4 elements
out["count_spec"] = buf.tolist()
out["sizes"] = [MPI.DOUBLE.Get_size(), MPI.INT.Get_size(), MPI.BYTE.Get_size(), MPI.FLOAT.Get_size()]
reqs = [comm.Iallreduce(MPI.IN_PLACE, [np.ones(3), MPI.DOUBLE]) for _ in range(3)]
MPI.Request.Waitall(reqs)
out["waitall"] = True
out["exception_is_base"] = issubclass(MPI.Exception, Exception)
# PROC_NULL: the edge of a non-periodic halo exchange; nothing is sent or received
edge = np.full(2, 7.0)
st = MPI.Status()
comm.Sendrecv(np.ones(2), dest=MPI.PROC_NULL, recvbuf=edge, source=MPI.PROC_NULL, status=st)
obj = comm.sendrecv("x", dest=MPI.PROC_NULL, source=MPI.PROC_NULL)
MPI.Request.Waitall([comm.Isend(np.ones(2), dest=MPI.PROC_NULL), comm.Irecv(edge, source=MPI.PROC_NULL)])
out["proc_null"] = [edge.tolist(), st.Get_source(), st.Get_tag(), st.Get_count(), obj]
MPI.Finalize()
print("RESULT " + json.dumps(out), flush=True)
