"""Collectives across hosts with exact results: prints RESULT {json} per rank.

    gpurun --hosts a:2,b:2 ... python multihost_cases.py [--die-rank R] [--bytes N]
"""
import argparse
import json
import os
import signal
import socket
import time

import numpy as np

import gpucoll
import gpucoll.api.world

parser = argparse.ArgumentParser()
parser.add_argument("--die-rank", type=int, default=-1, help="this rank kills its host's agent after warm-up")
parser.add_argument("--bytes", type=int, default=1 << 20, help="size of the large allreduce")
args = parser.parse_args()

comm = gpucoll.COMM_WORLD
r, p = comm.rank, comm.size
ok = {}
for n in (1, 7, 1000, args.bytes // 8):
    x = (np.arange(n, dtype=np.int64) + 1) * (r + 1)
    comm.Allreduce(gpucoll.IN_PLACE, x)
    ok[f"allreduce_{n}"] = bool((x == (np.arange(n) + 1) * (p * (p + 1) // 2)).all())
f = np.full(4096, r + 0.5, np.float64)
comm.Allreduce(gpucoll.IN_PLACE, f, op=gpucoll.MAX)
ok["allreduce_max"] = bool((f == p - 0.5).all())
v = np.full(3000, r + 1.0)
comm.Allreduce(gpucoll.IN_PLACE, v, op=gpucoll.AVG)
ok["allreduce_avg"] = bool((v == (p + 1) / 2).all())
b = np.arange(3000, dtype=np.int32) if r == p - 1 else np.zeros(3000, np.int32)
comm.Bcast(b, root=p - 1)
ok["bcast"] = bool((b == np.arange(3000)).all())
g = np.empty(p * 5, np.int64)
comm.Allgather(np.full(5, r, np.int64), g)
ok["allgather"] = bool((g == np.repeat(np.arange(p), 5)).all())
rs = np.empty(6, np.int64)
comm.Reduce_scatter_block(np.arange(6 * p, dtype=np.int64), rs)
ok["reduce_scatter"] = bool((rs == p * np.arange(6 * r, 6 * r + 6)).all())
a = np.empty(p * 3, np.int64)
comm.Alltoall(np.arange(p * 3, dtype=np.int64) + 100 * r, a)
ok["alltoall"] = bool((a == np.concatenate([100 * s + np.arange(3 * r, 3 * r + 3) for s in range(p)])).all())
hosts_seen = comm.allgather(socket.gethostname())  # every rank's host name, in rank order (the test compares)
comm.Barrier()
ctx = gpucoll.api.world.world().seam.context
listen = [ctx.tcp_addresses[r]]  # where this rank's one listener is bound
print("RESULT " + json.dumps({"rank": r, "size": p, "host": socket.gethostname(), "local_rank": comm.local_rank,
                              "local_size": comm.local_size, "ok": ok, "listen": listen,
                              "hosts_seen": hosts_seen}), flush=True)
if args.die_rank >= 0:
    if r == args.die_rank:
        os.kill(os.getppid(), signal.SIGKILL)   # the host's agent: the whole host is lost
    x = np.ones(1024)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        comm.Allreduce(gpucoll.IN_PLACE, x)
        time.sleep(0.01)
