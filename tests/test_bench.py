"""gpucoll-bench: a real run through gpurun, the JSON it writes, the peers, and the pieces
(sizes, nccl-tests' bus-bandwidth factors, the row format) checked with exact numbers."""
import importlib.util
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gpucoll.bench import cli, sizes, table

BENCH = [sys.executable, "-m", "gpucoll.bench"]


def run_bench(*args, timeout=60):
    return subprocess.run(BENCH + list(args), capture_output=True, text=True, timeout=timeout)


def table_rows(stdout):
    """The numeric rows of the printed table, split into columns."""
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def test_quick_run_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-b", "8", "-e", "1K", "-f", "4", "-n", "2", "-w", "1", "-c", "1",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" in proc.stdout
    rows = table_rows(proc.stdout)
    assert [int(r[0]) for r in rows] == [8, 32, 128, 512]
    assert [int(r[1]) for r in rows] == [2, 8, 32, 128]
    assert all(r[2:5] == ["float", "sum", "-1"] for r in rows)
    assert all(r[-1] == "0" for r in rows)  # #wrong
    assert "# Out of bounds values : 0 OK" in proc.stdout
    records = json.loads(out.read_text())
    assert [r["size"] for r in records] == [8, 32, 128, 512]
    for r in records:
        assert r["collective"] == "allreduce" and r["nranks"] == 2 and r["wrong"] == 0
        assert r["time_us"] > 0 and r["busbw"] == pytest.approx(r["algbw"] * 1.0)  # 2(n-1)/n = 1 for n = 2
        assert r["peer"] is None and r["ratio"] is None


def test_every_collective_checks_out_on_three_ranks():
    proc = run_bench("-np", "3", "-o", "all", "-b", "4", "-e", "4K", "-f", "32", "-n", "1", "-w", "0", "-r", "1",
                     "-d", "int32")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert len(rows) == 5 * 3 and all(r[-1] == "0" for r in rows)
    # Blocked collectives round the count down to a multiple of the ranks (never below one each).
    assert [int(r[1]) for r in rows[3:6]] == [3, 30, 1023]
    assert [r[4] for r in rows[9:12]] == ["1", "1", "1"]  # bcast shows its root


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs mpi4py")
def test_vs_mpi_adds_the_peer_columns(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "1", "--vs", "mpi",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# Peer: Open MPI" in proc.stdout and "ratio" in proc.stdout
    records = json.loads(out.read_text())
    assert [r["size"] for r in records] == [8, 64]
    for r in records:
        assert r["peer"] == "mpi" and r["peer_wrong"] == 0 and r["peer_time_us"] > 0
        assert r["ratio"] == pytest.approx(r["peer_time_us"] / r["time_us"])


def test_gpu_only_options_say_they_need_a_gpu():
    runner = CliRunner()
    for args in (["-G", "1"], ["--vs", "nccl"], ["--vs", "torch"]):
        result = runner.invoke(cli.main, ["-np", "2"] + args)
        assert result.exit_code == 2 and "needs a GPU" in result.output, result.output


def test_bad_sizes_are_refused():
    runner = CliRunner()
    result = runner.invoke(cli.main, ["-b", "1X"])
    assert result.exit_code == 2 and "is not a size" in result.output
    result = runner.invoke(cli.main, ["-b", "1M", "-e", "1K"])
    assert result.exit_code == 2 and "larger than the maximum" in result.output


def test_sizes_and_sweep():
    assert [sizes.parse_size(s) for s in ("8", "1K", "4KiB", "64M", "1G", "1.5K")] == \
        [8, 1024, 4096, 64 << 20, 1 << 30, 1536]
    assert sizes.sweep(8, 1024, 4) == [8, 32, 128, 512]
    assert sizes.sweep(32 << 20, 32 << 20, 2) == [32 << 20]
    assert sizes.sweep(8, 64, 1) == [8]
    assert sizes.element_count(8, 4, 1) == 2
    assert sizes.element_count(8, 4, 4) == 4  # at least one element per rank
    assert sizes.element_count(1024, 4, 3) == 255


def test_bus_factors_are_nccl_tests():
    assert table.bus_factor("allreduce", 4) == 1.5
    assert table.bus_factor("allgather", 4) == 0.75
    assert table.bus_factor("reduce_scatter", 8) == 0.875
    assert table.bus_factor("alltoall", 2) == 0.5
    assert table.bus_factor("bcast", 8) == 1.0


def test_row_format_matches_nccl_tests():
    r = dict(size=1048576, count=262144, type="float32", redop="sum", root=-1, time_us=123.456,
             algbw=8.49, busbw=12.74, wrong=0)
    assert table.row(r) == "     1048576        262144     float     sum      -1    123.5    8.49   12.74      0"
    assert table.row(dict(r, time_us=12345.6)) .split()[5] == "12346"
    assert table.row(dict(r, time_us=9.876)).split()[5] == "9.88"
    assert table.row(dict(r, wrong=-1)).endswith("N/A")


def test_gpu_flag_without_a_gpu_says_so():
    result = CliRunner().invoke(cli.main, ["-np", "2", "--gpu"])
    assert result.exit_code == 2 and "needs a GPU" in result.output, result.output
