"""A training-style loop that survives a lost rank, and takes in a replacement when there is one.

    gpurun -np 4 --on-failure=continue python examples/elastic.py   # rank 2 dies at step 300: 3 go on
    gpurun -np 4 --respawn 1 python examples/elastic.py             # its replacement rejoins: back to 4

Every step all-reduces a "gradient" (rank r contributes r + 1 in every element) and checks the
sum exactly. Rank 2 kills itself (SIGKILL) at step 300. The survivors catch the failure, revoke
the communicator (so that no rank stays blocked in it), shrink it to the survivors, and grow it
back with the replacement that gpurun --respawn started, if any; the replacement runs this same
script, rejoins at the dead rank's number and learns the step the others reached.
"""
import os
import signal

import numpy as np

import gpucoll

STEPS, LOST_RANK, LOST_AT = 1000, 2, 300


def regroup(comm, step, failed=True):
    """Agree on the step to go on from; after a failure (or when agreeing fails) first revoke,
    shrink and grow, until the new communicator works (a rank may die meanwhile)."""
    while True:
        try:
            if failed:
                comm.revoke()
                comm = comm.shrink().grow()
            return comm, comm.allreduce(step, op=gpucoll.MAX)
        except (gpucoll.ProcFailedError, gpucoll.RevokedError):
            failed = True


def main():
    world = gpucoll.COMM_WORLD
    if gpucoll.replaces() is not None:
        comm, step = regroup(gpucoll.rejoin(), -1, failed=False)
        print(f"rank {comm.rank}: replaces world rank {gpucoll.replaces()}, joins at step {step}")
    else:
        comm, step = world.Dup(), 0
    doomed = world.world_ranks[world.rank] == LOST_RANK
    grad = np.empty(1 << 14, np.float32)
    while step < STEPS:
        if doomed and step == LOST_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        grad[:] = comm.rank + 1
        try:
            comm.Allreduce(gpucoll.IN_PLACE, grad)
        except (gpucoll.ProcFailedError, gpucoll.RevokedError) as exc:
            comm, step = regroup(comm, step)
            if comm.rank == 0:
                print(f"step {step}: {type(exc).__name__}; going on with {comm.size} ranks")
            continue
        assert (grad == comm.size * (comm.size + 1) // 2).all(), (step, grad[0])
        step += 1
    print(f"rank {comm.rank} of {comm.size}: {STEPS} steps, every sum exact")


if __name__ == "__main__":
    main()
