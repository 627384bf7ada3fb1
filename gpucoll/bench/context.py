"""What a measurement ran on, for the JSON beside every table: versions, machine, date and
the environment settings that change what is measured.

    json.dump(dict(settings=context.describe(command=..., plan=...), rows=rows), f)
"""
import datetime
import os
import platform
import socket

# Variables that change what a run measures; the job's own (rank, store, secret) are left out.
_SETTING_PREFIXES = ("GPUCOLL_", "NCCL_", "TORCH_", "NVSHMEM_", "OMPI_", "MPICH_", "CUDA_", "OMP_NUM_THREADS",
                     "GLOO_")
_JOB_VARIABLES = {"GPUCOLL_RANK", "GPUCOLL_SIZE", "GPUCOLL_LOCAL_RANK", "GPUCOLL_LOCAL_SIZE", "GPUCOLL_STORE",
                  "GPUCOLL_STORE_SECRET", "GPUCOLL_JOB_ID", "GPUCOLL_DEVICE"}


def environment():
    """The setting variables of this environment (GPUCOLL_*, NCCL_*, OMPI_*, ...)."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(_SETTING_PREFIXES) and k not in _JOB_VARIABLES and "SECRET" not in k}


def version(dist):
    """An installed distribution's version, or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions():
    import numpy

    return dict(gpucoll=version("gpucoll"), python=platform.python_version(), numpy=numpy.__version__,
                mpi4py=version("mpi4py"), openmpi=version("openmpi"), mpich=version("mpich"),
                torch=version("torch"), cupy=version("cupy-cuda12x") or version("cupy-cuda13x") or version("cupy"))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def describe(**extra):
    """versions, machine, date (UTC) and environment, with `extra` (command, plan, ...)."""
    return dict(extra, versions=versions(),
                machine=dict(host=socket.gethostname(), cpus=os.cpu_count(), platform=platform.platform(),
                             processor=cpu_model()),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                environment=environment())
