"""gpucoll-bench on GPU buffers (`make test-gpu`): eager and CUDA-graph rows checked, a wrong
result counted for gpucoll and for NCCL, and the peers NCCL and torch where two GPUs exist."""
import importlib.util
import json

import pytest

from test_bench import run_bench, table_rows
from test_gpu_collectives import NGPUS, job_env, needs_gpu

pytestmark = [pytest.mark.gpu, needs_gpu]
needs_two_gpus = pytest.mark.skipif(NGPUS < 2, reason="NCCL runs one rank per GPU: needs 2 GPUs")


@pytest.fixture(autouse=True)
def _gpu_env(monkeypatch):
    # multicast off; on one GPU the two ranks share it and still run the IPC kernels, which a
    # CUDA graph can capture (the path through host memory cannot be captured)
    for k, v in job_env(2).items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("mode", [[], ["-G", "10"], ["--group", "10"]])
def test_gpu_rows_are_checked_eager_in_a_graph_and_in_groups(tmp_path, mode):
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-g", "-b", "8", "-e", "64K", "-f", "32", "-n", "20", "-w", "2", "-c", "1",
                     *mode, "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    graphs, group = (int(mode[1]) if mode and mode[0] == flag else 0 for flag in ("-G", "--group"))
    assert f"graph: {graphs}" in proc.stdout, proc.stdout
    assert ("groups of 10 calls" in proc.stdout) == bool(group), proc.stdout
    saved = json.loads(out.read_text())
    opts = saved["settings"]["opts"]
    assert opts["gpu"] is True and opts["graphs"] == graphs and opts["group"] == group
    rows = saved["rows"]
    assert [r["size"] for r in rows] == [8, 256, 8192] and all(r["wrong"] == 0 for r in rows), rows


def test_a_wrong_gpu_result_is_counted_and_fails_the_run(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-g", "-b", "1K", "-e", "1K", "-n", "3", "-w", "1", "--test-call-op", "max",
                     "--json", str(out), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert all(r["wrong"] == 256 * 2 for r in json.loads(out.read_text())["rows"]), out.read_text()


@needs_two_gpus
@pytest.mark.parametrize("peer, mode", [("nccl", []), ("torch", []), ("nccl", ["--group", "10"])])
def test_gpu_peers_run_beside_and_are_checked(tmp_path, peer, mode):
    if peer == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-g", "-b", "8", "-e", "64K", "-f", "32", "-n", "20", "-w", "2", "--vs", peer,
                     *mode, "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert all(r["peer"] == peer and r["wrong"] == 0 and r["peer_wrong"] == 0 and r["ratio"] for r in rows), rows
    assert "NCCL_NVLS_ENABLE=0" in proc.stdout
    assert len(table_rows(proc.stdout)) == 3
