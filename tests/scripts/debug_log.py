"""One allreduce (and a bcast) per algorithm path, for the GPUCOLL_DEBUG=INFO log test.

    GPUCOLL_DEBUG=INFO gpurun -np 2 python debug_log.py
"""
import os

import numpy as np

import gpucoll

world = gpucoll.COMM_WORLD


def dup_with(**env):
    os.environ.update(env)
    try:
        return world.Dup()
    finally:
        for k in env:
            del os.environ[k]


for comm in (world, dup_with(GPUCOLL_ALGO="direct"), dup_with(GPUCOLL_ALGO="ring"),
             dup_with(GPUCOLL_SHM_DISABLE="1")):
    x = np.ones(7, np.float32)
    comm.Allreduce(gpucoll.IN_PLACE, x)
    assert (x == comm.size).all(), x
    y = np.array([comm.rank], np.int64)
    comm.Bcast(y, root=1)
    assert y[0] == 1, y
print("done")
