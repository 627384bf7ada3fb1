"""gpucoll.MPI's one-sided communication on 3 ranks, exact results (tests/scripts/mpi_rma.py):
fence, lock and post/start epochs, atomic fetch-and-op and compare-and-swap, request-based
operations, dynamic and shared windows; contention and layouts. Every test runs twice: with
direct access to the other processes' memory (one host: the default) and through the targets'
service threads (GPUCOLL_RMA_DIRECT=0, as between hosts)."""
import pytest

N = 3
ROUNDS = 100  # mpi_rma.py's increments per rank in the contended counters


@pytest.fixture(scope="module", params=["direct", "service thread"])
def results(request):
    from conftest import run_job

    direct = request.param == "direct"
    job = run_job(N, "mpi_rma.py", env={"GPUCOLL_RMA_DIRECT": int(direct)}, timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == list(range(N)), job.describe()
    assert all(got["direct"] == direct for got in res.values()), job.describe()
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


def test_contended_counters_lose_no_update(results):
    """Fetch_and_op under shared locks is atomic by itself; a Get, add and Put is safe under
    exclusive locks: every rank's increments are there, and no two fetches saw the same value."""
    for r, got in results.items():
        distinct, counters = got["contended"]
        assert distinct
        if r == 0:
            assert counters == [ROUNDS * N, ROUNDS * N]


def test_strided_layouts_and_bounds(results):
    for r, got in results.items():
        left = (r - 1) % N
        strided, fetched, accumulated, beyond = got["layouts"]
        assert strided == [left, -1, left + 10]          # every other int, the gap untouched
        assert fetched == [(left - 1) % N, (left - 1) % N + 10]
        assert accumulated == [left + 1, -1, left + 11]
        assert f"{N * 4} bytes" in beyond, beyond       # the error names the window's size


def test_a_lock_never_released_times_out_with_a_reason():
    """Direct access: a Lock that cannot be granted raises after GPUCOLL_TIMEOUT, naming the
    window's rank and the setting, instead of hanging; once released, the lock is granted."""
    from conftest import run_job

    job = run_job(2, "mpi_rma_lock_timeout.py", env={"GPUCOLL_TIMEOUT": 2}, timeout=60).check()
    res = job.json_lines()
    assert all(got["direct"] for got in res.values()), job.describe()
    error = res[1]["error"]
    assert error is not None and "rank 0's window stayed locked" in error and "GPUCOLL_TIMEOUT" in error, error
    assert 1.5 <= res[1]["waited"] < 20, res[1]
