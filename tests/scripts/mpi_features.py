"""gpucoll.MPI's mpi4py features beyond the common path, with exact results.

    gpurun -np 3 python mpi_features.py      -> "RESULT {json}" per rank

Each entry of the result is what one feature gave on this rank; tests/test_mpi_features.py
computes what it must be and compares.
"""
import json
import pickle

import numpy as np

from gpucoll import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {}
right, left = (r + 1) % n, (r - 1) % n

# --- Status ---------------------------------------------------------------------------
st = MPI.Status()
comm.Sendrecv(np.arange(5, dtype="i") + r, right, 7, recvbuf=np.zeros(8, "i"), source=left, recvtag=7, status=st)
copy = MPI.Status(st)
copy.Set_elements(MPI.INT, 3)
mem = st.tomemory()
out["status"] = [st.Get_source(), st.Get_tag(), st.Get_error(), st.Get_count(MPI.INT), st.Get_count(MPI.BYTE),
                 st.Get_elements(MPI.INT), st.Get_count(MPI.DOUBLE), st.Is_cancelled(), copy.Get_count(MPI.INT),
                 list(mem)[:3], pickle.loads(pickle.dumps(st)).Get_source()]

# --- Request arrays: Testany/Waitany/Waitsome/Testsome, REQUEST_NULL among them ----------------
bufs = [np.zeros(2, "i") for _ in range(3)]
reqs = [comm.Irecv(bufs[k], left, 10 + k) for k in range(3)] + [MPI.REQUEST_NULL]
first = MPI.Request.Testany(reqs)  # nothing sent yet: (UNDEFINED, False)
comm.Barrier()                      # (nobody sends before every rank has tested)
for k in (2, 0, 1):
    comm.Send(np.array([r, k], "i"), right, 10 + k)
got = []
while True:
    done = MPI.Request.Waitsome(reqs)
    if done is None:
        break
    got.extend(done)
status = MPI.Status()
flag = MPI.REQUEST_NULL.Get_status(status)
out["requests"] = [list(first), sorted(got), [b.tolist() for b in bufs], all(not q for q in reqs[:3]), flag,
                   status.Get_source(), MPI.Request.Waitany([MPI.REQUEST_NULL, MPI.Request()]),
                   MPI.Request.Testsome([MPI.REQUEST_NULL])]
# a window of Isends and Irecvs completed by one Waitall (no statuses): every buffer, every handle null;
# then a window whose third receive is too small: Waitall raises the truncation, the others complete
for window in range(2):
    wins = [np.full(3, -1, "i") for _ in range(8)]
    if window == 1:
        wins[2] = np.full(2, -1, "i")
    reqs = [comm.Irecv(w, left, 40 + window) for w in wins]
    reqs += [comm.Isend(np.array([r, window, k], "i"), right, 40 + window) for k in range(8)]
    try:
        MPI.Request.Waitall(reqs)
        error = None
    except MPI.Exception as exc:
        error = exc.Get_error_class()
    out[f"window{window}"] = [[w.tolist() for w in wins], [bool(q) for q in reqs], error]
# persistent point to point: three rounds of one request pair
sendbuf, recvbuf = np.zeros(1, "i"), np.zeros(1, "i")
pair = [comm.Send_init(sendbuf, right, 5), comm.Recv_init(recvbuf, left, 5)]
seen = []
for round_ in range(3):
    sendbuf[0] = 100 * round_ + r
    MPI.Prequest.Startall(pair)
    MPI.Request.Waitall(pair)
    seen.append(int(recvbuf[0]))
out["persistent"] = [seen, all(bool(q) for q in pair), MPI.Request.Waitany(pair)]
for q in pair:
    q.Free()

# --- buffer specifications: type characters, counts with displacements, None with PROC_NULL -------------
a = np.arange(6, dtype="d") + 10 * r
comm.Allreduce(MPI.IN_PLACE, [a, "d"], op=MPI.SUM)
b = np.full(6, -1, "i")
comm.Bcast([b, (2, 3), MPI.INT], root=0) if r else comm.Bcast([np.arange(6, dtype="i"), (2, 3), "i"], root=0)
comm.Send(None, MPI.PROC_NULL)
comm.Recv(None, MPI.PROC_NULL)
pst = MPI.Status()
comm.Sendrecv(None, MPI.PROC_NULL, recvbuf=None, source=MPI.PROC_NULL, status=pst)
out["specs"] = [a.tolist(), b.tolist(), pst.Get_source(), pst.Get_count()]

