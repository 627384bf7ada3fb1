"""GPUCOLL_TEST_REQUIRE: a test that skips because a piece of the machine is missing fails
instead when the variable names that piece; an unknown name stops the run. A small test
file runs under pytest with tests/conftest.py as its plugin, as the real suite does."""
import os
import subprocess
import sys
from xml.etree import ElementTree

from conftest import REQUIRE_VAR

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = '''
from conftest import requires, unavailable


def test_slurm_missing():
    unavailable("slurm", "no Slurm node is up")


@requires("mpich", "no .venv-mpich")
def test_mpich_missing():
    pass


@requires("gpu", None)
def test_gpu_present():
    pass


@requires("gpu", None, broken="CuPy does not import")
def test_gpu_broken():
    pass
'''


def outcomes(tmp_path, require):
    """The sample run's process and {test name without test_: passed, skipped, failure or error}."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_VAR}
    env["PYTHONPATH"] = HERE
    if require is not None:
        env[REQUIRE_VAR] = require
    report = tmp_path / "report.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-rA", "-p", "no:cacheprovider",
                           f"--junitxml={report}", str(tmp_path / "test_sample.py")], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    found = {}
    if report.exists():
        for case in ElementTree.parse(report).iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
            found[case.get("name")[len("test_"):]] = kinds[0] if kinds else "passed"
    return proc, found


def test_skips_stay_skips_without_the_variable(tmp_path):
    proc, found = outcomes(tmp_path, None)
    assert found == {"slurm_missing": "skipped", "mpich_missing": "skipped", "gpu_present": "passed",
                     "gpu_broken": "error"}, proc.stdout
    assert proc.returncode == 1  # the broken piece fails whatever the variable says


def test_a_required_piece_that_is_missing_fails(tmp_path):
    proc, found = outcomes(tmp_path, "slurm, MPICH,gpu")
    assert found == {"slurm_missing": "failure", "mpich_missing": "error", "gpu_present": "passed",
                     "gpu_broken": "error"}, proc.stdout
    assert "GPUCOLL_TEST_REQUIRE requires slurm" in proc.stdout and "no Slurm node is up" in proc.stdout


def test_only_the_named_pieces_fail(tmp_path):
    proc, found = outcomes(tmp_path, "netns")  # netns is multihost: neither slurm nor mpich
    assert found["slurm_missing"] == "skipped" and found["mpich_missing"] == "skipped", proc.stdout


def test_an_unknown_piece_stops_the_run(tmp_path):
    proc, found = outcomes(tmp_path, "slurm,gpux")
    assert proc.returncode != 0 and not found
    assert "GPUCOLL_TEST_REQUIRE='slurm,gpux' is not valid" in proc.stdout + proc.stderr
