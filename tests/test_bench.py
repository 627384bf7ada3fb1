"""gpucoll-bench: a real run through gpurun, the JSON it writes, the peers, the check that
must count a wrong result (gpucoll's and the peer's), repeats folded into medians and ranges,
and the pieces (sizes, nccl-tests' bus-bandwidth factors, the row format) checked with exact
numbers."""
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import requires
from gpucoll.bench import cli, runner, sizes, summary, table

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
needs_mpi = requires("mpi4py", None if HAVE_MPI else "needs mpi4py and Open MPI (pip install '.[test]')")

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
    saved = json.loads(out.read_text())
    rows = saved["rows"]
    assert [r["size"] for r in rows] == [8, 32, 128, 512]
    for r in rows:
        assert r["collective"] == "allreduce" and r["nranks"] == 2 and r["wrong"] == 0 and r["runs"] == 1
        assert r["time_us"] > 0 and r["busbw"] == pytest.approx(r["algbw"] * 1.0)  # 2(n-1)/n = 1 for n = 2
        assert r["time_min_us"] == r["time_us"] == r["time_max_us"] and r["peer"] is None
    assert [r["size"] for r in saved["runs"][0]["gpucoll"]] == [8, 32, 128, 512]
    settings = saved["settings"]
    assert settings["command"].startswith("gpucoll-bench -np 2 -b 8 -e 1K") and settings["nranks"] == 2
    assert settings["opts"]["iters"] == 2 and settings["opts"]["repeats"] == 1 and settings["opts"]["gpu"] is False
    assert settings["versions"]["gpucoll"] and settings["versions"]["numpy"] == np.__version__
    assert settings["machine"]["cpus"] >= 1 and "GPUCOLL_STORE_SECRET" not in settings["environment"]


def test_every_collective_checks_out_on_three_ranks():
    proc = run_bench("-np", "3", "-o", "all", "-b", "4", "-e", "4K", "-f", "32", "-n", "1", "-w", "0", "-r", "1",
                     "-d", "int32")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert len(rows) == 6 * 3 and all(r[-1] == "0" for r in rows)
    # Blocked collectives round the count down to a multiple of the ranks (never below one each).
    assert [int(r[1]) for r in rows[3:6]] == [3, 30, 1023]
    assert [r[4] for r in rows[9:12]] == ["1", "1", "1"]  # bcast shows its root
    assert [r[3] for r in rows[15:18]] == ["sum"] * 3 and [r[4] for r in rows[15:18]] == ["1"] * 3  # reduce


