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


def test_ranks_that_would_move_an_all_to_all_differently_get_a_mismatch():
    # rank 0 in place stages its blocks, the others would read theirs from their senders: every
    # rank fails in that call instead of reading staged bytes as an address
    from conftest import run_job

    job = run_job(4, "alltoall_single_copy.py", "mixed", timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2, 3], job.describe()
    for rank, got in res.items():
        assert got["outcome"].startswith("MismatchError: alltoall #"), (rank, got)
    assert any("read from its senders" in got["outcome"] for got in res.values()), res
