"""mpi4py's own demos (the 4.1.2 release's demo/ folder, fetched from PyPI at test time) run under
gpurun unchanged but for `from gpucoll import MPI` (tests/mpi4py_suite/demos.py): the quick ones
here; `make test-mpi4py-demos` runs them all, the OSU benchmarks included."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DEMOS = os.path.join(HERE, "mpi4py_suite", "demos.py")


@pytest.fixture(scope="module")
def suite():
    sys.path.insert(0, os.path.join(HERE, "mpi4py_suite"))
    try:
        import fetch

        return fetch.fetch()
    except (OSError, SystemExit) as exc:
        pytest.skip(f"cannot fetch mpi4py's demos from PyPI: {exc}")
    finally:
        sys.path.remove(os.path.join(HERE, "mpi4py_suite"))


def test_quick_demos_run_under_gpurun(suite):
    proc = subprocess.run([sys.executable, DEMOS, "--fast", "--timeout", "60"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    ran = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert len(ran) >= 25 and "0 demo(s) failed" in proc.stdout, proc.stdout
