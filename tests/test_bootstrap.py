"""Bootstrap: every way of starting ranks, with real processes and a real store."""
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import unavailable
from gpucoll.bootstrap import hostlist

BIN = os.path.dirname(sys.executable)
HELLO = "import gpucoll; c = gpucoll.COMM_WORLD; print(c.rank, c.size, c.local_rank, c.local_size, flush=True)"
EXCHANGE = """
import gpucoll, gpucoll.api.world as w
c = gpucoll.COMM_WORLD
boot = w.world().seam.context.boot
got = boot.allgather(b"r%d" % c.rank)
boot.barrier()
print(c.rank, b",".join(got).decode(), flush=True)
"""


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPUCOLL_", "OMPI_", "PMI", "SLURM_")) and k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(code, envs, timeout=60):
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env in envs]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append((p.returncode, out, err))
    return results


def test_gpurun_one_liner_prints_every_rank():
    out = subprocess.run([os.path.join(BIN, "gpurun"), "-np", "4", sys.executable, "-c", HELLO],
                         env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"[{r}] {r} 4 {r} 4" for r in range(4)]


def test_plain_python_is_a_singleton():
    out = subprocess.run([sys.executable, "-c", HELLO], env=_clean_env(), capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "0", "1"]


@pytest.mark.mpi
def test_mpiexec_one_liner():
    mpiexec = os.path.join(BIN, "mpiexec")
    if not os.path.exists(mpiexec):
        unavailable("mpi4py", "Open MPI is not installed in this environment (pip install 'gpucoll[mpi]')")
    env = _clean_env(OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    out = subprocess.run([mpiexec, "--oversubscribe", "-n", "4", sys.executable, "-c", HELLO], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"{r} 4 {r} 4" for r in range(4)]


def test_gpurun_bootstrap_allgather_and_barrier():
    out = subprocess.run([os.path.join(BIN, "gpurun"), "-np", "3", sys.executable, "-c", EXCHANGE],
                         env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == [f"[{r}] {r} r0,r1,r2" for r in range(3)]


def test_torchrun_style_environment():
    port = _free_port()
    envs = [_clean_env(RANK=r, WORLD_SIZE=3, MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for r in range(3)]
    results = _spawn(HELLO, envs)
    for rc, out, err in results:
        assert rc == 0, err
    # No LOCAL_RANK given: the host-name exchange derives it.
    assert sorted(out.strip() for _, out, _ in results) == [f"{r} 3 {r} 3" for r in range(3)]


def test_torchrun_style_single_rank_needs_no_address():
    # RANK=0 WORLD_SIZE=1 alone (a one-process debug run): a singleton, not a store on port 0.
    out = subprocess.run([sys.executable, "-c", HELLO], capture_output=True, text=True, timeout=30,
                         env=_clean_env(RANK=0, WORLD_SIZE=1, GPUCOLL_INIT_TIMEOUT=5))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0 1 0 1"


def _port_is_free(port):
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def test_slurm_step_environment_with_real_hostlist():
    # The store's port derives from the job id; take a job id whose port no other process holds
    # (the derived ports overlap the ephemeral range, where other jobs' sockets live).
    from gpucoll.bootstrap.detect import slurm_store_port
    job = next(j for j in range(4242 + os.getpid() % 1000, 10**6) if _port_is_free(slurm_store_port(j, 0)))
    host = socket.gethostname()
    envs = [_clean_env(SLURM_PROCID=r, SLURM_NTASKS=2, SLURM_LOCALID=r, SLURM_NODEID=0, SLURM_JOB_ID=job,
                       SLURM_STEP_ID=0, SLURM_STEP_NODELIST=f"{host},nodeb[01-03]",
                       SLURM_STEP_TASKS_PER_NODE="2") for r in range(2)]
    results = _spawn(HELLO, envs)
    for rc, out, err in results:
        assert rc == 0, err
    assert sorted(out.strip() for _, out, _ in results) == ["0 2 0 2", "1 2 1 2"]


def test_rank_out_of_range_is_a_clear_error():
    out = subprocess.run([sys.executable, "-c", HELLO], capture_output=True, text=True, timeout=30,
                         env=_clean_env(RANK=3, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=1))
    assert out.returncode != 0
    assert "RANK=3 is out of range for WORLD_SIZE=2" in out.stderr


def test_half_an_environment_is_refused():
    out = subprocess.run([sys.executable, "-c", HELLO], capture_output=True, text=True, timeout=30,
                         env=_clean_env(RANK=0))
    assert out.returncode != 0
    assert "RANK and WORLD_SIZE must be set together" in out.stderr


def test_ranks_that_disagree_on_the_size_are_refused():
    port = _free_port()
    envs = [_clean_env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GPUCOLL_INIT_TIMEOUT=4),
            _clean_env(RANK=1, WORLD_SIZE=3, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GPUCOLL_INIT_TIMEOUT=4)]
    results = _spawn(HELLO, envs)
    errors = "".join(err for _, _, err in results)
    assert any(rc != 0 for rc, _, _ in results)
    assert "must see the same size" in errors


def test_missing_rank_is_named_after_the_init_timeout():
    port = _free_port()
    envs = [_clean_env(RANK=r, WORLD_SIZE=3, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GPUCOLL_INIT_TIMEOUT=3)
            for r in range(2)]  # rank 2 never starts
    t0 = time.monotonic()
    results = _spawn(HELLO, envs, timeout=60)
    assert time.monotonic() - t0 < 30
    rc0, _, err0 = results[0]
    assert rc0 != 0
    assert "rank(s) 2 never joined" in err0


def test_unreachable_store_names_the_address():
    port = _free_port()
    out = subprocess.run([sys.executable, "-c", HELLO], capture_output=True, text=True, timeout=60,
                         env=_clean_env(GPUCOLL_RANK=1, GPUCOLL_SIZE=2, GPUCOLL_STORE=f"127.0.0.1:{port}",
                                        GPUCOLL_STORE_SECRET="00" * 16, GPUCOLL_INIT_TIMEOUT=2))
    assert out.returncode != 0
    assert f"127.0.0.1:{port}" in out.stderr


def test_wrong_secret_is_refused():
    from gpucoll.bootstrap.store_server import StoreServer

    with StoreServer("127.0.0.1", 0, b"right-secret-000").start() as server:
        out = subprocess.run([sys.executable, "-c", HELLO], capture_output=True, text=True, timeout=60,
                             env=_clean_env(GPUCOLL_RANK=1, GPUCOLL_SIZE=2, GPUCOLL_STORE=server.address,
                                            GPUCOLL_STORE_SECRET="ab" * 16, GPUCOLL_INIT_TIMEOUT=5))
    assert out.returncode != 0
    assert "secret" in out.stderr


@pytest.mark.parametrize("expr, hosts", [
    ("node[01-04,07],gpu-a", ["node01", "node02", "node03", "node04", "node07", "gpu-a"]),
    ("a", ["a"]),
    ("r[1-2]-n[8-9]", ["r1-n8", "r1-n9", "r2-n8", "r2-n9"]),
    ("x[098-101]", ["x098", "x099", "x100", "x101"]),
])
def test_hostlist_expansion(expr, hosts):
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize("bad", ["node[01-04", "node01]", "n[4-2]", "n[a-b]"])
def test_bad_hostlists_raise(bad):
    with pytest.raises(ValueError):
        hostlist.expand(bad)


def test_tasks_per_node_expansion():
    assert hostlist.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_one_host_name_on_two_machines_makes_two_hosts():
    from gpucoll.bootstrap.host_identity import host_labels, machine_key

    assert host_labels([("a", "k1"), ("b", "k1"), ("a", "k2"), ("a", "k1"), ("a", "k3")]) == \
        ["a", "b", "a#2", "a", "a#3"]
    boot, netns, shm = machine_key().split("/")
    assert boot and netns == str(os.stat("/proc/self/ns/net").st_ino), machine_key()


@pytest.mark.parametrize("environ, job_id, one_host", [
    ({"GPUCOLL_RANK": "1", "GPUCOLL_SIZE": "2", "GPUCOLL_STORE": "127.0.0.1:5000", "GPUCOLL_STORE_SECRET": "ab" * 16,
      "GPUCOLL_JOB_ID": "f00d"}, "f00d", False),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "3", "SLURM_JOB_ID": "77",
      "SLURM_STEP_NODELIST": "node[1-2]"}, "77.3", False),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "8",
      "SLURM_STEP_NODELIST": "node1"}, "8.0", True),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
     "10.0.0.1-29500", True),
])
def test_each_launch_names_its_job_and_whether_it_spans_hosts(environ, job_id, one_host):
    # The job id names the job's shared-memory segments, which gpurun removes at the end of the
    # job by that name (a rank that died early leaves one); one_host picks where a rank's own
    # store listens (loopback only for a job on one host).
    from gpucoll.bootstrap.detect import detect

    info = detect(environ)
    assert (info.job_id, info.one_host) == (job_id, one_host)