# --- logical ops, MAXLOC/MINLOC on pair types, long double ------------------------------------------
x = np.array([r == 0, r > 0, r == 1, 0], "i")
land, lor, lxor = (np.zeros(4, "i") for _ in range(3))
comm.Allreduce(x, land, op=MPI.LAND)
comm.Allreduce(x, lor, op=MPI.LOR)
comm.Allreduce(x, lxor, op=MPI.LXOR)
pairs = np.zeros(3, dtype=np.dtype([("value", "f8"), ("index", "i4")], align=True))  # C struct {double; int}
pairs["value"] = [r % 2, -r, 5.0]   # a tie on the first and last: the lowest index wins
pairs["index"] = r
maxloc, minloc = np.zeros_like(pairs), np.zeros_like(pairs)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [maxloc, MPI.DOUBLE_INT], op=MPI.MAXLOC)
comm.Allreduce([pairs, MPI.DOUBLE_INT], [minloc, MPI.DOUBLE_INT], op=MPI.MINLOC)
fpairs = np.zeros(1, dtype=[("value", "f4"), ("index", "i4")])
fpairs["value"], fpairs["index"] = float(r * r), r
fmax = np.zeros_like(fpairs)
comm.Reduce([fpairs, MPI.FLOAT_INT], [fmax, MPI.FLOAT_INT], op=MPI.MAXLOC, root=n - 1)
ld = np.full(2, r + 0.5, np.longdouble)
comm.Allreduce(MPI.IN_PLACE, [ld, MPI.LONG_DOUBLE], op=MPI.SUM)
out["reductions"] = [land.tolist(), lor.tolist(), lxor.tolist(),
                     [[float(v), int(i)] for v, i in maxloc.tolist()], [[float(v), int(i)] for v, i in minloc.tolist()],
                     [float(fmax["value"][0]), int(fmax["index"][0])] if r == n - 1 else None,
                     [float(v) for v in ld]]


# --- user-defined ops (rank order of a non-commutative one), Reduce_local, Scan/Exscan ----------------
def concat(invec, inoutvec, datatype):
    """inoutvec = invec 'then' inoutvec, as digits: not commutative, so the order shows."""
    a_, b_ = np.frombuffer(invec, "i8"), np.frombuffer(inoutvec, "i8").copy()
    inoutvec[:] = (a_ * 10 ** np.floor(np.log10(np.maximum(b_, 1)) + 1).astype("i8") + b_).view(np.uint8)


digits = MPI.Op.Create(concat, commute=False)
mine = np.array([r + 1, 9 - r], "i8")
allcat, scancat = np.zeros(2, "i8"), np.zeros(2, "i8")
comm.Allreduce(mine, allcat, op=digits)
comm.Scan(mine, scancat, op=digits)
ex = np.full(2, -7, "i8")
comm.Exscan(mine, ex, op=MPI.SUM)
local_in, local_out = np.array([1, 2], "i8"), np.array([3, 4], "i8")
digits.Reduce_local(local_in, local_out)
digits.Free()
out["userops"] = [allcat.tolist(), scancat.tolist(), ex.tolist(), local_out.tolist(),
                  comm.allreduce(r + 1, op=MPI.PROD), comm.exscan(r + 1), comm.scan([r])]

# --- communicators: names, Clone, Idup, Compare, groups, Create, Create_group, Split, Split_type -----------
clone = comm.Clone()
clone.Set_name("mine")
dup, req = comm.Idup()
req.Wait()
evens = comm.Get_group().Incl(list(range(0, n, 2)))
created = comm.Create(evens)
grouped = comm.Create_group(evens) if r % 2 == 0 else MPI.COMM_NULL
odd_out = comm.Split(MPI.UNDEFINED if r % 2 else 0, -r)
shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
none_shared = comm.Split_type(MPI.UNDEFINED)
out["comms"] = [clone.Get_name(), comm.Get_name(), MPI.COMM_NULL.Get_name(), MPI.Comm.Compare(comm, clone),
                MPI.Comm.Compare(comm, comm), dup.Compare(clone), comm.Is_inter(), comm.Is_intra(),
                created.Get_size() if created else None, grouped.Get_rank() if grouped else None,
                odd_out.Get_rank() if odd_out else None, odd_out == MPI.COMM_NULL, shared.Get_size(),
                none_shared == MPI.COMM_NULL, evens.Translate_ranks([0, evens.Get_size() - 1], comm.Get_group()),
                comm.allgather(clone.Get_rank())]
for c in (clone, dup, created, grouped, odd_out, shared):
    if c:
        c.Free()

# --- point to point beyond Send/Recv: Sendrecv_replace, Isendrecv, Ssend, probes ------------------------------
rep = np.array([r, r * 10], "i")
comm.Sendrecv_replace(rep, right, 3, left, 3)
ibuf = np.zeros(2, "i")
q = comm.Isendrecv(np.array([r, -r], "i"), right, 4, ibuf, left, 4)
q.Wait()
if r == 0:  # an Issend is not complete before the receiver has matched it
    sreq = comm.Issend(np.array([42], "i"), right, 6)
    early = sreq.Test()
    comm.Send(np.zeros(0, "i"), right, 8)  # tells the receiver to receive now
    sreq.Wait()
    ssend_early = early
