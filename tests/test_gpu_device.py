"""Which GPU a rank uses (docs/gpu.md, "Which GPU a rank uses"): the GPU of its buffers. A script
that never selects a device runs under gpurun and mpiexec, one GPU per rank or several ranks per
GPU; one that selects its own is obeyed; GPUCOLL_DEVICE pins a rank and refuses buffers elsewhere."""
import json
import os
import subprocess
import sys

import pytest

from conftest import requires
from test_gpu_collectives import NGPUS, SAFE_ENV, needs_gpu
from test_mpi_dropin import _mpiexec

pytestmark = [pytest.mark.gpu, needs_gpu]
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "gpu_any_device.py")


def _check(results, nranks, expect_devices):
    assert sorted(results) == list(range(nranks)), results
    for r, res in results.items():
        assert res["exact"] == [True, True, True], f"rank {r}: {res}"
        assert res["device"] == expect_devices[r], f"rank {r} used GPU {res['device']}: {res}"


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_script_that_never_selects_a_device(gpurun_job, lib, nranks):
    if lib == "torch":
        pytest.importorskip("torch")
    job = gpurun_job(nranks, SCRIPT, lib, env=dict(SAFE_ENV), timeout=120).check()
    _check(job.json_lines(), nranks, [0] * nranks)  # every array on the current device, GPU 0
    warned = [line for line in job.lines(0, "stderr") if "ranks share a GPU and others stay idle" in line]
    # Ranks crowding GPU 0 while other GPUs idle is worth one warning, from rank 0; with one GPU, nothing to say.
    assert len(warned) == (1 if NGPUS > 1 else 0), job.lines(0, "stderr")


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_script_that_selects_its_device_is_obeyed(gpurun_job, lib):
    if lib == "torch":
        pytest.importorskip("torch")
    job = gpurun_job(2, SCRIPT, lib, "--pick", env=dict(SAFE_ENV), timeout=120).check()
    results = job.json_lines()
    _check(results, 2, [r % NGPUS for r in range(2)])
    assert [results[r]["current"] for r in range(2)] == [r % NGPUS for r in range(2)]
    assert not any("others stay idle" in line for line in job.lines(0, "stderr"))


@requires("mpi4py", None if _mpiexec() else "needs mpi4py and Open MPI's mpiexec")
def test_script_that_never_selects_a_device_under_mpiexec():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCOLL_")}
    env.update(SAFE_ENV, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader,tcp")
    proc = subprocess.run([_mpiexec(), "--oversubscribe", "-n", "2", sys.executable, SCRIPT, "cupy"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            results[res["rank"]] = res
    _check(results, 2, [0, 0])


def test_gpucoll_device_pins_the_rank():
    # GPUCOLL_DEVICE=1 pins the rank to GPU 1; memory of GPU 0 (CuPy's default device) is refused
    # before anything touches GPU 1, so one GPU is enough to check it.
    code = ("import cupy as cp, gpucoll\n"
            "x, y = cp.ones(8, cp.float32), cp.zeros(8, cp.float32)\n"
            "try:\n"
            "    gpucoll.COMM_WORLD.Allreduce(x, y)\n"
            "    print('no error')\n"
            "except gpucoll.InvalidUsageError as exc:\n"
            "    print('InvalidUsageError:', exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCOLL_")}
    env["GPUCOLL_DEVICE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("InvalidUsageError: allreduce: sendbuf is on GPU 0 but this communicator ("), line
    assert line.endswith(" uses GPU 1 (GPUCOLL_DEVICE pins this rank to it): allocate it on GPU 1"), line


@pytest.mark.skipif(NGPUS < 2, reason="needs 2 GPUs")
def test_second_device_on_one_communicator_is_refused(gpurun_job):
    code = ("import cupy as cp, gpucoll\n"
            "c = gpucoll.COMM_WORLD\n"
            "c.Allreduce(cp.ones(8, cp.float32), cp.zeros(8, cp.float32))\n"
            "with cp.cuda.Device(1):\n"
            "    x, y = cp.ones(8, cp.float32), cp.zeros(8, cp.float32)\n"
            "try:\n"
            "    c.Allreduce(x, y)\n"
            "    print('no error')\n"
            "except gpucoll.InvalidUsageError as exc:\n"
            "    print('InvalidUsageError:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if not k.startswith("GPUCOLL_")})
    assert out.returncode == 0, out.stderr
    assert "uses GPU 0 (its GPU collectives run on the GPU of its first GPU buffer" in out.stdout, out.stdout
