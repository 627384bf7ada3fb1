"""benchmarks/readme_table.py: the Markdown of docs/benchmarks.md from a benchmark target's JSON,
several invocations pooled (every run counts), ratios taken run by run, no ratio on a wrong row;
--check-printed reads the ranges from docs/benchmarks.md itself."""
import json
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import readme_table  # noqa: E402


def _doc(tmp_path, name, runs, wrong=0, collective="allreduce", nranks=2):
    rec = lambda t, w=0: dict(size=1024, time_us=t, busbw=1.0, wrong=w)  # noqa: E731
    doc = {"settings": {"command": "gpucoll-bench ...", "peer_label": "Open MPI 5 through mpi4py 4", "date": name,
                        "machine": {"cpus": 2, "processor": "x"}, "nranks": nranks},
           "rows": [{"size": 1024, "collective": collective}],
           "runs": [{"gpucoll": [rec(ours, wrong)], "peer": [rec(theirs)]} for ours, theirs in runs]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_invocations_are_pooled_and_ratios_taken_run_by_run(tmp_path):
    a = _doc(tmp_path, "first", [(2.0, 3.0), (2.0, 4.0), (4.0, 4.0)])
    b = _doc(tmp_path, "again", [(1.0, 3.0)])
    doc, dates = readme_table.pooled([a, b])
    assert dates == ["first", "again"] and len(doc["runs"]) == 4
    line = readme_table.collective_table(doc)[2]
    # times 1, 2, 2, 4 -> median 2 [1-4]; peer 3, 3, 4, 4 -> 3.5 [3-4]; ratios 1.5, 2, 1, 3 -> 1.75 [1-3]
    assert line == "| 1 KiB | 2 [1-4] | 1.00 | 3.5 [3-4] | 1.75 [1.00-3.00] |"


def test_the_matrix_pools_invocations_per_collective_and_rank_count(tmp_path):
    paths = [_doc(tmp_path, "ar8a", [(2.0, 3.0)], nranks=8), _doc(tmp_path, "ar8b", [(1.0, 3.0)], nranks=8),
             _doc(tmp_path, "bc8", [(2.0, 5.0)], collective="bcast", nranks=8),
             _doc(tmp_path, "ar16", [(2.0, 1.0)], nranks=16)]
    text = "\n".join(readme_table.matrix_tables(paths))
    assert "**8 ranks**" in text and "**16 ranks**" in text
    assert "| 1 KiB | 2.25 [1.50-3.00] | 2.50 [2.50-2.50] |" in text  # all-reduce's two invocations pooled
    assert "| 1 KiB | 0.50 [0.50-0.50] |" in text


def _vector_doc(tmp_path, name, np, ratios):
    """A bench_vector.py document: its runs kept in the rows, one row per test and size."""
    rows = [{"test": test, "size": 1024, "gpucoll": [1e-6] * len(r), "peer": [x * 1e-6 for x in r], "ratio": r,
             "gpucoll_wrong": 0, "peer_wrong": 0} for test, r in ratios.items()]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"settings": {"np": np, "date": name}, "rows": rows}))
    return str(path)


def test_the_matrix_takes_the_vector_forms_a_column_per_test(tmp_path):
    paths = [_vector_doc(tmp_path, "v8a", 8, {"allgatherv": [2.0, 3.0], "gatherv": [0.5]}),
             _vector_doc(tmp_path, "v8b", 8, {"allgatherv": [4.0], "gatherv": [1.5]})]
    lines = readme_table.matrix_tables(paths)
    assert "| size | allgatherv | gatherv |" in lines
    assert "| 1 KiB | 3.00 [2.00-4.00] | 1.00 [0.50-1.50] |" in lines  # both invocations pooled per test


def test_a_wrong_row_gets_no_ratio(tmp_path):
    doc, _ = readme_table.pooled([_doc(tmp_path, "bad", [(2.0, 3.0)], wrong=5)])
    assert readme_table.collective_table(doc)[2].endswith("| - (wrong) |")


def test_check_names_the_rows_a_new_invocation_does_not_reproduce(tmp_path, capsys):
    old = [_doc(tmp_path, "first", [(2.0, 3.0), (2.0, 4.0)]), _doc(tmp_path, "again", [(2.0, 2.6)])]
    inside = _doc(tmp_path, "inside", [(2.0, 3.0), (2.0, 3.2), (2.0, 9.0)])  # median ratio 1.6 in [1.3-2]
    outside = _doc(tmp_path, "outside", [(2.0, 5.0), (2.0, 4.8)])            # median 2.45 above 2
    assert readme_table.check(inside, old) == []
    assert readme_table.check(outside, old) == ["1 KiB"]
    assert "OUTSIDE" in capsys.readouterr().out
    assert readme_table.check(_doc(tmp_path, "wrong", [(2.0, 3.0)], wrong=1), old) == ["1 KiB"]


