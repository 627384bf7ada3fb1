"""gpucoll: MPI-style SPMD collectives for GPUs and CPU ranks.

    import numpy as np, gpucoll
    comm = gpucoll.COMM_WORLD            # joins the job on first use
    x = np.ones(4, np.float32)
    comm.Allreduce(gpucoll.IN_PLACE, x)  # x == comm.size everywhere

Start several ranks with `gpurun -np 4 python script.py` (or mpiexec, srun,
torchrun); run a script alone and it is a single rank.
"""
import importlib

__version__ = "0.1.0"

# Public names, resolved on first use: `import gpucoll` (and so the gpurun launcher,
# which lives in gpucoll.launcher) stays cheap and imports neither NumPy nor sockets.
_EXPORTS = {
    "Communicator": "comm", "IN_PLACE": "comm", "UNDEFINED": "comm",
    "init": "world", "initialized": "world",
    "Request": "request",
    "ANY_SOURCE": "p2p", "ANY_TAG": "p2p", "Status": "p2p",
    "SUM": "ops", "PROD": "ops", "MAX": "ops", "MIN": "ops", "AVG": "ops", "BAND": "ops", "BOR": "ops",
    "BXOR": "ops", "Op": "ops",
    "Datatype": "buffers",
    "GpucollError": "errors", "ConfigError": "errors", "InvalidUsageError": "errors",
    "BootstrapError": "errors", "StoreError": "errors", "AuthenticationError": "errors",
    "TimeoutError": "errors", "LostPeerError": "errors", "MismatchError": "errors",
    "SharedMemoryError": "errors", "TruncationError": "errors",
}

__all__ = ["COMM_WORLD", *_EXPORTS]


def __getattr__(name):
    if name == "COMM_WORLD":  # joins the job on first use, so importing never blocks
        return importlib.import_module(".world", __name__).init()
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucoll' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