@needs_mpi
def test_vs_mpi_repeated_gives_medians_ranges_and_ratios_run_by_run(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "1", "--vs", "mpi",
                     "--repeats", "3", "--json", str(out), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# Peer: Open MPI" in proc.stdout and "(library: Open MPI v" in proc.stdout
    assert "the median of 3 runs" in proc.stdout and "range" in proc.stdout
    assert "# Out of bounds values (mpi) : 0 OK" in proc.stdout
    saved = json.loads(out.read_text())
    assert len(saved["runs"]) == 3 and saved["settings"]["peer_library"].startswith("Open MPI v")
    for i, r in enumerate(saved["rows"]):
        assert r["peer"] == "mpi" and r["wrong"] == 0 and r["peer_wrong"] == 0 and r["runs"] == 3
        ours = sorted(run["gpucoll"][i]["time_us"] for run in saved["runs"])
        theirs = sorted(run["peer"][i]["time_us"] for run in saved["runs"])
        ratios = sorted(run["peer"][i]["time_us"] / run["gpucoll"][i]["time_us"] for run in saved["runs"])
        assert (r["time_min_us"], r["time_us"], r["time_max_us"]) == pytest.approx(tuple(ours))
        assert (r["peer_time_min_us"], r["peer_time_us"], r["peer_time_max_us"]) == pytest.approx(tuple(theirs))
        assert (r["ratio_min"], r["ratio"], r["ratio_max"]) == pytest.approx(tuple(ratios))
    rows = table_rows(proc.stdout)
    assert [len(r) for r in rows] == [16, 16]  # 5 keys, time range algbw busbw #wrong, time range busbw #wrong ratio range


@needs_mpi
def test_a_wrong_result_is_counted_for_both_libraries_and_fails_the_run(tmp_path):
    # --test-call-op: the calls take the maximum where the check expects the sum, so every
    # element of every rank is wrong (the maximum of inputs >= 1 is below their sum).
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-b", "8", "-e", "512", "-f", "8", "-n", "3", "-w", "1", "--vs", "mpi",
                     "--test-call-op", "max", "--json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = table_rows(proc.stdout)
    assert [int(r[0]) for r in rows] == [8, 64, 512]
    for r in rows:
        count = int(r[1])
        assert int(r[8]) == 2 * count and int(r[11]) == 2 * count  # gpucoll's #wrong, the peer's
        assert r[12] == "-"  # no ratio on a wrong row
    assert "# Out of bounds values : 292 FAILED" in proc.stdout  # 2 ranks x (2 + 16 + 128) elements
    assert "# Out of bounds values (mpi) : 292 FAILED" in proc.stdout
    assert "Median ratio (peer time / gpucoll time) : none" in proc.stdout
    assert all(r["ratio"] is None and r["wrong"] > 0 and r["peer_wrong"] > 0 for r in json.loads(out.read_text())["rows"])


def test_a_wrong_result_fails_gpucoll_alone_and_inside_a_job():
    proc = run_bench("-np", "2", "-b", "64", "-e", "64", "-n", "2", "-w", "0", "--test-call-op", "min")
    assert proc.returncode == 1 and table_rows(proc.stdout)[0][-1] == "32", proc.stdout + proc.stderr
    assert "# Out of bounds values : 32 FAILED" in proc.stdout
    job = subprocess.run([sys.executable, "-m", "gpucoll.launcher", "-np", "2", *BENCH, "-b", "64", "-e", "64",
                          "-n", "2", "-w", "0", "--test-call-op", "min"], capture_output=True, text=True, timeout=60)
    assert job.returncode == 1 and "# Out of bounds values : 32 FAILED" in job.stdout, job.stdout + job.stderr


def test_the_check_reads_the_timed_calls_output():
    # The runner makes exactly warm-up + timed calls: no extra call after the loop produces
    # what the check reads. One rank (a singleton job), real gpucoll calls, counted.
    code = """if True:
        from gpucoll.bench import runner
        backend = runner.GpucollBackend()
        calls = []
        prepare = backend.prepare
        def counted(*args):
            call = prepare(*args)
            def wrapper():
                calls.append(1)
                call()
            return wrapper
        backend.prepare = counted
        plan = runner.Plan(["allreduce", "bcast"], [64], "int32", "sum", 0, iters=7, warmup=2, check=True)
        records = runner.measure(backend, plan)
        print(len(calls), [r["wrong"] for r in records])
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["18", "[0,", "0]"], proc.stdout + proc.stderr


def test_an_in_place_all_reduce_is_checked_after_every_timed_call():
    once = runner.reduced(2, 0, 11, "float32", "sum")
    assert once.tolist() == [9, 15, 10, 16, 11, 6, 12, 18, 13, 8, 14]
    assert runner.reduced_again(once, 2, "sum", 3).tolist() == [v * 8 for v in once.tolist()]
    assert runner.reduced_again(once, 3, "max", 100).tolist() == once.tolist()
    assert runner.reduced_again(np.array([3, 250], np.uint8), 3, "sum", 2).tolist() == [27, 202]  # wraps as uint8
    assert runner.reduced_again(np.array([1e30], np.float32), 2, "sum", 500).tolist() == [np.inf]
    case = runner.Case("allreduce", 22, "int64", "sum", 0, rank=1, nranks=4)
    case.recv[:] = case.expected() * 4 ** 4  # what five in-place sums over 4 ranks leave
    assert case.wrong(calls=5) == 0 and case.wrong(calls=4) == 22 and case.wrong() == 22


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


def test_summary_takes_medians_and_leaves_no_ratio_on_a_wrong_row():
    def rec(size, t, wrong=0):
        return dict(collective="allreduce", nranks=2, size=size, count=size // 4, type="float32", redop="sum",
                    root=-1, time_us=t, algbw=0.0, busbw=0.0, wrong=wrong)

    runs = [{"gpucoll": [rec(8, t), rec(64, 2 * t)], "peer": [rec(8, 3 * t), rec(64, 3 * t, wrong=w)]}
            for t, w in ((1.0, 0), (2.0, 5), (4.0, 0))]
    good, bad = summary.summarize(runs, "mpi")
    assert (good["time_min_us"], good["time_us"], good["time_max_us"]) == (1.0, 2.0, 4.0)
    assert (good["ratio_min"], good["ratio"], good["ratio_max"]) == (3.0, 3.0, 3.0)
    assert good["algbw"] == pytest.approx(8 / 2e-6 / 1e9) and good["wrong"] == 0
    assert bad["peer_wrong"] == 5 and bad["ratio"] is None and bad["time_us"] == 4.0
    assert summary.status(runs) == 1 and summary.status(runs[:1]) == 0
    text = table.row(bad, ranged=True)
    assert text.split()[-1] == "-" and "2.00-8.00" in text
    assert table.row(good, ranged=True).split()[-2:] == ["3.00", "3.00-3.00"]


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


@requires("torch", None if importlib.util.find_spec("torch") else "needs torch (pip install torch)")
def test_vs_gloo_runs_beside_and_is_checked(tmp_path):
    out = tmp_path / "rows.json"
    proc = run_bench("-np", "2", "-b", "8", "-e", "1K", "-f", "32", "-n", "3", "-w", "1", "--vs", "gloo",
                     "--json", str(out), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# Peer: torch" in proc.stdout and "gloo" in proc.stdout, proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["size"] for r in rows] == [8, 256] and all(
        r["peer"] == "gloo" and r["wrong"] == 0 and r["peer_wrong"] == 0 and r["ratio"] for r in rows), rows
