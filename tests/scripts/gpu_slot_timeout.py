"""Small GPU messages whose slot kernels give up: rank 1 sends one more than a pair's 32 slots
before rank 0 receives any, so its last send's kernel waits for a free slot past
GPUCOLL_TIMEOUT; its next send raises naming rank 0, and rank 0's receive of that message
(whose bytes never came) raises naming rank 1. The 32 before it arrive intact. Both ranks first
exchange one message each way (every kernel compiled: a first compile can take seconds) and meet
at a barrier, so the stall starts when rank 0's wait does."""
import json
import os
import time

import cupy as cp

import gpucoll
from gpu_device import one_gpu_per_rank

comm = gpucoll.COMM_WORLD
one_gpu_per_rank(comm)
timeout = float(os.environ["GPUCOLL_TIMEOUT"])
warm = cp.zeros(4, cp.int32)
comm.Sendrecv(cp.full(4, comm.rank, cp.int32), 1 - comm.rank, recvbuf=warm, source=1 - comm.rank)
comm.Barrier()
sent = [cp.full(100, i, cp.uint8) for i in range(33)]
result = {"warm": bool((warm == 1 - comm.rank).all())}
if comm.rank == 1:
    for i in range(33):
        comm.Send(sent[i], 0, tag=i)
    time.sleep(timeout + 2)
    try:
        comm.Send(sent[0], 0, tag=99)
        result["slot_sender"] = None
    except gpucoll.TimeoutError as exc:
        result["slot_sender"] = str(exc)
    time.sleep(timeout + 3)  # alive (its outbox mapped) while rank 0 times out
else:
    time.sleep(timeout + 3)
    got = [cp.zeros(100, cp.uint8) for i in range(33)]
    for i in range(32):
        comm.Recv(got[i], 1, tag=i)
    result["slots_before"] = all(bool((got[i] == i).all()) for i in range(32))
    req = comm.Irecv(got[32], 1, tag=32)
    try:
        req.Wait()
        result["slot_receiver"] = None
    except gpucoll.TimeoutError as exc:
        result["slot_receiver"] = str(exc)
print("RESULT " + json.dumps(result), flush=True)
