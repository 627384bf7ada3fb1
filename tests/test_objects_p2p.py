"""Object methods (pickle) in real gpurun jobs: bcast, allgather, gather, scatter, allreduce,
reduce, alltoall, send/recv, isend/irecv, sendrecv (tests/scripts/objects_p2p.py)."""
import math

import pytest


@pytest.mark.parametrize("size", [1, 4])
def test_object_methods(gpurun_job, size):
    job = gpurun_job(size, "objects_p2p.py").check()
    res = job.json_lines()
    assert sorted(res) == list(range(size)), job.describe()
    root = size - 1
    for r, got in res.items():
        assert got["bcast"] == [3, ["a", "b"], [0, 1, 2, 3, 4]]
        assert got["bcast_big"] == [(6 << 20) + 3, "end"]
        assert got["bcast_none"] is None
        assert got["allgather"] == [[q, 1000 * q] for q in range(size)]
        assert got["gather"] == ([["r", q] for q in range(size)] if r == root else None)
        assert got["scatter"] == {"for": r, "data": list(range(r))}
        a = got["allreduce"]
        assert a["SUM"] == size * (size + 1) // 2
        assert a["PROD"] == math.factorial(size)
        assert a["MAX"] == max(q * 7 % 5 for q in range(size))
        assert a["MIN"] == min(q * 7 % 5 - 2 for q in range(size))
        assert a["AVG"] == sum(range(size)) / size
        assert a["BOR"] == (1 << size) - 1
        assert a["list_sum"] == list(range(size))
        assert a["array_sum"] == [sum(range(size)), size]
        assert got["reduce"] == (sum(range(size)) if r == root else None)
        assert got["alltoall"] == [f"{q}->{r}" for q in range(size)]
        if size > 1:
            left = (r - 1) % size
            assert got["ring"] == [left, [left] * 3, left, 4]
            assert got["sendrecv"] == ["hi", left]
            assert got["sendrecv_status"] == [left, 6]
            if r == 1:
                assert got["send_recv"] == ["first", 100000, 99999]
        members = [q for q in range(size) if q % 2 == r % 2]
        assert got["sub_allgather"] == members
        assert got["sub_bcast"] == f"from world {members[0]}"


def test_scatter_with_a_bad_root_list_raises_everywhere(gpurun_job):
    job = gpurun_job(3, "scatter_bad_root.py", timeout=60)
    assert job.returncode == 0, job.describe()
    raised = job.tagged("RAISED ")
    assert sorted(raised) == [0, 1, 2], job.describe()
    for lines in raised.values():
        assert "must pass a sequence of 3 objects, not list of length 2" in lines[0]


def test_object_that_cannot_be_unpickled_raises_in_recv(gpurun_job):
    # The error belongs to the receive; the process's message reader keeps serving the next one.
    job = gpurun_job(2, "p2p_faults.py", "unpickle", env={"GPUCOLL_TIMEOUT": "5"}, timeout=40).check()
    assert job.tagged("RAISED ") == {1: ["this object cannot be rebuilt here"]}, job.describe()
    assert job.tagged("NEXT ") == {1: ["after"]}, job.describe()


@pytest.mark.parametrize("mode, message", [
    ("alltoall", "alltoall: every rank must pass a sequence of 3 objects; rank 1 passed list of length 2"),
    ("allgather", "allgather: rank 1 cannot pickle its object"),
    ("bcast", "bcast: the root (rank 1) cannot pickle its object"),
])
def test_bad_object_input_on_one_rank_raises_everywhere(gpurun_job, mode, message):
    job = gpurun_job(3, "objects_bad_input.py", mode, env={"GPUCOLL_TIMEOUT": "10"}, timeout=40).check()
    raised = job.tagged("RAISED ")
    assert sorted(raised) == [0, 1, 2], job.describe()
    for lines in raised.values():
        assert lines[0].startswith(message), job.describe()
    assert job.tagged("NEXT ") == {r: ["[0, 1, 2]"] for r in range(3)}, job.describe()


def test_free_fails_pending_receives_and_forgets_matching_state(gpurun_job):
    job = gpurun_job(2, "free_pending.py", timeout=60)
    assert job.returncode == 0, job.describe()
    for lines in job.tagged("PENDING ").values():
        assert "was freed while this receive was pending" in lines[0]
    assert job.tagged("LEFT ") == {0: ["0"], 1: ["0"]}


def test_a_silent_client_does_not_hold_up_delivery(gpurun_job):
    job = gpurun_job(2, "p2p_silent_client.py", timeout=60)
    assert job.returncode == 0, job.describe()
    got = job.json_lines()[1]
    assert got["got"] == "hi" and got["seconds"] < 3, got


@pytest.mark.parametrize("size", [2, 3])
def test_group_completes_send_recv_at_its_end(gpurun_job, size):
    # Every rank receives before it sends: only a group that starts the Recv without blocking
    # lets this finish (a blocking Recv fails after GPUCOLL_TIMEOUT).
    job = gpurun_job(size, "group_host.py", env={"GPUCOLL_TIMEOUT": 10}, timeout=40).check()
    res = job.json_lines()
    assert sorted(res) == list(range(size)), job.describe()
    for r, got in res.items():
        assert got["ring"] is True
        assert got["sendrecv"] == [(r - 1) % size] * 4
        assert got["allreduce_inside"] == size * (size + 1) // 2
        assert got["groups"] == [0, 1], "one group, completed at the end of the outer block"
        assert got["completed_at_end"] == 4, "Recv, Send and Sendrecv's two halves wait for the end"
