"""Rank program of tests/test_gpu_fault_tolerance.py: the loop of tests/scripts/fault_tolerance.py on
GPU buffers (CuPy), where a survivor's kernels wait on the dead rank's flags on the device.

    loop SEED      1,000 all-reduces of a CuPy array; world rank 1 dies (SIGALRM) within 2 ms of a
                   step drawn from SEED, wherever it is then (often inside a kernel); the others
                   revoke, shrink and go on
    respawn SEED   the same under gpurun --respawn 1: the survivors shrink and grow with the
                   replacement, which rejoins at the step they reached

Each all-reduce is checked through its request's Wait (where a released kernel is raised) and
then exactly. At the end every communicator is freed and the rank reports what gpucoll still
holds of GPU memory and of other processes' mappings (both must be none), and how long the
error took to arrive after the last step that worked (the peer's death lies in between).
"""
import random
import sys
import time

import cupy as cp

import gpucoll
from fault_tolerance import STEPS, die_within, recover, regroup, report
from gpucoll._native import cuda
from gpucoll.engines.gpu import ipc

VICTIM = 1


def main(mode, seed):
    world = gpucoll.COMM_WORLD
    me = world.world_ranks[world.rank]
    die_at = random.Random(seed).randrange(50, 900)
    errors, messages, sizes, waits, comms = [], [], [], [], []
    if gpucoll.replaces() is not None:
        comm, step = regroup(gpucoll.rejoin(), -1, errors, failed=False)
        started = step
    else:
        comm, step, started = world.Dup(), 0, None
    x = cp.empty(1024, cp.float64)
    last_ok = time.monotonic()
    while step < STEPS:
        if me == VICTIM and gpucoll.replaces() is None and step == die_at:
            die_within(0.002, random.Random(seed))
        x[:] = comm.rank + step
        try:
            comm.Iallreduce(gpucoll.IN_PLACE, x).Wait()
        except (gpucoll.ProcFailedError, gpucoll.RevokedError) as exc:
            waits.append(time.monotonic() - last_ok)
            errors.append(type(exc).__name__)
            messages.append(str(exc))
            comms.append(comm)
            if mode == "respawn":
                comm, step = regroup(comm, step, errors)
            else:
                comm, step = recover(comm, errors, step)
            sizes.append(comm.size)
            last_ok = time.monotonic()
            continue
        want = comm.size * (comm.size - 1) // 2 + step * comm.size
        got = cp.asnumpy(x)
        assert (got == want).all(), (step, float(got[0]), want, comm.world_ranks)
        last_ok = time.monotonic()
        step += 1
    final = (list(comm.world_ranks), comm.rank)
    for c in comms + [comm]:
        c.Free()
    report(world=final[0], rank=final[1], errors=errors, messages=messages, sizes=sizes, waits=waits,
           started=started, die_at=die_at, gpu_memory=cuda.allocated(), mapped=ipc.open_count())


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
