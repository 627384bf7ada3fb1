"""Shared memory only the job can touch, fork refusal, Fortran order (for tests/test_trust_shm.py).

    gpurun -np N python trust_shm.py MODE [ARGS]     # prints "RESULT {json}" on every rank

Segments are the direct ones, or with GPUCOLL_ALGO=ring those of the rank pairs.

MODE:
  squat-user PY   rank 0 has another user (uid 65534, through setpriv, running interpreter PY)
                  create the files of the next communicator's segments, mode 0666, holding
                  segments formatted with this job's own token and creator pid: all that an
                  attacker who learnt the names could make. Then every rank calls Allreduce on
                  that communicator: per rank the error and how long it took; rank 0 also
                  reports whether every planted file still holds what the squatter wrote.
  squat-token     the same, but this user (rank 0) plants the files, mode 0600, formatted with
                  the token of another secret.
  fork            after a warm-up Allreduce (which installs the host fast path) each rank issues
                  an Iallreduce (rank 1 a second later, so that rank 0's is still running) and
                  forks; the child calls collectives (rank 0's also waits on that request), then
                  Free, and exits normally; it reports what each call raised. The parent then
                  completes the request and checks a few collectives' results.
  fortran         Allreduce (general path, fast path, in place, mixed orders), Bcast, Reduce and
                  Allgather on Fortran-ordered arrays, checked exactly; a non-contiguous buffer
                  must still raise.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import gpucoll
from gpucoll import IN_PLACE
from gpucoll._native import core, direct
from gpucoll.base.errors import GpucollError, InvalidUsageError
from gpucoll.transports import shm_direct, shm_segment
from gpucoll.transports.shm import ShmChannels
from gpucoll.transports.shm_segment import JobSegments

HERE = os.path.dirname(os.path.abspath(__file__))
mode = sys.argv[1]
comm = gpucoll.COMM_WORLD
rank, size = comm.rank, comm.size
pairs = os.environ.get("GPUCOLL_ALGO") == "ring"


def error_info(exc, start):
    return {"type": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}


# ---- squatted names ------------------------------------------------------------------------

def next_segments():
    """{path: (kind, creator rank)} of the segments the next Dup() of COMM_WORLD will use."""
    segs = JobSegments(comm.seam.context.job_id, comm.seam.context.secret)
    next_id = f"{comm.seam.id}.d{comm._children + 1}"  # the name Dup() gives it
    if not pairs:
        return {shm_direct.segment_path(segs, next_id): ("direct", 0)}
    return {ShmChannels(segs, f"{next_id}/coll", a).path(b): ("pair", a)
            for a in range(size) for b in range(a + 1, size)}


def image(kind, path, token, creator):
    """The bytes of a formatted segment as the job would make it, with `token` (a channel's
    creator pid is this process's)."""
    if kind == "direct":
        img = bytearray(direct.segment_size(size, 4096))
        direct.format_segment(img, size, 4096, comm.seam.context.pids[creator], token)
        return bytes(img)
    fd, tmp = tempfile.mkstemp()
    try:
        chan = core.ShmChannel.create(fd, os.path.basename(path), 4096, token, shm_segment.PIDNS)
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        chan.close()
        return data
    finally:
        os.close(fd)
        os.unlink(tmp)


def plant_as_other_user(python):
    """The squatter process (uid 65534) and what it planted: {path: sha256}."""
    segs = JobSegments(comm.seam.context.job_id, comm.seam.context.secret)
    images = {path: image(kind, path, segs.token(path), creator).hex()
              for path, (kind, creator) in next_segments().items()}
    squatter = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python,
                                 os.path.join(HERE, "shm_squatter.py")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    squatter.stdin.write(json.dumps(images) + "\n")
    squatter.stdin.flush()
    told = json.loads(squatter.stdout.readline())
    assert told["uid"] == 65534, told
    return squatter, told["files"]


def plant_as_this_user():
    """Files of this user, mode 0600, holding segments with another secret's token."""
    other = JobSegments(comm.seam.context.job_id, b"not this job's secret")
    planted = {}
    for path, (kind, creator) in next_segments().items():
        data = image(kind, path, other.token(path), creator)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.close(fd)
        planted[path] = hashlib.sha256(data).hexdigest()
    return None, planted


def unchanged(planted):
    same = True
    for path, digest in planted.items():
        with open(path, "rb") as f:
            same &= hashlib.sha256(f.read()).hexdigest() == digest
    return same


if mode in ("squat-user", "squat-token"):
    squatter, planted = None, {}
    if rank == 0:
        squatter, planted = plant_as_other_user(sys.argv[2]) if mode == "squat-user" else plant_as_this_user()
    comm.Barrier()  # the names are taken before anyone makes the next communicator
    dup = comm.Dup()
    x = np.full(8, rank + 1.0)
    start = time.monotonic()
    try:
        dup.Allreduce(IN_PLACE, x)
        out = {"type": "none", "elapsed": time.monotonic() - start, "result": x.tolist()}
    except GpucollError as exc:
        out = error_info(exc, start)
    y = np.ones(4)
    comm.Allreduce(IN_PLACE, y)  # the job goes on over the communicators it had
    out["after"] = y.tolist()
    comm.Barrier()  # every rank is done with the names before the squatter goes
    if rank == 0:
        out["files"] = sorted(planted)
        out["unchanged"] = unchanged(planted)
        if squatter is not None:
            squatter.stdin.close()
            squatter.wait(10)
    print("RESULT " + json.dumps(out), flush=True)

# ---- fork ----------------------------------------------------------------------------------

elif mode == "fork":
    comm.Allreduce(IN_PLACE, np.ones(4))  # warm-up: installs the fast path on the direct engine
    out = {"fast_path": comm._fast.host is not None}
    if rank != 0:
        time.sleep(1.0)  # rank 0 forks while its Iallreduce waits for this rank
    p = np.ones(4)
    pending = comm.Iallreduce(IN_PLACE, p)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        calls = {
            "Allreduce": lambda: comm.Allreduce(IN_PLACE, np.ones(4)),
            "Allreduce float32": lambda: comm.Allreduce(np.ones(3, np.float32), np.empty(3, np.float32)),
            "Bcast": lambda: comm.Bcast(np.ones(4), root=0),
            "Barrier": comm.Barrier,
            "Iallreduce": lambda: comm.Iallreduce(IN_PLACE, np.ones(4)).Wait(),
            "allgather": lambda: comm.allgather(rank),
            "send": lambda: comm.send("x", dest=(rank + 1) % size),
            "Dup": comm.Dup,
        }
        if rank == 0:  # the parent's request, running at the fork: its worker thread is not here
            calls["pending Wait"] = pending.Wait
        said = {}
        for name, call in calls.items():
            try:
                call()
                said[name] = "no error"
            except InvalidUsageError as exc:
                said[name] = "InvalidUsageError: " + str(exc)
            except Exception as exc:  # reported: the test shows what it was
                said[name] = f"{type(exc).__name__}: {exc}"
        comm.Free()  # must not close anything of the parent's
        os.write(write_end, json.dumps(said).encode())
        os.close(write_end)
        sys.exit(0)  # a normal exit: the interpreter's teardown must leave the parent's transports alone
    os.close(write_end)
    with os.fdopen(read_end) as f:
        out["child"] = json.loads(f.read() or "{}")
    out["child_exit"] = os.waitpid(pid, 0)[1]
    pending.Wait()
    out["pending"] = p.tolist()
    results = []
    for i in range(3):
        x = np.full(1000, rank + i, np.float64)
        comm.Allreduce(IN_PLACE, x)
        b = np.full(5, float(rank == 0) * (i + 7))
        comm.Bcast(b, root=0)
        results.append([float(x[0]), float(x[-1]), float(b[0])])
    d = comm.Dup()
    z = np.full(3, rank + 1, np.int64)
    d.Allreduce(IN_PLACE, z)
    out["parent"] = results
    out["dup"] = z.tolist()
    print("RESULT " + json.dumps(out), flush=True)

# ---- Fortran order -------------------------------------------------------------------------

elif mode == "fortran":
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    want = sum(base + q for q in range(size))
    out = {"failures": []}

    def check(name, got, expected):
        if got.shape != expected.shape or not np.array_equal(got, expected):
            out["failures"].append(f"{name}: got {got.tolist()} want {expected.tolist()}")

    for i in range(3):  # the first call installs the host fast path (direct engine), later ones use it
        x = np.asfortranarray(base + rank)
        y = np.empty((3, 4), order="F")
        comm.Allreduce(x, y)
        check(f"allreduce #{i}", y, want)
        comm.Allreduce(IN_PLACE, x)
        check(f"in place #{i}", x, want)
    out["fast_path"] = comm._fast.host is not None or pairs
    # Elements go in memory order, as in MPI: a C-ordered receive buffer gets them in that order.
    c = np.empty((3, 4))
    comm.Allreduce(np.asfortranarray(base + rank), c)
    check("Fortran into C order", c.reshape(-1), want.reshape(-1, order="F"))
    b = np.asfortranarray(base * (rank + 1))
    comm.Bcast(b, root=0)
    check("bcast", b, base)
    r = np.empty((3, 4), order="F")
    comm.Reduce(np.asfortranarray(base + rank), r, root=0)
    if rank == 0:
        check("reduce", r, want)
    g = np.empty(12 * size)
    comm.Allgather(np.asfortranarray(base + rank), g)
    check("allgather", g, np.concatenate([(base + q).reshape(-1, order="F") for q in range(size)]))
    t = np.ones((4, 6)).T  # a transposed C array is Fortran-ordered
    comm.Allreduce(IN_PLACE, t)
    check("transposed", t, np.full((6, 4), float(size)))
    try:
        comm.Allreduce(IN_PLACE, np.ones((4, 6), order="F")[:, ::2])
        out["non_contiguous"] = "no error"
    except InvalidUsageError as exc:
        out["non_contiguous"] = str(exc)
    print("RESULT " + json.dumps(out), flush=True)
else:
    raise SystemExit(f"unknown mode {mode!r}")
