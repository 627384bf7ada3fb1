"""MPI's Spawn under gpurun, with real processes (tests/scripts/mpi_spawn.py): children that
talk to their parents and merge with them, spawn errors that name their cause and leave the
job running, gpurun's --universe-size, mpi4py's own test_spawn.py on 1 and 3 ranks, and
mpi4py.futures' MPIPoolExecutor on spawned workers."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import GPURUN, SCRIPTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_SUCCESS = 0


def test_children_talk_to_their_parents_merge_and_disconnect(gpurun_job):
    job = gpurun_job(2, "mpi_spawn.py", "parents", timeout=90).check()
    parents, children = job.json_lines("RESULT "), job.json_lines("CHILD ")
    assert sorted(parents) == [0, 1] and sorted(children) == [2, 3, 4], job.describe()
    total = sum(range(5))  # merged: the parents first (high=False), then the 3 children
    for r, got in parents.items():
        assert got["parent_null"] is True and got["universe"] == 2  # no --universe-size: COMM_WORLD's size
        assert got["sizes"] == [2, 3, r] and got["errcodes"] == [MPI_SUCCESS] * 3
        assert got["received"] == [10 * s for s in range(3) if s % 2 == r]
        assert got["merged"] == [r, 5, total]
    for w, got in children.items():
        i = w - 2
        assert got["world"] == [i, 3] and got["remote"] == 2 and got["same_handle"] is True
        assert got["bcast"] == 42.0
        assert got["merged"] == [2 + i, 5, total]
        assert got["after"] == [True, True]



def test_gpucoll_own_spawn_gives_one_communicator_of_parents_and_children(gpurun_job):
    job = gpurun_job(2, "mpi_spawn.py", "own", timeout=90).check()
    parents, children = job.json_lines("RESULT "), job.json_lines("CHILD ")
    assert sorted(parents) == [0, 1] and sorted(children) == [2, 3], job.describe()
    for r, got in parents.items():
        assert got["rank"] == [r, 4] and got["sum"] == [6.0, 6.0] and got["parent"] is None
        assert "cannot start 0 processes" in got["refused"]
    for w, got in children.items():
        assert got["rank"] == [w, 4] and got["sum"] == [6.0, 6.0] and got["again"] is True


@pytest.mark.parametrize("preload", [True, False])
def test_children_fork_from_the_warmed_interpreter_as_gpuruns_own(gpurun_job, tmp_path, preload):
    # Forked by the zygote, the child is still gpurun's child (gpurun reaps it, and it dies with
    # gpurun), in the info's wdir, with its argv; with --no-preload it starts anew.
    job = gpurun_job(1, "mpi_spawn.py", "start", tmp_path, launcher_args=() if preload else ("--no-preload",),
                     timeout=60).check()
    gpurun = job.json_lines("RESULT ")[0]["gpurun"]
    children = job.json_lines("CHILD ")
    assert sorted(children) == [1, 2], job.describe()
    for got in children.values():
        assert got == {"preloaded": preload, "cwd": str(tmp_path), "ppid": gpurun, "argv": ["start-child", "x y"],
                       "name": "__main__"}


def test_a_child_reaches_a_parent_before_that_parent_knows_of_it(gpurun_job):
    # Parent 1 comes to the Spawn 1.5 s late: the children's messages to it arrive first, and it
    # looks them up in the store (Context.look_up) to open their channels.
    job = gpurun_job(2, "mpi_spawn.py", "late", env={"GPUCOLL_INIT_TIMEOUT": 20}, timeout=60).check()
    assert job.json_lines("RESULT ") == {0: {"got": None}, 1: {"got": [0, 1]}}, job.describe()


def test_spawned_children_die_with_a_killed_gpurun(tmp_path):
    # Adopted by gpurun, the children have their parent-death signal set against it.
    from test_launcher import gone

    proc = subprocess.Popen([*GPURUN, "-np", "1", sys.executable, os.path.join(SCRIPTS, "mpi_spawn.py"), "spin",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("pid.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid.?")]
        assert len(pids) == 2, "the children did not start"
        proc.kill()
        proc.wait(timeout=5)
        deadline = time.monotonic() + 3
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.kill()
    left = [p for p in pids if not gone(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"spawned processes still running 3 s after gpurun was killed: {left}"


def test_a_spawn_that_fails_names_why_and_the_job_goes_on(gpurun_job):
    job = gpurun_job(1, "mpi_spawn.py", "fails", timeout=90).check()
    got = job.json_lines("RESULT ")[0]
    is_spawn, text = got["fails"]
    assert is_spawn and "ended before it joined: exit code 3" in text, got
    is_spawn, text = got["missing"]
    assert is_spawn and "/nonexistent/program" in text, got
    is_spawn, text = got["bad_count"]
    assert is_spawn and "cannot start 0 processes" in text, got
    assert "2 argument lists for 1 commands" in got["bad_lists"]
    assert got["then"] == 0 and got["then_merged"] == 2


def test_universe_size_caps_the_processes_at_once(gpurun_job):
    job = gpurun_job(1, "mpi_spawn.py", "limit", launcher_args=("--universe-size", 2), timeout=60).check()
    got = job.json_lines("RESULT ")[0]
    is_spawn, text = got["limit"]
    assert is_spawn and "--universe-size allows 2" in text and "1 are running" in text, text
    assert got["universe"] == 2  # MPI.UNIVERSE_SIZE


ALONE = ("import sys\nfrom gpucoll import MPI\n"
         "try:\n    MPI.COMM_SELF.Spawn(sys.executable, ['-c', 'pass'], 1)\n"
         "except MPI.Exception as exc:\n    print('ERR', exc.Get_error_class() == MPI.ERR_SPAWN, exc)\n")


@pytest.mark.parametrize("how", ["alone", "torchrun", pytest.param("mpiexec", marks=pytest.mark.mpi)])
def test_without_gpurun_spawn_says_why(tmp_path, how):
    # No launcher that starts processes: a program run alone, a torchrun-style job (rank 0 serves
    # the store), mpiexec. Spawn raises ERR_SPAWN at once, saying so.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCOLL_", "OMPI_", "PMIX_", "SLURM_"))}
    cmd = [sys.executable, "-c", ALONE]
    if how == "torchrun":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    elif how == "mpiexec":
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        if not os.path.exists(mpiexec):
            pytest.skip("no mpiexec in this environment")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [mpiexec, "-n", "1", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ERR True") and "needs a job that gpurun started" in out.stdout, out.stdout


@pytest.mark.parametrize("np_", [1, 3])
def test_mpi4py_own_spawn_tests_pass(np_, tmp_path):
    pytest.importorskip("mpi4py")
    records = tmp_path / "spawn.json"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "mpi4py_suite", "run.py"), "--np", str(np_),
                          "--modules", "test_spawn", "--check", "--json", str(records)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    [result] = json.loads(records.read_text())
    assert sorted(result["ranks"], key=int) == [str(r) for r in range(np_)]
    for rank, rec in result["ranks"].items():
        counts = rec["counts"]
        assert counts.get("pass", 0) == 44 and rec["run"] == 44, (rank, counts)


def test_mpi_pool_executor_maps_over_spawned_workers(tmp_path):
    pytest.importorskip("mpi4py")  # its futures package is pure Python (importing it here would load mpi4py.MPI)
    program = tmp_path / "pool.py"
    program.write_text(
        "import os\nfrom mpi4py import MPI\nfrom mpi4py.futures import MPIPoolExecutor\n\n"
        "def square(x):\n    return x * x, os.getpid()\n\n"
        "if __name__ == '__main__':\n"
        "    with MPIPoolExecutor(max_workers=4) as pool:\n"
        "        out = list(pool.map(square, range(100)))\n"
        "    print('MODULE', MPI.__name__)\n"
        "    print('SQUARES', [v for v, _ in out] == [i * i for i in range(100)])\n"
        "    print('WORKERS', len({p for _, p in out}), os.getpid() in {p for _, p in out})\n")
    alias = subprocess.run([sys.executable, "-m", "gpucoll.mpi4py_alias"], capture_output=True, text=True,
                           check=True).stdout.strip()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (alias, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([*GPURUN, "-np", "1", "--timeout", "100", sys.executable, str(program)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[0] MODULE gpucoll.MPI" in out.stdout and "[0] SQUARES True" in out.stdout, out.stdout
    assert "[0] WORKERS 4 False" in out.stdout, out.stdout


def test_mpi4py_futures_own_tests_pass_on_spawned_workers(tmp_path):
    # mpi4py's demo/futures/test_futures.py: MPIPoolExecutor, MPICommExecutor, the pool's
    # shutdown, errors and maps, its workers spawned by gpurun, mpi4py.MPI being gpucoll.MPI.
    pytest.importorskip("mpi4py")
    sys.path.insert(0, os.path.join(ROOT, "tests", "mpi4py_suite"))
    import fetch

    top = fetch.fetch()
    shutil.copytree(os.path.join(top, "demo", "futures"), tmp_path / "futures")
    alias = subprocess.run([sys.executable, "-m", "gpucoll.mpi4py_alias"], capture_output=True, text=True,
                           check=True).stdout.strip()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([alias, os.path.join(top, "test")]))
    out = subprocess.run([*GPURUN, "-np", "1", "--timeout", "280", sys.executable, "test_futures.py"],
                         cwd=tmp_path / "futures", capture_output=True, text=True, timeout=300, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    ran = re.search(r"Ran (\d+) tests", text)
    assert ran and int(ran[1]) == 121 and "[0] OK" in text, text[-2000:]  # mpi4py 4.1.2's file: 121 tests
