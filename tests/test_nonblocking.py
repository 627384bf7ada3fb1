"""Nonblocking collectives and point-to-point in a real gpurun job (tests/scripts/nonblocking.py):
several operations in flight at once, Test() while a peer is late, Isend/Irecv with tags,
ANY_SOURCE and ANY_TAG, statuses, FIFO order between a pair, Waitany."""
import pytest

import gpucoll


@pytest.mark.parametrize("size", [3])
def test_nonblocking(gpurun_job, size):
    # A receive that never matches fails after GPUCOLL_TIMEOUT instead of hanging the job.
    job = gpurun_job(size, "nonblocking.py", env={"GPUCOLL_TIMEOUT": 15}).check()
    res = job.json_lines()
    assert sorted(res) == list(range(size)), job.describe()
    for r, got in res.items():
        f = got["in_flight"]
        assert f["allreduce"] == [size * (size + 1) / 2] * 5
        assert f["bcast"] == [0, 1, 2, 3, 4]
        assert f["allgather"] == [v for q in range(size) for v in (q, -q)]
        assert f["reduce_scatter"] == [size * (3 * r + j) for j in range(3)]  # MAX of k*(rank+1)
        assert f["alltoall"] == [10 * q + r for q in range(size)]
        assert f["scatter"] == [2 * r, 2 * r + 1]
        assert f["blocking_after"] == sum(range(size))
        assert f["all_tested_true"] is True
        if r == 0:
            assert f["reduce"] == [sum(range(size)), size]
            assert f["gather"] == list(range(size))

        o = got["overlap"]
        assert o["value"] == sum(range(size))
        assert o["done"] is True
        if r != 0:  # rank 0 called 1 s late: the others saw the operation pending, kept working
            assert o["first_test"] is False
            assert o["waited"] >= 0.5 and o["work_done_while_pending"] > 10, o

    p2p = res[0]["p2p"]
    assert p2p["any_source"] == [[q, 99, 100 + q] for q in range(1, size)]
    assert p2p["tagged"] == {str(q): [q, q * q] for q in range(1, size)}
    assert p2p["by_tag"] == [1, 2]
    assert p2p["status_of_tag2"] == [1, 2, 8]
    assert p2p["any_any"] == [[q, 30 + q, 1000 + q] for q in range(1, size)]
    assert p2p["fifo"] == list(range(20))
    assert p2p["waitany"] == list(range(1, size)) and "waitany_status_wrong" not in p2p
    assert p2p["waitany_empty"] == gpucoll.UNDEFINED
    assert p2p["irecv_status"] == [[q, 55, 8] for q in range(1, size)]
    assert p2p["irecv_types"] == ["gpucoll._native.p2p.P2PRequest"]
    for r in range(1, size):
        assert res[r]["p2p"] == {
            "isends_tested_true": True,
            "isend_requests": [True, True, True, [True, None], None, "<Request Isend done>"],
            "isend_types": ["gpucoll._native.p2p.P2PRequest"],
            "isend_cancel": "cancelling a started gpucoll operation is not supported"}


def test_waitany_ends_after_the_timeout(gpurun_job):
    job = gpurun_job(2, "waitany_timeout.py", timeout=60)
    assert job.returncode == 0, job.describe()
    got = job.json_lines()[1]
    assert got["type"] == "TimeoutError", got
    assert "none of 2 requests (Irecv) completed within 1 s" in got["message"]
    assert 0.9 <= got["seconds"] < 5, got
