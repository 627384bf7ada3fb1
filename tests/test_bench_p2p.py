"""benchmarks/bench_p2p.py, the point-to-point table's command, run small: gpucoll's side through
its own API and through gpucoll.MPI, Open MPI (mpi4py) beside it, every row checked."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import requires

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
needs_mpi = requires("mpi4py", None if HAVE_MPI else "needs mpi4py and Open MPI (pip install '.[test]')")
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_p2p.py")


@needs_mpi
@pytest.mark.parametrize("api,spec", [("native", "array"), ("mpi", "array"), ("mpi", "alloc")])
def test_every_row_is_checked_and_compared_through_either_api(tmp_path, api, spec):
    out = tmp_path / "p2p.json"
    proc = subprocess.run([sys.executable, BENCH, "--api", api, "--spec", spec, "--min", "8", "--max", "4K",
                           "--iters", "40", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert (doc["settings"]["api"], doc["settings"]["spec"]) == (api, spec)
    assert ("[MPI.Alloc_mem(n), n, MPI.BYTE]" in proc.stdout) == (spec == "alloc"), proc.stdout
    rows = doc["rows"]
    assert sorted((r["test"], r["size"]) for r in rows) == sorted(
        (test, size) for test in ("latency", "bw", "bibw", "barrier", "step") for size in (8, 64, 512, 4096))
    # both libraries ran every row, nothing came back wrong, so every row has its ratio
    assert all(r["gpucoll_wrong"] == 0 and r["peer_wrong"] == 0 and r["ratio"] for r in rows), rows
    assert ("through gpucoll.MPI" in proc.stdout) == (api == "mpi"), proc.stdout
