"""MPI's Spawn under gpurun (for tests/test_spawn.py).

    gpurun -np 2 python mpi_spawn.py parents     spawn 3 children of this script, talk, merge, disconnect
    gpurun -np 1 python mpi_spawn.py fails       a command that ends before joining; then a good spawn
    gpurun -np 1 python mpi_spawn.py limit       more processes than --universe-size allows
    gpurun -np 1 python mpi_spawn.py start DIR   how the children started (warmed or not, in DIR)
    gpurun -np 1 python mpi_spawn.py spin DIR    children that write DIR/pid.N and spin (to be killed)
    gpurun -np 2 python mpi_spawn.py late        children reach a parent that has not learned of them yet

Parents print "RESULT {json}", children "CHILD {json}".
"""
import sys

PRELOADED = "numpy" in sys.modules  # before any import of this script: forked from gpurun's warmed interpreter

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from gpucoll import MPI

mode = sys.argv[1]
world = MPI.COMM_WORLD
rank = world.Get_rank()


def spawn_error(call):
    try:
        call()
        return "no error"
    except MPI.Exception as exc:
        return [exc.Get_error_class() == MPI.ERR_SPAWN, str(exc)]


if mode == "child":
    parent = MPI.Comm.Get_parent()
    out = {"world": [rank, world.Get_size()], "remote": parent.Get_remote_size(),
           "same_handle": MPI.Comm.Get_parent() is parent}
    x = np.zeros(1)
    parent.Bcast(x, root=0)  # from the parents' rank 0
    out["bcast"] = float(x[0])
    parent.send(rank * 10, dest=rank % parent.Get_remote_size(), tag=7)
    merged = parent.Merge(high=True)
    out["merged"] = [merged.Get_rank(), merged.Get_size(), merged.allreduce(merged.Get_rank())]
    merged.Free()
    world.Barrier()  # the children's own COMM_WORLD works
    parent.Disconnect()
    out["after"] = [parent == MPI.COMM_NULL, MPI.Comm.Get_parent() == MPI.COMM_NULL]
    print("CHILD " + json.dumps(out), flush=True)
elif mode == "parents":
    codes = []
    out = {"parent_null": MPI.Comm.Get_parent() == MPI.COMM_NULL, "universe": world.Get_attr(MPI.UNIVERSE_SIZE)}
    child = world.Spawn(sys.executable, [__file__, "child"], 3, root=1, errcodes=codes)
    out["sizes"] = [child.Get_size(), child.Get_remote_size(), child.Get_rank()]
    out["errcodes"] = codes
    child.Bcast(np.full(1, 42.0), root=MPI.ROOT if rank == 0 else MPI.PROC_NULL)
    got = []
    for source in range(3):
        if source % 2 == rank:
            got.append(child.recv(source=source, tag=7))
    out["received"] = got
    merged = child.Merge(high=False)
    out["merged"] = [merged.Get_rank(), merged.Get_size(), merged.allreduce(merged.Get_rank())]
    merged.Free()
    child.Disconnect()
    print("RESULT " + json.dumps(out), flush=True)
elif mode == "fails":
    out = {"fails": spawn_error(lambda: MPI.COMM_SELF.Spawn(sys.executable, ["-c", "import sys; sys.exit(3)"], 1)),
           "missing": spawn_error(lambda: MPI.COMM_SELF.Spawn("/nonexistent/program", None, 1)),
           "bad_count": spawn_error(lambda: MPI.COMM_SELF.Spawn(sys.executable, ["-c", "pass"], 0))}
    try:
        MPI.COMM_SELF.Spawn_multiple([sys.executable], [["-c", "pass"]] * 2, [1])
        out["bad_lists"] = "no error"
    except ValueError as exc:
        out["bad_lists"] = str(exc)
    child = MPI.COMM_SELF.Spawn(sys.executable, [__file__, "child"], 1)  # the job goes on
    child.Bcast(np.full(1, 5.0), root=MPI.ROOT)
    out["then"] = child.recv(source=0, tag=7)
    merged = child.Merge()
    out["then_merged"] = merged.allreduce(1)
    merged.Free()
    child.Disconnect()
    print("RESULT " + json.dumps(out), flush=True)
elif mode == "limit":
    out = {"limit": spawn_error(lambda: MPI.COMM_WORLD.Spawn(sys.executable, ["-c", "pass"], 2)),
           "universe": MPI.COMM_WORLD.Get_attr(MPI.UNIVERSE_SIZE)}
    print("RESULT " + json.dumps(out), flush=True)
elif mode == "own-child":  # gpucoll's own API, in a process that comm.spawn started
    import gpucoll

    comm = gpucoll.parent()
    x = np.full(2, float(comm.rank))
    comm.Allreduce(gpucoll.IN_PLACE, x)
    print("CHILD " + json.dumps({"rank": [comm.rank, comm.size], "sum": x.tolist(),
                                 "again": gpucoll.parent() is comm}), flush=True)
elif mode == "own":
    import gpucoll

    comm = gpucoll.COMM_WORLD.spawn([sys.executable, __file__, "own-child"], nprocs=2, root=0)
    x = np.full(2, float(comm.rank))
    comm.Allreduce(gpucoll.IN_PLACE, x)
    try:
        gpucoll.COMM_WORLD.spawn([sys.executable, "-c", "pass"], nprocs=0)
        refused = "no error"
    except gpucoll.SpawnError as exc:
        refused = str(exc)
    print("RESULT " + json.dumps({"rank": [comm.rank, comm.size], "sum": x.tolist(), "parent": gpucoll.parent(),
                                  "refused": refused}), flush=True)
elif mode == "start-child":
    parent = MPI.Comm.Get_parent()
    print("CHILD " + json.dumps({"preloaded": PRELOADED, "cwd": os.getcwd(), "ppid": os.getppid(),
                                 "argv": sys.argv[1:], "name": __name__}), flush=True)
    parent.Barrier()
    parent.Disconnect()
elif mode == "start":
    info = MPI.Info.Create()
    info.Set("wdir", sys.argv[2])
    child = MPI.COMM_SELF.Spawn(sys.executable, [os.path.abspath(__file__), "start-child", "x y"], 2, info=info)
    child.Barrier()
    child.Disconnect()
    print("RESULT " + json.dumps({"gpurun": os.getppid()}), flush=True)
elif mode == "late-child":  # reaches parent 1 before that parent's Spawn has returned
    parent = MPI.Comm.Get_parent()
    parent.send(rank, dest=1, tag=3)
    parent.Disconnect()
elif mode == "late":
    if rank == 1:
        time.sleep(1.5)  # the children are up and sending to this rank before it knows of them
    child = world.Spawn(sys.executable, [os.path.abspath(__file__), "late-child"], 2, root=0)
    got = sorted(child.recv(source=s, tag=3) for s in range(2)) if rank == 1 else None
    child.Disconnect()
    print("RESULT " + json.dumps({"got": got}), flush=True)
elif mode == "spin-child":  # says its pid, then runs until killed
    path = os.path.join(sys.argv[2], f"pid.{rank}")
    with open(path + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".part", path)
    while True:
        pass
elif mode == "spin":
    MPI.COMM_SELF.Spawn(sys.executable, [os.path.abspath(__file__), "spin-child", sys.argv[2]], 2)
    while True:
        time.sleep(1)
else:
    sys.exit(f"unknown mode {mode}")