else:
    ssend_early = None
    if r == 1:
        comm.Recv(np.zeros(0, "i"), 0, 8)
        comm.Recv(np.zeros(1, "i"), 0, 6)
comm.Send(np.arange(3, dtype="d"), right, 9)
pst = MPI.Status()
comm.Probe(left, 9, pst)
msg = comm.Mprobe(left, 9)
got9 = np.zeros(3, "d")
msg.Recv(got9)
empty = comm.Isend([None, 0, "B"], right, 11)  # an empty message received as an object is None
as_object = comm.recv(None, left, 11)
empty.Wait()
out["p2p"] = [rep.tolist(), ibuf.tolist(), ssend_early, [pst.Get_source(), pst.Get_count(MPI.DOUBLE)], got9.tolist(),
              comm.Iprobe(left, 9), as_object]

# --- plain NumPy arrays (the short paths) and what must leave them -----------------------------------------
grid = np.arange(6, dtype="d").reshape(2, 3) + 10 * r
into = np.zeros((2, 3), "d")
qs = [comm.Irecv(into, MPI.ANY_SOURCE, MPI.ANY_TAG), comm.Isend(grid, right, 21)]
sts = [MPI.Status(), MPI.Status()]
MPI.Request.Waitall(qs, sts)
fortran = np.asfortranarray(np.arange(6, dtype="i").reshape(2, 3) + 10 * r)  # contiguous, not C-ordered
comm.Send(fortran, right, 23)
packed = np.zeros(6, "i")
rst = MPI.Status()
comm.Recv(packed, left, 23, rst)
readonly = np.zeros(2, "i")
readonly.flags.writeable = False
refused = {}
for name, call in (("readonly", lambda: comm.Irecv(readonly, left, 25)),
                   ("strided recv", lambda: comm.Irecv(np.zeros(8, "i")[::2], left, 25)),
                   ("strided send", lambda: comm.Isend(np.zeros(8, "i")[::2], right, 25)),
                   ("byte-swapped", lambda: comm.Isend(np.zeros(3, ">i4"), right, 25)),
                   ("truncated", lambda: comm.Sendrecv(np.arange(5, dtype="i"), right, 26, recvbuf=np.zeros(2, "i"),
                                                       source=left, recvtag=26))):
    try:
        call()
        refused[name] = "no error"
    except (MPI.Exception, BufferError, ValueError) as exc:
        refused[name] = [type(exc).__name__, exc.Get_error_class() if isinstance(exc, MPI.Exception) else None,
                         str(exc)]
out["plain"] = [into.tolist(), [sts[0].Get_source(), sts[0].Get_tag(), sts[0].Get_count(MPI.DOUBLE)],
                packed.tolist(), [rst.Get_source(), rst.Get_tag(), rst.Get_count(MPI.INT)], refused]

# --- errors: MPI.Exception with error classes ---------------------------------------------------------------
errors = {}
for name, call, expected in (("root", lambda: comm.Bcast(np.zeros(1), root=n), MPI.ERR_ROOT),
                             ("type", lambda: MPI.DATATYPE_NULL.Get_size(), MPI.ERR_TYPE),
                             ("op", lambda: MPI.SUM.Free(), MPI.ERR_OP),
                             ("comm", lambda: MPI.COMM_NULL.Get_size(), MPI.ERR_COMM)):
    try:
        call()
        errors[name] = "no error"
    except MPI.Exception as exc:
        errors[name] = [exc.Get_error_class() == expected, isinstance(exc, MPI.Exception)]
e = MPI.Exception(MPI.ERR_ARG)
out["errors"] = [errors, [int(e), e == MPI.ERR_ARG, repr(e), MPI.Get_error_class(MPI.ERR_ARG)]]


