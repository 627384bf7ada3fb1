"""gpucoll: MPI-style SPMD collectives for GPUs and CPU ranks."""
__version__ = "0.1.0"
