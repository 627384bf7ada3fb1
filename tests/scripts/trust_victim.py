"""A two-rank job that an attacker on the same host goes after (tests/test_trust_net.py).

    gpurun -np 2 python trust_victim.py MODE DIR

The ranks say where they listen (`ADDR {json}` on rank 1: the address of its one listener,
under "p2p" and "tcp", `PID {pid}` on every rank), then wait until the test creates DIR/go, so the
attacker strikes first. MODE:
  tcp     (GPUCOLL_SHM_DISABLE=1) an Allreduce of [rank + 1] * 4 over TCP, rank 0 a second
          late (an impostor that connected as rank 0 is there before it); prints RESULT
          {values, seconds}.
  p2p     (GPUCOLL_SHM_DISABLE=1, GPUCOLL_NSOCKS=1) rank 0 opens its point-to-point channel to
          rank 1 through the address in DIR/proxy (a recorder the test runs) and sends a first
          message on it, then, after DIR/go, "real" with tag 7; rank 1 prints RESULT {got,
          seconds} for its recv(source=0, tag=7).
  listen  nothing more: the test looks at the listening sockets of the ranks' pids.
"""
import json
import os
import sys
import time

import numpy as np

import gpucoll
import gpucoll.api.world as world

mode, where = sys.argv[1], sys.argv[2]
comm = gpucoll.COMM_WORLD
ctx = world.world().seam.context
print(f"PID {os.getpid()}", flush=True)
if comm.rank == 1:
    print("ADDR " + json.dumps({"p2p": ctx.tcp_addresses[1], "tcp": ctx.tcp_addresses[1]}), flush=True)


def wait_for(name):
    path = os.path.join(where, name)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.02)
    with open(path) as f:
        return f.read().strip()


if mode == "tcp":
    wait_for("go")
    if comm.rank == 0:
        time.sleep(1.0)
    x = np.full(4, comm.rank + 1.0)
    start = time.monotonic()
    comm.Allreduce(gpucoll.IN_PLACE, x)
    print("RESULT " + json.dumps({"values": x.tolist(), "seconds": time.monotonic() - start}), flush=True)
elif mode == "p2p":
    if comm.rank == 0:
        ctx.tcp_addresses[1] = wait_for("proxy")  # the first connection (the channel's stripe) is recorded
        comm.send("warm-up", 1, tag=3)
    else:
        assert comm.recv(source=0, tag=3) == "warm-up"
        print("WARM", flush=True)
    wait_for("go")
    start = time.monotonic()
    if comm.rank == 0:
        comm.send("real", 1, tag=7)
    else:
        got = comm.recv(source=0, tag=7)
        print("RESULT " + json.dumps({"got": repr(got), "seconds": time.monotonic() - start}), flush=True)
elif mode == "listen":
    wait_for("go")
comm.Barrier()
