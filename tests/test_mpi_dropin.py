"""gpucoll.MPI as a drop-in for mpi4py: a typical mpi4py program runs with one changed import
(tests/scripts/mpi_pi.py), and what gpucoll lacks raises NotImplementedError naming it when
called. tests/test_mpi_namespace.py checks every name against mpi4py's own module."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import requires

PI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "mpi_pi.py")


def as_mpi4py(source):
    """The same program with `from mpi4py import MPI`: exactly one line differs."""
    changed, n = re.subn(r"^from gpucoll import MPI$", "from mpi4py import MPI", source, flags=re.M)
    assert n == 1 and not re.search(r"^\s*(import gpucoll|from gpucoll\b)", changed, re.M)
    return changed


def expected_lines(size):
    squares = [float(v * v) for v in range(size * 3)]
    lines = [f"sum {float(sum(range(size * 10))):.1f} max {(size - 1) ** 2}", f"gathered {squares}"]
    for r in range(size):
        left = (r - 1) % size
        lines.append(f"rank {r} of {size}: left neighbour [{left}, 1] source {left} tag 7 count 2 "
                     f"hosts {size} elapsed_ok True")
    return lines


def check_pi_output(lines, size):
    pi = [l for l in lines if l.startswith("pi ")]
    assert len(pi) == 1, lines
    value, error = re.match(r"pi (\S+) error (\S+)$", pi[0]).groups()
    assert abs(float(value) - 3.141592653590) < 1e-11 and float(error) < 1e-12
    assert sorted(l for l in lines if not l.startswith("pi ")) == sorted(expected_lines(size))


@pytest.mark.parametrize("size", [1, 4])
def test_mpi4py_program_runs_with_one_changed_import(gpurun_job, size):
    with open(PI) as f:
        source = f.read()
    as_mpi4py(source)  # the gpucoll.MPI import is the program's only tie to gpucoll
    job = gpurun_job(size, "mpi_pi.py").check()
    check_pi_output(job.lines(), size)


def _mpiexec():
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return exe


@pytest.mark.mpi
@requires("mpi4py", None if _mpiexec() else "needs mpi4py and Open MPI's mpiexec")
def test_same_program_under_mpi4py_prints_the_same(tmp_path):
    # The reference: the same file with `from mpi4py import MPI`, run by Open MPI.
    with open(PI) as f:
        source = as_mpi4py(f.read())
    script = tmp_path / "mpi_pi_mpi4py.py"
    script.write_text(source)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader,tcp")
    # mpi4py and mpiexec are installed: a reference run that fails or hangs is a failure.
    try:
        proc = subprocess.run([_mpiexec(), "--oversubscribe", "-n", "4", sys.executable, str(script)],
                              capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the mpi4py reference run under Open MPI did not finish in 60 s:\n{exc.stderr!r:.2000}")
    assert proc.returncode == 0, f"the mpi4py reference run under Open MPI failed:\n{proc.stderr[-3000:]}"
    check_pi_output(proc.stdout.splitlines(), 4)


def test_names_and_missing_pieces(gpurun_job):
    res = gpurun_job(2, "mpi_names.py").check().json_lines()
    for r, got in res.items():
        assert got["initialized"] is True
        for name, message in got["missing"].items():
            assert message.startswith("gpucoll.MPI.") and "not supported by gpucoll" in message, message
        assert "hardware resource information" in got["missing"]["Get_hw_resource_info"]
        assert "data representations" in got["missing"]["Register_datarep"]
        message, is_err_op = got["allreduce_maxloc"]
        assert "MAXLOC needs a (value, index) pair type" in message and is_err_op is True
        assert "NO_SUCH_NAME" in got["unknown_name"]
        assert got["comm_self"] == [1, 0, r + 1.0, True]
        assert got["split_undefined_is_null"] is (r == 0)
        assert got["count_spec"] == [0, 3, 6, 9, 4 * (r + 1), 5 * (r + 1)]  # only [buf, 4, INT] reduced
        assert got["sizes"] == [8, 4, 1, 4]
        assert got["waitall"] is True and got["exception_is_base"] is True
        assert got["proc_null"] == [[7.0, 7.0], -2, -1, 0, None]


def test_an_abort_status_set_the_mpi4py_run_way_ends_the_process_with_it(gpurun_job, tmp_path):
    # mpi4py.run and mpi4py.futures' workers call MPI._set_abort_status on an error they catch:
    # the process then ends with that status at exit, and gpurun stops the job naming it.
    script = tmp_path / "abort_status.py"
    script.write_text("from gpucoll import MPI\nMPI.COMM_WORLD.Barrier()\n"
                      "if MPI.COMM_WORLD.Get_rank() == 1:\n    MPI._set_abort_status(7)\nprint('done', flush=True)\n")
    job = gpurun_job(2, str(script), timeout=60)
    assert job.returncode == 7, job.describe()
    assert "rank 1 (host" in job.stderr and "exit code 7" in job.stderr, job.describe()
    assert "[1] done" in job.stdout
