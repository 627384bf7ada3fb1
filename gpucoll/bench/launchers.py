"""The launchers the benchmarks compare, found beside this interpreter (its venv) or on PATH."""
import os
import shutil
import subprocess
import sys


def beside_python(name):
    """The console script `name` installed with this interpreter, else one on PATH."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else shutil.which(name)


def gpurun_argv():
    """How to start gpurun."""
    gpurun = beside_python("gpurun")
    return [gpurun] if gpurun else [sys.executable, "-m", "gpucoll.launcher"]


def alias_pythonpath():
    """PYTHONPATH under which `import mpi4py.MPI` gives gpucoll.MPI (gpucoll.mpi4py_alias)."""
    alias = subprocess.run([sys.executable, "-m", "gpucoll.mpi4py_alias"], capture_output=True, text=True,
                           check=True).stdout.strip()
    return os.pathsep.join(p for p in (alias, os.environ.get("PYTHONPATH")) if p)


def open_mpi_env():
    """What mpiexec (Open MPI) needs here: permission to run as root where we are root."""
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
