"""How the ranks of a job find each other.

`detect()` reads the launch environment (gpurun, an MPI launcher, Slurm srun,
torchrun-style variables, or nothing: a singleton) and `connect()` returns a
`Bootstrap` that knows rank, size, local rank and host, and offers a small
allgather and barrier used to set up communicators.
"""
from .connect import Bootstrap, connect
from .detect import LaunchInfo, detect

__all__ = ["LaunchInfo", "detect", "Bootstrap", "connect"]
