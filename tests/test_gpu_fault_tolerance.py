"""A lost rank of a GPU job (gpurun --on-failure=continue / --respawn; tests/scripts/gpu_fault_tolerance.py):
2 ranks all-reduce CuPy arrays 1,000 times, one dies by SIGALRM at a random moment, often while
the survivor's kernel waits on its flags. The survivor's kernels are released by the abort word
(well within GPUCOLL_TIMEOUT, set far above the job's limit), it gets ProcFailedError naming the
rank, revokes, shrinks (and grows with the replacement) and finishes with exact sums; after
Free nothing of gpucoll's GPU memory or of the dead rank's mappings is left, nor anything in
/dev/shm. Skipped without a GPU (make test-gpu runs them)."""

import pytest

from test_gpu_collectives import job_env, needs_gpu

pytestmark = pytest.mark.gpu

# ProcFailedError is LostPeerError (gpucoll.base.errors): the name a rank reports.
NO_TIMEOUT_RESCUE = {"GPUCOLL_TIMEOUT": "600"}  # a kernel that waited for the timeout would fail the job


def _check_clean(results):
    for rank, got in results.items():
        assert got["gpu_memory"] == [0, 0], (rank, got)   # (allocations, bytes) gpucoll still holds
        assert got["mapped"] == 0, (rank, got)            # other processes' memory still mapped


@needs_gpu
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_survivor_of_a_gpu_job_is_released_shrinks_and_finishes_exact(gpurun_job, no_leftover_segments, seed):
    job = gpurun_job(2, "gpu_fault_tolerance.py", "loop", seed, env=job_env(2, **NO_TIMEOUT_RESCUE),
                     launcher_args=("--on-failure=continue",), timeout=120).check()
    results = job.json_lines()
    assert sorted(results) == [0], job.describe()
    got = results[0]
    assert got["world"] == [0] and got["sizes"][-1] == 1, got
    assert got["errors"][0] == "LostPeerError" and "rank(s) 1 failed" in got["messages"][0], got
    assert max(got["waits"]) < 10, got   # released by the abort word, not by GPUCOLL_TIMEOUT
    assert "gpurun: rank 1 (pid" in job.stderr, job.describe()
    _check_clean(results)


@needs_gpu
def test_a_replacement_rejoins_a_gpu_job_and_the_sums_are_the_full_worlds(gpurun_job, no_leftover_segments):
    job = gpurun_job(2, "gpu_fault_tolerance.py", "respawn", 4, env=job_env(2, **NO_TIMEOUT_RESCUE),
                     launcher_args=("--respawn", 1), timeout=120).check()
    results = job.json_lines()
    assert sorted(results) == [0, 2], job.describe()   # world rank 2 replaced rank 1
    for w, got in results.items():
        assert got["world"] == [0, 2] and got["rank"] == [0, 2].index(w), (w, got)
    survivor, replacement = results[0], results[2]
    assert survivor["errors"][0] == "LostPeerError" and survivor["sizes"][-1] == 2, survivor
    assert max(survivor["waits"]) < 10, survivor
    assert replacement["started"] is not None and replacement["errors"] == [], replacement
    _check_clean(results)
