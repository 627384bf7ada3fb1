"""Split, Dup and Free in real gpurun jobs (tests/scripts/comm_mgmt.py prints what each rank saw)."""
import pytest


def expected_view(members, me):
    """What describe() in comm_mgmt.py reports for a communicator of these world ranks."""
    return {"rank": members.index(me), "size": len(members), "world_ranks": members, "order": members,
            "sum_of_world_ranks": sum(members)}


@pytest.mark.parametrize("size", [1, 3, 4])
def test_split_dup_free(gpurun_job, size):
    job = gpurun_job(size, "comm_mgmt.py").check()
    results = job.json_lines()
    assert sorted(results) == list(range(size)), job.describe()
    for r, got in results.items():
        same_parity = [q for q in range(size) if q % 2 == r % 2]
        # key = -rank: the highest world rank comes first
        assert got["parity_reversed"] == expected_view(sorted(same_parity, reverse=True), r)
        # equal keys: old order; colours 1000, 1001, ...
        assert got["equal_keys"] == expected_view([q for q in range(size) if q // 2 == r // 2], r)
        # UNDEFINED gives None on rank 0 only
        if r == 0:
            assert got["undefined"] is None
        else:
            assert got["undefined"] == expected_view(list(range(1, size)), r)
        # split of the split with keys reversing the parent's (reversed) order: ascending again
        assert got["nested"] == expected_view(sorted(same_parity), r)
        assert got["parent_after_nested"] == len(same_parity)
        # Dup: same group, another name, its own messages
        assert got["dup"] == expected_view(list(range(size)), r)
        assert got["dup_name_differs"] is True
        if size > 1 and r == 1:
            assert got["world_recv_pending_after_dup_send"] is True
            assert got["received"] == {"world": 222, "dup": 111}
        assert got["interleaved"] == [sum(range(size)), 10 * (size - 1)]
        # Free: every later use raises InvalidUsageError saying the communicator was freed
        for call, message in got["after_free"].items():
            assert message.startswith("InvalidUsageError: ") and "freed" in message, (call, message)
        assert got["world_after_free"] == size
        assert got["made_and_freed"] == len(same_parity)


def test_split_with_a_bad_color_raises_on_every_rank(gpurun_job):
    job = gpurun_job(3, "split_bad.py", timeout=60)
    assert job.returncode == 0, job.describe()
    raised = job.tagged("RAISED ")
    assert sorted(raised) == [0, 1, 2], job.describe()
    for lines in raised.values():
        assert "rank(s) 1 passed a color or key that is not an integer" in lines[0]
    # The communicator stays usable; None as a color leaves rank 0 out, keys reverse the order.
    assert job.tagged("AFTER ") == {0: ["none"], 1: ["1/2"], 2: ["0/2"]}
