"""mpi4py's own test suite (the 4.1.2 release, fetched from PyPI at test time) against gpucoll.MPI,
through tests/mpi4py_suite/run.py: every module imports under gpurun, and a sample of modules runs
with no failure, no error other than NotImplementedError, and no hang. `make test-mpi4py` runs
the whole suite on 2, 3 and 4 ranks (minutes)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "mpi4py_suite", "run.py")
SAMPLE = ("test_package", "test_doc", "test_dynproc", "test_objmodel", "test_address", "test_status", "test_request", "test_op",
          "test_info", "test_group", "test_errorcode", "test_msgzero", "test_cco_obj", "test_p2p_obj_matched", "test_comm", "test_comm_topo", "test_cco_ngh_obj",
          "test_comm_inter", "test_cco_obj_inter", "test_win", "test_session", "test_ulfm")


def _run(*args, timeout):
    return subprocess.run([sys.executable, RUN, *args], capture_output=True, text=True, timeout=timeout)


def test_every_suite_module_imports(mpi4py_release):
    proc = _run("--np", "2", "--import-only", timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("   test_")]
    assert proc.returncode == 0 and lines == [], proc.stdout + proc.stderr
    assert "2 ranks, rank 0: 64 of 64 modules import" in proc.stdout, proc.stdout


def test_sample_of_the_suite_passes(mpi4py_release):
    proc = _run("--np", "2", "--jobs", "2", "--check", "--op-timeout", "20", "--timeout", "120", "-m", *SAMPLE,
                timeout=400)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    totals = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert len(totals) == 2, proc.stdout
    for rank, modules, imported, tests, passed, fail, notimpl, error, *_ in totals:
        assert modules == imported == str(len(SAMPLE)) and int(passed) > 0 and fail == error == "0", proc.stdout
