"""Large all-to-alls within a host read each block straight from the sender's buffer
(process_vm_readv, gc_direct.h gc__alltoall_cma) once the send buffer reaches
GPUCOLL_HOST_SINGLE_COPY_MIN (4 MiB unset); smaller ones and in-place calls go through the
shared segment. Both ways exact (tests/scripts/alltoall_single_copy.py)."""
import pytest

KIB = 1 << 10


def single_copy_calls(np_, env=None):
    from conftest import run_job

    job = run_job(np_, "alltoall_single_copy.py", env=env, timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == list(range(np_)), job.describe()
    for r, got in res.items():
        assert all(got["exact"].values()), (r, got)
    calls = {tuple(sorted(got["single_copy"].items())) for got in res.values()}
    assert len(calls) == 1, res  # every rank took the same way in every call
    return {int(size): n for size, n in calls.pop()}


@pytest.mark.parametrize("np_", [2, 4])
def test_send_buffers_from_the_limit_go_by_single_copy(np_):
    # blocks of 1 KiB-2 MiB: only np_ x 2 MiB reaches the 4 MiB default
    assert single_copy_calls(np_) == {KIB: 0, 8 * KIB: 0, 64 * KIB: 0, 512 * KIB: 0, 2048 * KIB: 1}


def test_the_variable_sets_the_limit():
    calls = single_copy_calls(4, env={"GPUCOLL_HOST_SINGLE_COPY_MIN": "64K"})
    assert calls == {KIB: 0, 8 * KIB: 0, 64 * KIB: 1, 512 * KIB: 1, 2048 * KIB: 1}
    calls = single_copy_calls(4, env={"GPUCOLL_HOST_SINGLE_COPY_MIN": "0"})
    assert set(calls.values()) == {0}
