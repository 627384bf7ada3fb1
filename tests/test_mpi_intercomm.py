"""gpucoll.MPI's intercommunicators between world ranks {0, 1} and {2, 3}, exact results
(tests/scripts/mpi_intercomm.py): point to point and every kind of collective across the groups,
Merge, Split, Dup, and Accept/Connect through a port."""
import pytest

N = 4
CONGRUENT = 1


@pytest.fixture(scope="module")
def results():
    from conftest import run_job

    job = run_job(N, "mpi_intercomm.py", timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == list(range(N)), job.describe()
    return res


def sides(w):
    """(this group's world ranks, the other group's, local rank) of world rank w."""
    a, b = [0, 1], [2, 3]
    return (a, b, w) if w < 2 else (b, a, w - 2)


def test_identity_and_point_to_point(results):
    for w, got in results.items():
        mine, other, r = sides(w)
        assert got["identity"] == ["Intercomm", True, 2, 2, 2, "Intercomm"]
        assert got["p2p"] == other[r]  # remote rank r is the other group's r-th process
        assert got["p2p_bad_rank"] is True, "a send to a remote rank that does not exist must raise ERR_RANK"


def test_rooted_and_all_collectives_reach_the_other_group(results):
    for w, got in results.items():
        mine, other, r = sides(w)
        # group A's rank 1 broadcast to group B; group A's own buffers are left alone
        assert got["bcast"] == ([10] * 3 if w >= 2 else ([10] * 3 if w == 1 else [-1] * 3))
        ag, a2a, red, objects = got["all"]
        assert ag == other and objects == other
        assert a2a == [100 * o + r for o in other]  # block r of each remote rank
        assert red == [float(sum(other)), 2.0]
        assert got["gatherv"] == ([0, 1, 1] if w == 2 else None)
        assert got["derived"][0] == (max(other) if w == 0 else None)


def test_merge_split_dup(results):
    for w, got in results.items():
        _, _, r = sides(w)
        merged_rank = w - 2 if w >= 2 else w + 2  # group B passed high=False: it comes first
        assert got["derived"][1:] == [merged_rank, 4, 1, 1, 2, CONGRUENT]


def test_accept_connect_through_a_port(results):
    for w, got in results.items():
        assert got["port"] == [2, None if w < 2 else "hello"]


def test_reduce_scatter_across_groups_is_refused_by_name(results):
    for got in results.values():
        assert "reduce-scatter across an intercommunicator" in got["unsupported"]
        assert "gpucoll.MPI.Intercomm.Reduce_scatter_block" in got["unsupported"]
