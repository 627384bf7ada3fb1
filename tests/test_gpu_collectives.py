"""GPU collectives through real gpurun jobs (CuPy arrays and torch tensors), 1 and 2 ranks.

Skipped where there is no CUDA GPU or no CuPy (CI); `make test-gpu` runs them on a GPU
machine. tests/scripts/gpu_cases.py checks every result bit for bit against NumPy and
across ranks, then stream semantics, event-backed requests and CUDA-graph capture.
"""
import importlib.util
import re

import pytest

from conftest import requires

pytestmark = pytest.mark.gpu


def _gpus():
    """(GPUs, why they skip, why they fail): only CuPy not installed or no GPU seen by the
    driver skip; a CuPy that is installed but does not import, or a failing driver, fails."""
    if importlib.util.find_spec("cupy") is None:
        return 0, "needs CuPy (not installed) and a CUDA GPU", None
    try:
        import cupy  # noqa: F401

        from gpucoll._native import cuda

        count = cuda.device_count() if cuda.available() else 0
    except Exception as exc:
        return 0, None, f"CuPy is installed but the GPU probe failed: {type(exc).__name__}: {exc}"
    return count, None if count else "needs a CUDA GPU (the driver sees none)", None


NGPUS, _NO_GPU, BROKEN = _gpus()


# Skip without a GPU (a failure under GPUCOLL_TEST_REQUIRE=gpu); fail when CuPy is broken.
needs_gpu = requires("gpu", _NO_GPU, broken=BROKEN)

# NVLink multicast stays off in anything these jobs start (NCCL, torch, NVSHMEM).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def job_env(nranks, **extra):
    """The environment of an nranks-rank GPU job: one GPU per rank where there are enough,
    else ranks share GPUs and still run the IPC kernels (GPUCOLL_GPU_SHARED_IPC=1; slower,
    the same results)."""
    env = {**SAFE_ENV, **extra}
    if nranks > NGPUS:
        env["GPUCOLL_GPU_SHARED_IPC"] = "1"
    return env


@needs_gpu
@pytest.mark.parametrize("nranks", [1, 2])
def test_gpu_collectives(gpurun_job, nranks):
    job = gpurun_job(nranks, "gpu_cases.py", env=job_env(nranks), timeout=900).check()
    results = job.json_lines()
    assert sorted(results) == list(range(nranks)), job.describe()
    for rank, res in results.items():
        assert res["nfail"] == 0, f"rank {rank}: {res['nfail']} failures: {res['failures']}"
        assert res["checked"] > 100
        assert res["paths"]["p2p-off"] > 0 and res["paths"]["small-stage"] > 0
        ran = {path: set(st["gpu"]) for path, st in res["stats"].items()}  # algorithms that ran, per pass
        if nranks == 1:
            assert ran == {"world": {"copy"}, "small-stage": {"copy"}, "p2p-off": {"copy"}}, ran
            continue
        # the IPC kernels ran where P2P is on, and host memory carried everything where it is off
        assert {"one-shot", "two-shot", "staged", "registered copy-engine"} <= ran["world"], ran
        assert {"one-shot", "two-shot", "staged", "registered", "two-shot registered"} <= ran["small-stage"], ran
        assert not {"host-staged", "host-pipelined"} & (ran["world"] | ran["small-stage"]), ran
        # through host memory: all-reduce, broadcast and reduce in pinned chunks, the other kinds whole
        assert ran["p2p-off"] == {"host-staged", "host-pipelined"} and res["stats"]["p2p-off"]["host"], ran


@needs_gpu
@pytest.mark.parametrize("nranks", [3, 4])
def test_gpu_collectives_on_more_ranks_than_two(gpurun_job, nranks):
    # The n-rank kernels (what 4- and 8-GPU hosts run), with ranks sharing GPUs where there are
    # fewer: every collective exact, results identical across ranks, the IPC kernels really ran.
    job = gpurun_job(nranks, "gpu_cases.py", "--quick", env=job_env(nranks), timeout=900).check()
    results = job.json_lines()
    assert sorted(results) == list(range(nranks)), job.describe()
    for rank, res in results.items():
        assert res["nfail"] == 0, f"rank {rank}: {res['nfail']} failures: {res['failures']}"
        assert res["checked"] > 100 and res["identical"] > 100, res
        ran = set(res["stats"]["world"]["gpu"])
        assert {"one-shot", "two-shot", "staged"} <= ran and not {"host-staged", "host-pipelined"} & ran, ran


@needs_gpu
def test_gpu_disagreeing_roots_raise_on_every_rank_at_that_call(gpurun_job):
    # The kernels carry no call signature: rooted GPU calls compare every rank's on the host
    # before launching (tests/scripts/roots.py with CuPy buffers; 3 ranks, sharing GPUs if
    # there are fewer).
    from test_faults import assert_roots_raised_at_the_call

    job = gpurun_job(3, "roots.py", "--gpu", env=job_env(3, GPUCOLL_TIMEOUT=20), timeout=600).check()
    assert_roots_raised_at_the_call(job)


