"""mpi4py's buffer specifications and null request, checked element by element on 2 and 3 ranks
(tests/scripts/mpi_specs.py)."""
import pytest

SPARE = [-1, -1, -1]


def expected(rank, n):
    root = n - 1
    tri = sum(range(n))
    return {
        "alltoall": [j * 10 + rank * 2 + k for j in range(n) for k in range(2)] + SPARE,
        "allgather": [v for j in range(n) for v in (j, j + 100)] + SPARE,
        "allgather_in_place": [v for j in range(n) for v in (j, j + 100)] + SPARE,
        "gather": ([v for j in range(n) for v in (j, -j)] if rank == root else [-1] * (2 * n)) + SPARE,
        "scatter": [rank * 7, rank * 7 + 1] + SPARE,
        "reduce_scatter_block": [tri + n * rank] * 2 + SPARE,
        "allreduce": [tri + n, tri + 2 * n, tri + 3 * n] + SPARE,
        "null": [False, True, True, True],
    }


@pytest.mark.parametrize("n", [2, 3])
def test_explicit_counts_are_per_rank_as_in_mpi4py(gpurun_job, n):
    job = gpurun_job(n, "mpi_specs.py").check()
    results = job.json_lines()
    assert sorted(results) == list(range(n))
    for rank, got in results.items():
        assert got == expected(rank, n), rank
