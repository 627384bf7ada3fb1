"""gpucoll.MPI's one-sided communication on 3 ranks, exact results (tests/scripts/mpi_rma.py):
fence, lock and post/start epochs, atomic fetch-and-op and compare-and-swap, request-based
operations, dynamic and shared windows."""
import pytest

N = 3


@pytest.fixture(scope="module")
def results():
    from conftest import run_job

    job = run_job(N, "mpi_rma.py", timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == list(range(N)), job.describe()
    return res


def test_fence_epochs(results):
    for r, got in results.items():
        left = (r - 1) % N
        after_put, fetched, accumulated, unit, allocate, unified = got["fence"]
        expect = [0] * N
        expect[left] = 100 + left                 # my left neighbour wrote its slot of my window
        assert after_put == expect
        theirs = [0] * N
        theirs[(left - 1) % N] = 100 + (left - 1) % N
        assert fetched == theirs                  # my left neighbour's window, as the Put left it
        if r == 0:                                # every rank added r + 1 to each slot
            assert accumulated == [a + sum(range(1, N + 1)) for a in expect]
        assert [unit, allocate, unified] == [4, True, True]


def test_exclusive_locks_make_fetch_and_op_atomic(results):
    values = []
    for r, got in results.items():
        distinct, counter, old, slot = got["atomic"]
        assert distinct
        if r == 0:
            assert counter == 20 * N and 1 <= slot <= N
        values.append(old)
    assert sorted(values).count(0) == 1           # one compare-and-swap found 0 and swapped
    assert all(v == 0 or 1 <= v <= N for v in values)


def test_post_start_complete_wait_and_requests(results):
    for r, got in results.items():
        if r == 0:
            assert got["pscw"][1:] == [50 + k for k in range(1, N)]
        left = (r - 1) % N
        assert got["requests"] == [7 * left, 7 * ((left - 1) % N)]


def test_dynamic_and_shared_windows(results):
    for r, got in results.items():
        left = (r - 1) % N
        assert got["dynamic"] == [0, left + 1]
        same_host, views = got["shared"]
        assert same_host
        assert views == [[k + 10] * (k + 1) for k in range(N)]
