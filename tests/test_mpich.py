"""`mpiexec -n 4` with MPICH, beside Open MPI: the same script bootstraps through mpi4py.

MPICH and an mpi4py that uses it live in .venv-mpich (PyPI wheels, made by
scripts/setup-test-system.sh); that interpreter imports gpucoll from this checkout, whose
extensions are built for the same Python version.
"""
import os
import subprocess
import sys
import time

import pytest

from conftest import _SCRUB, unavailable

pytestmark = pytest.mark.mpi
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = ("import numpy as np, gpucoll; from mpi4py import MPI; c = gpucoll.COMM_WORLD; "
         "x = np.arange(100, dtype=np.int64) * (c.rank + 1); c.Allreduce(gpucoll.IN_PLACE, x); "
         "ok = bool((x == np.arange(100) * c.size * (c.size + 1) // 2).all()); "
         "import os; os.write(1, ('HELLO %d %d %s %s %s\\n' % (c.rank, c.size, c.seam.context.boot.method, ok, "
         "MPI.Get_library_version().split()[0])).encode())")
# One write per line: MPICH's launcher relays output as it arrives, so a line printed in
# pieces can interleave with another rank's.


# How each MPI runs here: its venv, mpiexec's extra arguments and environment.
# The piece names what GPUCOLL_TEST_REQUIRE calls it (tests/conftest.py).
MPIS = {
    "mpich": (os.path.join(ROOT, ".venv-mpich"), (), {"PYTHONPATH": ROOT}, "mpich"),
    "open-mpi": (os.path.dirname(os.path.dirname(sys.executable)), ("--oversubscribe",),
                 {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}, "mpi4py"),
}


def _mpiexec(mpi, nranks, program, extra_env=None, timeout=120):
    """Run `mpiexec -n nranks python PROGRAM...` with that MPI; the CompletedProcess."""
    venv, args, mpi_env, piece = MPIS[mpi]
    mpiexec = os.path.join(venv, "bin", "mpiexec")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(mpiexec):
        unavailable(piece, f"{mpiexec} is missing (scripts/setup-test-system.sh makes it)")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith(("SLURM_", "PMI", "OMPI_"))}
    env.update(mpi_env, **(extra_env or {}))
    try:
        return subprocess.run([mpiexec, *args, "-n", str(nranks), python, *program], capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec ({mpi}) did not end within {timeout} s\nstdout: {exc.stdout!r:.3000}\n"
                    f"stderr: {exc.stderr!r:.3000}")


def _run(mpi):
    proc = _mpiexec(mpi, 4, ["-c", HELLO])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(tuple(line.split()[1:]) for line in proc.stdout.splitlines() if line.startswith("HELLO"))


def test_mpiexec_with_mpich_four_ranks():
    assert _run("mpich") == [(str(r), "4", "mpi", "True", "MPICH") for r in range(4)]


def test_mpiexec_with_open_mpi_four_ranks():
    assert _run("open-mpi") == [(str(r), "4", "mpi", "True", "Open") for r in range(4)]


@pytest.mark.parametrize("mpi", ["mpich", "open-mpi"])
def test_exception_on_one_rank_ends_the_mpi_job_at_once(mpi):
    # Rank 1 raises while rank 0 waits for it in an Allreduce. Without an abort, rank 1 would
    # sit in MPI_Finalize at exit and rank 0 would give up only at GPUCOLL_TIMEOUT (30 s here);
    # gpucoll's excepthook prints the traceback and calls MPI_Abort, as `python -m mpi4py` does.
    start = time.monotonic()
    proc = _mpiexec(mpi, 2, [os.path.join(ROOT, "tests", "scripts", "mpi_raise.py")],
                    {"GPUCOLL_TIMEOUT": "30"}, timeout=25)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback (most recent call last)" in out and "RuntimeError: rank 1 fails before the collective" in out, out
    assert "ENTERED" in proc.stdout and "NOT REACHED" not in proc.stdout, out
    assert elapsed < 10, (elapsed, out)