# --- DLPack CPU buffers --------------------------------------------------------------------------------------
class Tensor:
    """Exposes only DLPack (no buffer protocol): the path of CPU tensors such as torch's."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.array.__dlpack__() if max_version is None else self.array.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


dl_in, dl_out = Tensor(np.full(3, r + 1.0)), Tensor(np.zeros(3))
comm.Allreduce(dl_in, dl_out, op=MPI.MAX)
dl_gather = Tensor(np.zeros(2 * n, "i"))
comm.Allgather(Tensor(np.array([r, r * r], "i")), dl_gather)
out["dlpack"] = [dl_out.array.tolist(), dl_gather.array.tolist()]

# --- vector collectives, Reduce_scatter, Alltoallw ----------------------------------------------------------------
counts = [k + 1 for k in range(n)]            # rank k contributes k + 1 elements
displs = [sum(counts[:k]) + k for k in range(n)]  # with a gap of one element after each block
total = displs[-1] + counts[-1] + 1
vrecv = np.full(total, -1, "i")
comm.Allgatherv(np.full(r + 1, r, "i"), [vrecv, counts, displs, MPI.INT])
groot = np.full(total, -1, "i") if r == 0 else None
comm.Gatherv(np.full(r + 1, 10 + r, "i"), [groot, counts, displs, MPI.INT] if r == 0 else None, root=0)
scat = np.full(r + 1, -1, "i")
comm.Scatterv([np.arange(total, dtype="i"), counts, displs, MPI.INT] if r == n - 1 else None, scat, root=n - 1)
scounts = [(r + k) % 3 for k in range(n)]     # rank r sends (r + k) % 3 elements to rank k
rcounts = [(k + r) % 3 for k in range(n)]
sd = [sum(scounts[:k]) for k in range(n)]
rd = [sum(rcounts[:k]) for k in range(n)]
asend = np.array([100 * r + k for k in range(n) for _ in range(scounts[k])], "i")
arecv = np.full(sum(rcounts), -1, "i")
comm.Alltoallv([asend, scounts, sd, MPI.INT], [arecv, rcounts, rd, MPI.INT])
rs_counts = [k + 1 for k in range(n)]
rs_send = np.arange(sum(rs_counts), dtype="i") * (r + 1)
rs_recv = np.zeros(r + 1, "i")
comm.Reduce_scatter(rs_send, rs_recv, rs_counts, op=MPI.SUM)
wsend = np.array([r + 0.5] * n, "d")   # Alltoallw: byte displacements, a datatype per rank
wrecv = np.zeros(n, "d")
ireq = comm.Ialltoallw([wsend, [1] * n, [8 * k for k in range(n)], [MPI.DOUBLE] * n],
                       [wrecv, [1] * n, [8 * k for k in range(n)], [MPI.DOUBLE] * n])
ireq.Wait()
out["vector"] = [vrecv.tolist(), groot.tolist() if r == 0 else None, scat.tolist(), arecv.tolist(),
                 rs_recv.tolist(), wrecv.tolist()]

# --- derived datatypes: a strided column, a struct, Pack/Unpack --------------------------------------------------
matrix = np.arange(12, dtype="i").reshape(4, 3) * (1 if r == 0 else 0) - (0 if r == 0 else 1)
column = MPI.INT.Create_vector(4, 1, 3).Commit()
comm.Bcast([matrix, 1, column], root=0)  # column 0 only
column.Free()
rec = np.zeros(2, dtype=np.dtype([("a", "i4"), ("b", "f8")], align=True))  # C's struct {int; double}
point = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, MPI.DOUBLE]).Commit()
if r == 0:
    rec["a"], rec["b"] = [1, 2], [0.5, 1.5]
comm.Bcast([rec, point], root=0)
packed = bytearray(point.Pack_size(2))
end = point.Pack(rec, packed, 0)
back = np.zeros_like(rec)
point.Unpack(packed, 0, back)
out["datatypes"] = [matrix.tolist(), [[int(a_), float(b_)] for a_, b_ in rec.tolist()], end, point.Get_extent(),
                    back.tolist() == rec.tolist()]
point.Free()

# --- what gpucoll lacks: NotImplementedError naming it, at the call ---------------------------------------------
missing = {}
for name, call in (("Get_hw_resource_info", lambda: MPI.Get_hw_resource_info()),
                   ("Pack_external_size", lambda: MPI.INT.Pack_external_size("external32", 1)),
                   ("Register_datarep", lambda: MPI.Register_datarep("mine", None, None, None))):
    try:
        call()
        missing[name] = "no error"
    except NotImplementedError as exc:
        missing[name] = str(exc)
out["missing"] = missing

# --- the name service: one job-wide table in the store ---------------------------------------------------
port = MPI.Open_port()
MPI.Publish_name(f"svc-{r}", port)
comm.Barrier()
names = {"found": MPI.Lookup_name(f"svc-{(r + 1) % n}").startswith("gpucoll-port:")}
for what, call in (("twice", lambda: MPI.Publish_name(f"svc-{r}", "other")),
                   ("wrong_port", lambda: MPI.Unpublish_name(f"svc-{r}", "other"))):
    try:
        call()
        names[what] = "no error"
    except MPI.Exception as exc:
        names[what] = exc.Get_error_class() == MPI.ERR_SERVICE
comm.Barrier()
MPI.Unpublish_name(f"svc-{r}", port)
try:
    MPI.Lookup_name(f"svc-{r}")
    names["gone"] = "no error"
except MPI.Exception as exc:
    names["gone"] = exc.Get_error_class() == MPI.ERR_NAME
MPI.Close_port(port)
out["names"] = names
print("RESULT " + json.dumps(out), flush=True)
