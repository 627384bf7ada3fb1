"""`make demo`'s job: the demo checks every result on every rank and says so."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_on_four_ranks_reports_every_result_correct():
    gpurun = os.path.join(os.path.dirname(sys.executable), "gpurun")
    out = subprocess.run([gpurun, "-np", "4", sys.executable, os.path.join(ROOT, "examples", "demo.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[0] gpucoll demo: 4 ranks on 1 host(s)"
    assert sum("OK on every rank" in line for line in lines) == 10, out.stdout
    assert "WRONG" not in out.stdout and lines[-1] == "[0] all results correct"
