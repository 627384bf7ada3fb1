"""GPU buffers between two pretend hosts over OFI: GPUCOLL_SHM_DISABLE=1 and GPUCOLL_P2P_DISABLE=1
make two ranks of one GPU machine talk as ranks on two hosts do (GPU data staged through host
memory, host channels on libfabric's tcp provider with GPUCOLL_NET=ofi). `make test-gpu`."""
import pytest

from conftest import ofi_missing, requires
from test_gpu_collectives import job_env, needs_gpu

pytestmark = [pytest.mark.gpu, requires("ofi", ofi_missing())]
APART = {"GPUCOLL_SHM_DISABLE": "1", "GPUCOLL_P2P_DISABLE": "1", "GPUCOLL_NET": "ofi"}


@needs_gpu
def test_gpu_point_to_point_across_the_ofi_path_is_exact(gpurun_job):
    env = job_env(2, **APART, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="P2P,NET", GPUCOLL_TIMEOUT="60")
    job = gpurun_job(2, "gpu_p2p.py", env=env, timeout=300).check()
    results = job.json_lines()
    assert sorted(results) == [0, 1], job.describe()
    for rank, res in results.items():
        assert res["nfail"] == 0, f"rank {rank}: {res['failures']}"
    text = job.stderr + job.stdout
    assert "via host memory" in text and "via OFI tcp;ofi_rxm" in text, text[-3000:]
    assert "via P2P/IPC" not in text, text[-3000:]


@needs_gpu
def test_gpu_buffers_between_pretend_hosts_over_ofi_are_exact(gpurun_job):
    """GPUCOLL_TEST_HOST=pretend%r: each rank its own host, GPU data through pinned host chunks, the
    host collectives between them on OFI."""
    env = job_env(2, GPUCOLL_TEST_HOST="pretend%r", GPUCOLL_NET="ofi", GPUCOLL_GPU_HOST_CHUNK="256K",
                  GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="COLL")
    job = gpurun_job(2, "gpu_any_device.py", "cupy", "--pick", env=env, timeout=300).check()
    res = job.json_lines()
    assert all(r["exact"] and all(r["exact"]) for r in res.values()), res
    assert "via OFI" in job.stderr and "via TCP" not in job.stderr, job.stderr[-3000:]


@needs_gpu
def test_gpu_collectives_across_the_ofi_path_are_exact(gpurun_job):
    env = job_env(2, **APART, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="NET")
    job = gpurun_job(2, "gpu_cases.py", "--quick", env=env, timeout=600).check()
    assert "OFI channel" in job.stderr, job.stderr[-3000:]
