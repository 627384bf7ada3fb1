"""gpucoll.MPI with GPU arrays (2 ranks; `make test-gpu`): tests/scripts/mpi_gpu.py."""
import pytest

from test_gpu_collectives import NGPUS, job_env

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(NGPUS < 1, reason="needs a CUDA GPU and CuPy")
def test_mpi_module_with_gpu_arrays(gpurun_job):
    res = gpurun_job(2, "mpi_gpu.py", env=job_env(2), timeout=120).check().json_lines()
    for r, got in res.items():
        assert got["collectives"] == [[3.0] * 5, [2.0] * 5, [0, 1, 2, 3]]
        assert "LAND on GPU buffers" in got["refused"]["land"]
        assert "on GPU buffers" in got["refused"]["allgatherv"]
        assert got["host_interface"] == [3.0] * 3  # host memory behind __cuda_array_interface__
    assert res[1]["recv"] == [[0.0, 1.0, 2.0], 0, 3]
    for count, tag in ((5, 6), (70_000, 7)):  # Probe/Iprobe read the GPU message's envelope
        assert res[1][f"probe {count}"] == [0, tag, count, tag, count, True, True], res[1]
