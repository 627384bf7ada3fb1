"""`mpiexec -n 4` with MPICH, beside Open MPI: the same script bootstraps through mpi4py.

MPICH and an mpi4py that uses it live in .venv-mpich (PyPI wheels, made by
scripts/setup-test-system.sh); that interpreter imports gpucoll from this checkout, whose
extensions are built for the same Python version.
"""
import os
import subprocess
import sys

import pytest

from conftest import _SCRUB, unavailable

pytestmark = pytest.mark.mpi
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = ("import numpy as np, gpucoll; from mpi4py import MPI; c = gpucoll.COMM_WORLD; "
         "x = np.arange(100, dtype=np.int64) * (c.rank + 1); c.Allreduce(gpucoll.IN_PLACE, x); "
         "ok = bool((x == np.arange(100) * c.size * (c.size + 1) // 2).all()); "
         "import os; os.write(1, ('HELLO %d %d %s %s %s\\n' % (c.rank, c.size, c._ctx.boot.method, ok, "
         "MPI.Get_library_version().split()[0])).encode())")
# One write per line: MPICH's launcher relays output as it arrives, so a line printed in
# pieces can interleave with another rank's.


def _run(venv, piece, extra_env=None, args=()):
    mpiexec = os.path.join(venv, "bin", "mpiexec")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(mpiexec):
        unavailable(piece, f"{mpiexec} is missing (scripts/setup-test-system.sh makes it)")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith(("SLURM_", "PMI", "OMPI_"))}
    env.update(extra_env or {})
    proc = subprocess.run([mpiexec, *args, "-n", "4", python, "-c", HELLO], capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(tuple(line.split()[1:]) for line in proc.stdout.splitlines() if line.startswith("HELLO"))


def test_mpiexec_with_mpich_four_ranks():
    rows = _run(os.path.join(ROOT, ".venv-mpich"), "mpich", {"PYTHONPATH": ROOT})
    assert rows == [(str(r), "4", "mpi", "True", "MPICH") for r in range(4)]


def test_mpiexec_with_open_mpi_four_ranks():
    rows = _run(os.path.dirname(os.path.dirname(sys.executable)), "mpi4py", args=("--oversubscribe",),
                extra_env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    assert rows == [(str(r), "4", "mpi", "True", "Open") for r in range(4)]
