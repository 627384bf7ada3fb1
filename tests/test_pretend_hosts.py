"""GPUCOLL_TEST_HOST: ranks of one machine act as ranks of different hosts (no shared memory or
CUDA IPC between them, TCP), so the paths between hosts can be tested where no network
namespaces can be made (the GPU machine). The collectives stay exact and really go over TCP."""
import re

import pytest

from test_gpu_collectives import SAFE_ENV, needs_gpu


def test_each_rank_its_own_host_over_tcp(gpurun_job):
    env = {"GPUCOLL_TEST_HOST": "pretend%r", "GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL,NET"}
    job = gpurun_job(3, "multihost_cases.py", "--bytes", 1 << 20, env=env, timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2], job.describe()
    for rank, r in res.items():
        assert all(r["ok"].values()), f"rank {rank}: wrong results {r['ok']}"
        assert (r["local_rank"], r["local_size"]) == (0, 1), r
    colls = re.findall(r"gpucoll INFO \[COLL\] allreduce #\d+ \d+ B .* via (\S+)$", job.stderr, re.M)
    assert colls and set(colls) == {"TCP"}, colls  # no shared memory between the pretend hosts
    assert "launcher says local rank" not in job.stderr


@pytest.mark.gpu
@needs_gpu
def test_gpu_buffers_between_pretend_hosts_go_through_pinned_chunks(gpurun_job):
    env = {**SAFE_ENV, "GPUCOLL_TEST_HOST": "pretend%r", "GPUCOLL_GPU_HOST_CHUNK": "256K",
           "GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL"}
    job = gpurun_job(2, "gpu_any_device.py", "cupy", "--pick", "--capture", env=env, timeout=300).check()
    res = job.json_lines()
    assert all(r["exact"] == [True, True, True] for r in res.values()), res
    # replaying the copies without the host collective would be a wrong result: refused at capture
    assert all("goes through host memory (" in r["capture"] and "cannot be captured in a CUDA graph" in r["capture"]
               for r in res.values()), res
    text = job.stderr
    assert re.search(r"allreduce #\d+ 4000 B float32 SUM host-pipelined via host memory in 1 pinned chunk\(s\) "
                     r"\(.*ranks on other hosts", text), text[-3000:]
    assert "via TCP" in text and "SHM" not in text, text[-3000:]
