"""gpucoll.MPI's sessions, partitioned point to point and fault-tolerance calls, exact results.

    gpurun -np 3 python mpi_sessions.py      -> "RESULT {json}" per rank

tests/test_mpi_sessions.py computes what each must be.
"""
import json
import time

import numpy as np

from gpucoll import MPI

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
out = {}

# --- sessions: the process sets, and a communicator made from one without a parent ------------------------
session = MPI.Session.Init()
names = [session.Get_nth_pset(k) for k in range(session.Get_num_psets())]
sizes = [session.Get_pset_info(name).Get("mpi_size") for name in names]
group = MPI.Group.Create_from_session_pset(session, "mpi://WORLD")
comm = MPI.Intracomm.Create_from_group(group, "org.gpucoll.test")
total = comm.allreduce(r)
try:
    session.Get_pset_info("mpi://NOWHERE")
    bad = "no error"
except MPI.Exception as exc:
    bad = exc.Get_error_class() == MPI.ERR_ARG
out["session"] = [names, sizes, group.Get_size(), comm.Get_rank(), total, MPI.Comm.Compare(world, comm), bad]
comm.Free()
session.Finalize()

# --- partitioned: 3 partitions of 2 ints to the right, marked ready in reverse order ---------------------------
right, left = (r + 1) % n, (r - 1) % n
sbuf, rbuf = np.arange(6, dtype="i") + 10 * r, np.full(6, -1, "i")
send = world.Psend_init(sbuf, 3, right, 4)
recv = world.Precv_init(rbuf, 3, left, 4)
rounds = []
for k in range(2):
    sbuf += 1
    recv.Start()
    world.Barrier()
    early = recv.Parrived(0)             # nothing is sent before every partition is ready:
    send.Start()
    send.Pready_list([2, 1])
    world.Barrier()
    time.sleep(0.2)                      # (time enough for a message sent too early to arrive)
    partial = recv.Parrived(2)           # not even the partitions marked ready
    world.Barrier()
    send.Pready(0)
    deadline = time.monotonic() + 30
    while not recv.Parrived(0) and time.monotonic() < deadline:  # the whole message now arrives
        time.sleep(0.001)
    arrived = recv.Parrived(1)
    recv.Wait()
    send.Wait()
    rounds.append([early, partial, arrived, rbuf.tolist()])
send.Free()
recv.Free()
out["partitioned"] = rounds

# --- fault-tolerance calls, in a job without failures -------------------------------------------------------
flag = np.array([0b1111 if r else 0b1011], np.intc)
req = world.Iagree(flag)
req.Wait()
shrunk = world.Shrink()
out["ulfm"] = [world.Agree(0b110 | r), int(flag[0]), world.Get_failed().Get_size(), world.Ack_failed(),
               world.Is_revoked(), shrunk.Get_size(), shrunk.Get_rank()]
shrunk.Free()
print("RESULT " + json.dumps(out), flush=True)
