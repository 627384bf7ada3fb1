"""gpucoll.MPI's MPI 4 calls on 3 ranks, exact results (tests/scripts/mpi_sessions.py): sessions
and Create_from_group, partitioned point to point, and the fault-tolerance calls of a job without
failures."""
import pytest

N = 3
CONGRUENT = 1


@pytest.fixture(scope="module")
def results():
    from conftest import run_job

    job = run_job(N, "mpi_sessions.py", timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == list(range(N)), job.describe()
    return res


def test_sessions_make_communicators_from_process_sets(results):
    for r, got in results.items():
        assert got["session"] == [["mpi://WORLD", "mpi://SELF"], [str(N), "1"], N, r, sum(range(N)), CONGRUENT,
                                  True]


def test_partitioned_messages_arrive_whole_once_every_partition_is_ready(results):
    for r, got in results.items():
        left = (r - 1) % N
        assert got["partitioned"] == [[False, False, True, [10 * left + k + 1 + rnd for k in range(6)]]
                                      for rnd in range(2)]


def test_fault_tolerance_calls_without_failures(results):
    for r, got in results.items():
        agree = 0b110 & 0b111 & 0b110  # ranks 0, 1, 2 pass 0b110, 0b111, 0b110 (and'ed)
        assert got["ulfm"] == [agree, 0b1011, 0, 0, False, N, r]
