"""Split, Dup and Free as a user exercises them; each rank prints what it saw.

    gpurun -np 4 python comm_mgmt.py

Prints one line "RESULT {json}" per rank; tests/test_comm_management.py asserts the numbers.
"""
import json
import time

import numpy as np

import gpucoll

world = gpucoll.COMM_WORLD
rank, size = world.rank, world.size
out = {}


def describe(comm):
    """What this rank sees of a communicator, checked by using it."""
    if comm is None:
        return None
    total = np.array([world.rank], np.int64)
    comm.Allreduce(gpucoll.IN_PLACE, total)
    order = comm.allgather(world.rank)
    return {"rank": comm.rank, "size": comm.size, "world_ranks": list(comm.world_ranks),
            "order": order, "sum_of_world_ranks": int(total[0])}


# Split by parity, keys reversing the order inside each colour.
evens_odds = world.Split(color=rank % 2, key=-rank)
out["parity_reversed"] = describe(evens_odds)

# Equal keys keep the old order; colours need not be small or contiguous.
out["equal_keys"] = describe(world.Split(color=1000 + rank // 2, key=7))

# UNDEFINED leaves rank 0 out: it gets None, the others one communicator.
out["undefined"] = describe(world.Split(gpucoll.UNDEFINED if rank == 0 else 5, key=rank))

# A split of a split (keys reverse the parent order again), used while its parent is used.
nested = evens_odds.Split(color=0, key=-evens_odds.rank)
out["nested"] = describe(nested)
x = np.array([1.0])
evens_odds.Allreduce(gpucoll.IN_PLACE, x)
out["parent_after_nested"] = float(x[0])

# Dup: same ranks, its own traffic. A receive posted on world must not take a message sent
# on the duplicate with the same source and tag.
dup = world.Dup()
out["dup"] = describe(dup)
out["dup_name_differs"] = dup.Get_name() != world.Get_name()
if size > 1:
    if rank == 0:
        dup.Send(np.array([111], np.int32), dest=1, tag=5)
        world.Barrier()  # rank 1 checks its world receive is still pending
        world.Barrier()
        world.Send(np.array([222], np.int32), dest=1, tag=5)
    elif rank == 1:
        on_world = np.zeros(1, np.int32)
        req = world.Irecv(on_world, source=0, tag=gpucoll.ANY_TAG)
        world.Barrier()
        time.sleep(0.2)  # the message on dup has had time to arrive
        out["world_recv_pending_after_dup_send"] = not req.Test()
        on_dup = np.zeros(1, np.int32)
        dup.Recv(on_dup, source=0, tag=5)
        world.Barrier()
        req.Wait()
        out["received"] = {"world": int(on_world[0]), "dup": int(on_dup[0])}
    else:
        world.Barrier()
        world.Barrier()
# Collectives on a duplicate and its original, interleaved and overlapping.
a = np.full(3, rank, np.int64)
b = np.full(3, 10 * rank, np.int64)
req = dup.Iallreduce(gpucoll.IN_PLACE, a)
world.Allreduce(gpucoll.IN_PLACE, b, op=gpucoll.MAX)
req.Wait()
out["interleaved"] = [int(a[0]), int(b[0])]

# Free: later use raises InvalidUsageError before anything is sent; the parent still works.
dup.Barrier()
dup.Free()
dup.Free()  # a second Free does nothing
errors = {}
for name, call in [
    ("Allreduce", lambda: dup.Allreduce(gpucoll.IN_PLACE, np.ones(2))),
    ("Bcast", lambda: dup.Bcast(np.ones(2))),
    ("Iallreduce", lambda: dup.Iallreduce(gpucoll.IN_PLACE, np.ones(2))),
    ("Barrier", lambda: dup.Barrier()),
    ("Send", lambda: dup.Send(np.ones(2), dest=0)),
    ("Isend", lambda: dup.Isend(np.ones(2), dest=0)),
    ("Recv", lambda: dup.Recv(np.ones(2), source=0)),
    ("Irecv", lambda: dup.Irecv(np.ones(2), source=0)),
    ("bcast", lambda: dup.bcast("x")),
    ("allgather", lambda: dup.allgather("x")),
    ("Dup", lambda: dup.Dup()),
    ("Split", lambda: dup.Split(0, 0)),
]:
    try:
        call()
        errors[name] = "no error"
    except gpucoll.InvalidUsageError as exc:
        errors[name] = "InvalidUsageError: " + str(exc)
    except Exception as exc:  # the wrong kind of error is a failure the test shows
        errors[name] = f"{type(exc).__name__}: {exc}"
out["after_free"] = errors
y = np.ones(2)
world.Allreduce(gpucoll.IN_PLACE, y)
out["world_after_free"] = float(y[0])

# Many communicators made and freed in a row leave nothing broken behind.
for i in range(5):
    c = world.Split(color=rank % 2, key=0).Dup()
    z = np.ones(1)
    c.Allreduce(gpucoll.IN_PLACE, z)
    c.Free()
out["made_and_freed"] = float(z[0])
print("RESULT " + json.dumps(out), flush=True)
