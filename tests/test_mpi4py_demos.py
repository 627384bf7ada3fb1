"""mpi4py's own demos (the 4.1.2 release's demo/ folder, fetched from PyPI at test time) run under
gpurun unchanged but for `from gpucoll import MPI` (tests/mpi4py_suite/demos.py): the quick ones
here; `make test-mpi4py-demos` runs them all, the OSU benchmarks included."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEMOS = os.path.join(HERE, "mpi4py_suite", "demos.py")


def test_quick_demos_run_under_gpurun(mpi4py_release):
    proc = subprocess.run([sys.executable, DEMOS, "--fast", "--timeout", "60"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    ran = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert len(ran) >= 25 and "0 demo(s) failed" in proc.stdout, proc.stdout