def _launch(tmp_path, name, gpurun, mpiexec):
    """A bench_launch.py document: gpurun's and mpiexec's seconds round by round, and their ratios."""
    ratios = [m / g for m, g in zip(mpiexec, gpurun)]
    doc = {"settings": {"command": "benchmarks/bench_launch.py --reps 3", "date": name},
           "rows": [{"launcher": "gpurun", "ranks": 4, "runs": gpurun, "vs_gpurun_runs": [1.0] * len(gpurun)},
                    {"launcher": "mpiexec", "ranks": 4, "runs": mpiexec, "vs_gpurun_runs": ratios}]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_launch_tables_pool_by_launcher_and_check_round_by_round_ratios(tmp_path, capsys):
    a = _launch(tmp_path, "first", [1.0, 1.2, 1.1], [2.0, 3.0, 2.2])    # ratios 2.0, 2.5, 2.0
    b = _launch(tmp_path, "again", [0.9], [2.7])                         # ratio 3.0
    doc, dates = readme_table.pooled([a, b])
    assert dates == ["first", "again"]
    # gpurun 0.9, 1.0, 1.1, 1.2 -> 1.05; mpiexec 2.0, 2.2, 2.7, 3.0 -> 2.45; ratios 2, 2, 2.5, 3 -> 2.25
    assert readme_table.launch_table(doc)[2:] == ["| gpurun | 4 | 1.050 [0.900-1.200] | 1 |",
                                                  "| mpiexec | 4 | 2.450 [2.000-3.000] | 2.25 [2.00-3.00] |"]
    # a machine twice as slow for both launchers reproduces the table; a peer relatively faster does not
    assert readme_table.check(_launch(tmp_path, "slower", [2.0, 2.2, 2.4], [4.4, 5.0, 5.5]), [a, b]) == []
    assert readme_table.check(_launch(tmp_path, "closer", [1.0, 1.1, 1.2], [1.5, 1.9, 2.3]), [a, b]) == ["mpiexec 4"]
    assert "OUTSIDE" in capsys.readouterr().out


def test_check_printed_reads_the_ranges_from_the_printed_tables(tmp_path, capsys):
    old = [_doc(tmp_path, "first", [(2.0, 3.0), (2.0, 4.0)]), _doc(tmp_path, "again", [(2.0, 2.6)])]
    launch = [_launch(tmp_path, "launch", [1.0, 1.2, 1.1], [2.0, 3.0, 2.2])]
    text = "\n".join(["# Benchmarks", "**2 ranks vs Open MPI**", "", *readme_table.collective_table(
        readme_table.pooled(old)[0]), "", "### Start-to-exit", "", *readme_table.launch_table(
        readme_table.pooled(launch)[0]), ""])
    # the printed ratio ranges: 1.30-2.00 (collective), 2.00-2.50 (mpiexec; gpurun's row is 1)
    inside = _doc(tmp_path, "inside", [(2.0, 3.0), (2.0, 3.2), (2.0, 9.0)])
    outside = _doc(tmp_path, "outside", [(2.0, 5.0), (2.0, 4.8)])
    assert readme_table.check_printed(inside, text, "**2 ranks vs Open MPI**") == []
    assert readme_table.check_printed(outside, text, "**2 ranks vs Open MPI**") == ["1 KiB"]
    assert readme_table.check_printed(_launch(tmp_path, "same", [2.0], [4.4]), text, "### Start-to-exit") == []
    assert readme_table.check_printed(_launch(tmp_path, "closer", [2.0], [3.0]), text,
                                      "### Start-to-exit") == ["mpiexec 4"]
    assert "OUTSIDE" in capsys.readouterr().out


# The labels that --check-printed is given (docs/benchmarks.md names them), and how many ratio
# ranges each table prints: the collective tables' 79 rows, 30 per point-to-point table (one-way,
# window, both ways at 10 sizes), the launch table's 10 peer rows (2-core: 4 peers at 4 and 32 ranks, 2 at 256).
PRINTED = [("**2 ranks vs Open MPI**", 17), ("**4 ranks vs Open MPI**", 17), ("**2 ranks vs gloo**", 12),
           ("**4 ranks vs gloo**", 12), ("**all-gather**", 7), ("**bcast**", 7), ("**reduce**", 7),
           ("### Host point to point", 30), ("### The same through gpucoll.MPI", 30),
           ("### Point to point between two hosts", 30), ("### Start-to-exit", 10)]


@pytest.mark.parametrize("label, rows", PRINTED, ids=[label for label, _ in PRINTED])
def test_the_measured_tables_are_found_in_docs_benchmarks(label, rows):
    with open(os.path.join(ROOT, "docs", "benchmarks.md")) as f:
        ranges = readme_table.printed_ranges(f.read(), label)
    assert len(ranges) == rows, ranges
    assert all(0 < lo <= hi for lo, hi in ranges.values()), ranges
