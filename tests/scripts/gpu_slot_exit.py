"""GPU messages are read before Free or exit takes the sender's memory, and a slot timeout that
no call raised is still heard. GPUCOLL_TIMEOUT is T seconds. Both ranks first exchange one
message each way (every kernel compiled) and meet at a barrier, so the times below hold.

`free`: rank 1 sends one more small message than a pair's 32 slots on `lost`, a duplicate rank 0
never receives from, and frees it: Free waits for them, then raises the timeout naming rank 0.
It then leaves 33 unread small messages on `left` and ends: its exit reports that timeout.

`exit`: rank 1 sends two small messages on `left`, whose outbox rank 0 has not mapped yet, and
ends at once; rank 0 receives them T/2 seconds later, from rank 1's outbox, which rank 1's exit
must keep until they are read. Rank 0 checks both whole. (A large message keeps its sender
anyway: its stream waits until the message was read.)"""
import json
import os
import sys
import time

import cupy as cp

import gpucoll
from gpu_device import one_gpu_per_rank

comm = gpucoll.COMM_WORLD
one_gpu_per_rank(comm)
timeout = float(os.environ["GPUCOLL_TIMEOUT"])
mode = sys.argv[1]
lost, left = comm.Dup(), comm.Dup()
warm = cp.zeros(4, cp.int32)
comm.Sendrecv(cp.full(4, comm.rank, cp.int32), 1 - comm.rank, recvbuf=warm, source=1 - comm.rank)
comm.Barrier()
small = cp.arange(1000, dtype=cp.int32) * 3 + 7           # 4000 B
full = cp.arange(1 << 14, dtype=cp.int32) * 5 + 11        # 64 KiB: a whole slot
result = {"warm": bool((warm == 1 - comm.rank).all())}
if mode == "free" and comm.rank == 1:
    for i in range(33):
        lost.Send(cp.full(100, i, cp.uint8), 0, tag=i)
    try:
        lost.Free()
        result["free"] = None
    except gpucoll.TimeoutError as exc:
        result["free"] = str(exc)
    for i in range(33):
        left.Send(cp.full(100, i, cp.uint8), 0, tag=i)
    result["left"] = left.name
elif mode == "exit" and comm.rank == 1:
    left.Send(small, 0, tag=1)
    left.Send(full, 0, tag=2)
elif mode == "exit":
    time.sleep(timeout / 2)  # rank 1 ended meanwhile, unless its exit waits for these reads
    got_small, got_full = cp.zeros_like(small), cp.zeros_like(full)
    left.Recv(got_small, 1, tag=1)
    left.Recv(got_full, 1, tag=2)
    result["small"] = bool((got_small == small).all())
    result["full"] = bool((got_full == full).all())
print("RESULT " + json.dumps(result), flush=True)
