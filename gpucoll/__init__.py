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
    "Communicator": "api.comm", "IN_PLACE": "api.comm", "UNDEFINED": "api.comm",
    "init": "api.world", "initialized": "api.world",
    "Request": "base.request", "Status": "base.request",
    "ANY_SOURCE": "engines.p2p.host", "ANY_TAG": "engines.p2p.host",
    "SUM": "base.ops", "PROD": "base.ops", "MAX": "base.ops", "MIN": "base.ops", "AVG": "base.ops",
    "BAND": "base.ops", "BOR": "base.ops", "BXOR": "base.ops", "Op": "base.ops",
    "Datatype": "calls.buffers",
    "GpucollError": "base.errors", "ConfigError": "base.errors", "InvalidUsageError": "base.errors",
    "BootstrapError": "base.errors", "StoreError": "base.errors", "AuthenticationError": "base.errors",
    "TimeoutError": "base.errors", "LostPeerError": "base.errors", "MismatchError": "base.errors",
    "SharedMemoryError": "base.errors", "TruncationError": "base.errors", "SpawnError": "base.errors",
    "ProcFailedError": "base.errors", "ProcFailedPendingError": "base.errors", "RevokedError": "base.errors",
    "parent": "api.world", "replaces": "api.world", "rejoin": "api.world",
}

__all__ = ["COMM_WORLD", *_EXPORTS]


def __getattr__(name):
    if name == "COMM_WORLD":  # joins the job on first use, so importing never blocks
        return importlib.import_module(".api.world", __name__).init()
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucoll' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
