"""Under mpiexec: rank 1 raises before a collective that the other ranks enter (for
tests/test_mpich.py). The job must end at once, with rank 1's traceback, not when the others'
Allreduce gives up at GPUCOLL_TIMEOUT. Rank 0 prints "ENTERED" (one write) before its call."""
import os
import time

import numpy as np

import gpucoll

comm = gpucoll.COMM_WORLD
x = np.ones(4, np.float32)
comm.Allreduce(gpucoll.IN_PLACE, x)  # every rank is up and connected
if comm.rank == 1:
    time.sleep(0.5)  # the others are inside the next Allreduce by now
    raise RuntimeError("rank 1 fails before the collective")
os.write(1, b"ENTERED\n")
comm.Allreduce(gpucoll.IN_PLACE, x)
os.write(1, b"NOT REACHED\n")
