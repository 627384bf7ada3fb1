"""gpucoll.MPI's Cartesian, graph and distributed-graph communicators and the neighbourhood
collectives on them, exact results on 4 ranks (tests/scripts/mpi_topology.py)."""
import pytest

N = 4
PROC_NULL, UNDEFINED = -2, -32766


@pytest.fixture(scope="module")
def results():
    from conftest import run_job

    job = run_job(N, "mpi_topology.py", timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == list(range(N)), job.describe()
    return res


def grid(r):
    """Coordinates, and the (source, dest) shifts along each dimension, of rank r in the 2 x 2 grid
    periodic in dimension 0 only (row-major: rank = 2 * c0 + c1)."""
    c0, c1 = divmod(r, 2)
    flip = r ^ 2
    along1 = (PROC_NULL, r + 1) if c1 == 0 else (r - 1, PROC_NULL)
    return [c0, c1], (flip, flip), along1


def test_cartesian_grid(results):
    for r, got in results.items():
        coords, along0, along1 = grid(r)
        edges = [*along0, *along1]
        assert got["cart"] == ["Cartcomm", True, [[2, 2], [1, 0], coords], list(along0), list(along1), 3,
                               [edges, edges], [[2], [0], [coords[1]]], 2, "Cartcomm", [2, 2],
                               r if r < 3 else UNDEFINED, "TypeError", r == 3]


def test_cartesian_neighbourhood_collectives(results):
    for r, got in results.items():
        _, (q, _), (src1, dst1) = grid(r)
        alltoall, gathered, objects = got["cart_neighbor"]
        # along the periodic dimension of size 2 both neighbours are rank q: its two blocks arrive
        assert sorted(alltoall[:2]) == [100 * q, 100 * q + 1]
        # along the other: the block the neighbour sent toward this rank; nothing from off the edge
        assert alltoall[2] == (-1 if src1 == PROC_NULL else 100 * src1 + 3)
        assert alltoall[3] == (-1 if dst1 == PROC_NULL else 100 * dst1 + 2)
        assert gathered == [q, q, -1 if src1 == PROC_NULL else src1, -1 if dst1 == PROC_NULL else dst1]
        assert objects == [q, q, None if src1 == PROC_NULL else src1, None if dst1 == PROC_NULL else dst1]


def test_graph_ring(results):
    for r, got in results.items():
        left, right = (r - 1) % N, (r + 1) % N
        assert got["graph"] == [[N, 2 * N], [left, right], 2, [left, left + 0.5, right, right + 0.5],
                                [f"{left}>{r}", f"{right}>{r}"]]


def test_distributed_graph(results):
    for r, got in results.items():
        sources = sorted([(r - 1) % N, (r - 2) % N])              # in-edges, by the rank that gave them
        weights = [7 if s == (r - 1) % N else 8 for s in sources]
        neighbors, count, alltoallw, adjacent, alltoallv = got["dist"]
        assert neighbors == [sources, [(r + 1) % N, (r + 2) % N], [weights, [7, 8]]]
        assert count == [2, 2, True]
        # block k from source k: the block that source addressed to this rank (its 1st or 2nd edge)
        assert alltoallw == [10 * s + (1 if s == (r - 1) % N else 2) for s in sources]
        assert adjacent == [[(r - 1) % N], [(r + 1) % N]]
        assert alltoallv == [(r - 1) % N] * 2
