"""gpucoll: MPI-style SPMD collectives for GPUs and CPU ranks.

    import numpy as np, gpucoll
    comm = gpucoll.COMM_WORLD            # joins the job on first use
    x = np.ones(4, np.float32)
    comm.Allreduce(gpucoll.IN_PLACE, x)  # x == comm.size everywhere

Start several ranks with `gpurun -np 4 python script.py` (or mpiexec, srun,
torchrun); run a script alone and it is a single rank.
"""
from .comm import IN_PLACE, UNDEFINED, Communicator
from .errors import (AuthenticationError, BootstrapError, ConfigError, GpucollError, InvalidUsageError,
                     LostPeerError, MismatchError, StoreError, TimeoutError)
from .ops import AVG, BAND, BOR, BXOR, MAX, MIN, PROD, SUM, Op
from .p2p import ANY_SOURCE, ANY_TAG, Status
from .request import Request
from .world import init, initialized

__version__ = "0.1.0"

__all__ = [
    "COMM_WORLD", "init", "initialized", "Communicator", "Request", "Status", "IN_PLACE", "UNDEFINED",
    "ANY_SOURCE", "ANY_TAG", "SUM", "PROD", "MAX", "MIN", "AVG", "BAND", "BOR", "BXOR", "Op",
    "GpucollError", "ConfigError", "InvalidUsageError", "BootstrapError", "StoreError", "AuthenticationError",
    "TimeoutError", "LostPeerError", "MismatchError",
]


def __getattr__(name):
    # COMM_WORLD joins the job on first use, so importing gpucoll never blocks.
    if name == "COMM_WORLD":
        return init()
    raise AttributeError(f"module 'gpucoll' has no attribute {name!r}")