@needs_gpu
def test_gpu_debug_log_names_algorithm_and_transport(gpurun_job):
    # 2 ranks take one-shot while a message fits a slot: the limit makes 1 MiB go two-shot
    env = job_env(2, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="COLL", GPUCOLL_GPU_ONESHOT_MAX="256K")
    job = gpurun_job(2, "gpu_log.py", env=env, timeout=120).check()
    assert all(v["sum"] == 4 for v in job.json_lines().values()), job.describe()
    text = job.stderr + job.stdout
    assert "1048576 B float32 SUM two-shot via P2P/IPC" in text, text[-3000:]
    assert "64 B float32 SUM one-shot via P2P/IPC" in text, text[-3000:]


@needs_gpu
def test_gpu_timeout_names_operation_and_peer(gpurun_job):
    env = job_env(2, GPUCOLL_TIMEOUT="4")
    job = gpurun_job(2, "gpu_timeout.py", env=env, timeout=120).check()
    res = job.json_lines()
    assert all(r["fast_wrong"] == [] and r["dup_sum"] == 8.0 for r in res.values()), job.describe()
    assert all(r["fast_calls"] == 4 for r in res.values()), "repeated calls did not take the packed launch"
    assert all(r["size_check"] == "InvalidUsageError" for r in res.values()), job.describe()
    r0 = res[0]
    assert r0["raised"] and r0["ranks"] == [1], job.describe()
    assert f"allreduce #{r0['seq']}" in r0["raised"] and "for rank 1" in r0["raised"], r0["raised"]
    assert r0["next"] == "TimeoutError"


@needs_gpu
def test_gpu_slot_timeout_names_the_peer_on_both_sides(gpurun_job):
    env = job_env(2, GPUCOLL_TIMEOUT="4")
    res = gpurun_job(2, "gpu_slot_timeout.py", env=env, timeout=120).check().json_lines()
    assert res[0]["warm"] and res[1]["warm"], res
    assert res[0]["slots_before"], "the 32 small GPU messages before the stalled one did not arrive intact"
    assert res[1]["slot_sender"] and "rank 0" in res[1]["slot_sender"], res
    assert res[0]["slot_receiver"] and "rank 1" in res[0]["slot_receiver"], res


@needs_gpu
def test_gpu_free_raises_and_exit_reports_a_slot_timeout_nothing_raised(gpurun_job):
    job = gpurun_job(2, "gpu_slot_exit.py", "free", env=job_env(2, GPUCOLL_TIMEOUT="4"), timeout=120).check()
    res = job.json_lines()
    assert res[0]["warm"] and res[1]["warm"], res
    assert res[1]["free"] and "rank 0" in res[1]["free"], f"Free dropped the recorded slot timeout: {res}"
    report = [line for line in job.stderr.splitlines() if "at exit: point to point on GPU" in line]
    assert len(report) == 1 and f"communicator {res[1]['left']})" in report[0] and "rank 0" in report[0], \
        job.stderr[-3000:]


@needs_gpu
def test_gpu_messages_are_read_before_their_sender_exits(gpurun_job):
    job = gpurun_job(2, "gpu_slot_exit.py", "exit", env=job_env(2, GPUCOLL_TIMEOUT="8"), timeout=120).check()
    res = job.json_lines()
    assert res[0] == {"warm": True, "small": True, "full": True}, f"read after their sender ended: {res}"
    assert "at exit" not in job.stderr, job.stderr[-3000:]


@needs_gpu
def test_gpu_point_to_point(gpurun_job):
    env = job_env(2, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="P2P", GPUCOLL_TIMEOUT="60")
    job = gpurun_job(2, "gpu_p2p.py", env=env, timeout=300).check()
    results = job.json_lines()
    assert sorted(results) == [0, 1], job.describe()
    for rank, res in results.items():
        assert res["nfail"] == 0, f"rank {rank}: {res['failures']}"
    assert results[1]["checked"] > 120
    text = job.stderr + job.stdout
    for path in ("announced for a pull over P2P/IPC", "pulled via P2P/IPC", "via host memory",
                 "via its GPU outbox slot", "out of its GPU outbox slot"):
        assert path in text, text[-3000:]


@needs_gpu
@pytest.mark.parametrize("nranks", [1, 2])
def test_gpu_group_fuses_small_allreduces(gpurun_job, nranks):
    env = job_env(nranks, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="COLL", GPUCOLL_TIMEOUT="60")
    job = gpurun_job(nranks, "gpu_group.py", env=env, timeout=600).check()
    results = job.json_lines()
    assert sorted(results) == list(range(nranks)), job.describe()
    for rank, res in results.items():
        assert res["nfail"] == 0, f"rank {rank}: {res['failures']}"
        assert res["checked"] > 300
    if nranks > 1:
        text = job.stderr + job.stdout
        batches = [int(n) for n in re.findall(r"\((\d+) fused\) \d+ B float32 one-shot fused via P2P/IPC", text)]
        # per rank: the 130 float32 all-reduces in 64 + 64 + 2, the mixed group's 2, the two streams' 2,
        # the graph's 10 (warm-up, then capture)
        assert sorted(batches) == sorted([64, 64, 2, 2, 2, 10, 10] * nranks), batches
    # comm.stats() counts those 7 float32 launches of 154 all-reduces per rank, plus the float64 and
    # int32 launches of 10 each in the first group (none on one rank)
    for rank, res in results.items():
        assert res["fused"] == ([9, 174] if nranks > 1 else [0, 0]), (rank, res["fused"])
