"""gpucoll.MPI with GPU arrays (2 ranks; `make test-gpu`): tests/scripts/mpi_gpu.py."""
import pytest

from test_gpu_collectives import NGPUS, job_env

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(NGPUS < 1, reason="needs a CUDA GPU and CuPy")
def test_mpi_module_with_gpu_arrays(gpurun_job):
    res = gpurun_job(2, "mpi_gpu.py", env=job_env(2), timeout=120).check().json_lines()
    for r, got in res.items():
        assert got["collectives"] == [[3.0] * 5, [2.0] * 5, [0, 1, 2, 3]]
        ops = got["host ops"]  # ops the GPU path lacks, through host memory
        assert ops["land"] == [1, 0, 0, 1, 0] and ops["lor"] == ([1, 1, 1, 1, 0] if r == 0 else None)
        assert ops["user"] == [3.0, 1.0] and ops["reduce_local"] == [10, 11, 12, 13]
        peer = 1 - r  # each rank put, accumulated and fetched-and-added into the other's window
        fetched, old, window = got["rma"]
        assert fetched == [1.0 + r, 2.0 + r, 100.0 * peer, 100.0 * peer + 5.0]
        assert old == [100.0 * peer] and window == [1.0 + peer, 2.0 + peer, 100.0 * r + 1.0, 100.0 * r + 5.0]
        derived = got["derived"]  # packed on the device, the caller's layout written back
        assert derived["bcast"] == [11.0] * 5
        assert derived["allreduce"] == [3.0, -1.0 * (r + 1), 6.0, -2.0 * (r + 1)]
        assert derived["iallgather"] == [5.0, 6.0, 6.0, 7.0]
        assert got["host_interface"] == [3.0] * 3  # host memory behind __cuda_array_interface__
        assert got["bottom"] == [3.0 * r + j + 10 * k for k in range(2) for j in range(3)]
        assert got["staged calls"] == [32, [0.0 + r, 1.0 + r, 2.0 + r, 3.0 + r], [True, True],
                                       [10.0 * (1 - r) + k for k in range(4)]]
        # the elements counts and displacements name, and no others
        assert got["counted"] == [[-1.0, -1.0, 0.0, 1.0, 2.0, -1.0], [3.0, 3.0, r + 1.0, r + 1.0]]
        assert got["per rank"] == [[0.0, 1.0, -1.0, -1.0], [2.0 * r, 2.0 * r + 1]]
        assert got["inter"] == [[2.0 - r] * 2, [-1, -1, -1] if r == 0 else [0, 1, 2]]  # the remote group's
        host = got["through host"]
        assert host["allgatherv"] == [0.0, 10.0, 11.0]
        assert host["gatherv"] == ([0.0, 10.0, 11.0] if r == 0 else [0.0, 0.0, 0.0])
        assert host["scatterv"] == [[0.0], [10.0, 11.0]][r]
        assert host["ialltoallv"] == [r, 100 + r]
        assert host["reduce_scatter"] == [[0.0], [2.0, 4.0]][r]  # the sum of both ranks' 0, 1, 2
        assert host["scan"] == [[1, 1], [3, 3]][r] and host["exscan"] == [None, [1, 1]][r]
        assert host["neighbours"] == [1.0 - r] * 2  # a ring of 2: both neighbours are the other rank
    assert res[1]["mrecv"] == [0.0, 1.0, 2.0, -1.0]
    assert res[1]["ssend"] == [[0.0, 1.0, 2.0, 3.0], [0, 1, 2]]
    assert res[1]["counted recv"] == [-1, 0, 1, 2, 3, -1]
    assert res[1]["recv"] == [[0.0, 1.0, 2.0], 0, 3]
    for count, tag in ((5, 6), (70_000, 7)):  # probes read the GPU message's envelope; Mprobe takes it
        assert res[1][f"probe {count}"] == [0, tag, count, tag, count, count, True, True], res[1]
