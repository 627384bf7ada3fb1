"""Jobs under a real Slurm: the single-node cluster that scripts/setup-test-system.sh
installs (Debian's slurm-wlm and munge) and starts by hand. Select with `pytest -m slurm`.

    srun -n 4 python script.py          bootstraps from SLURM_* (store on the step's first node)
    srun --mpi=pmix -n 4 python ...     Open MPI (mpi4py) under Slurm's PMIx
    salloc -n 4 gpurun python ...       gpurun starts one agent per node through srun
"""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import _SCRUB, unavailable

pytestmark = pytest.mark.slurm
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPURUN = os.path.join(os.path.dirname(sys.executable), "gpurun")
HELLO = ("import numpy as np, gpucoll; c = gpucoll.COMM_WORLD; x = np.arange(100, dtype=np.int64) * (c.rank + 1); "
         "c.Allreduce(gpucoll.IN_PLACE, x); ok = bool((x == np.arange(100) * c.size * (c.size + 1) // 2).all()); "
         "print('HELLO', c.rank, c.size, c.local_rank, c.seam.context.boot.method, ok, flush=True)")


def _slurm_ready():
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return "Slurm is not installed (scripts/setup-test-system.sh installs it as root)"
    state = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30)
    if state.returncode != 0 or not state.stdout.strip().startswith(("idle", "mix", "alloc")):
        return f"no Slurm node is up (sinfo: {state.stdout.strip() or state.stderr.strip()})"
    return None


@pytest.fixture(scope="module", autouse=True)
def slurm():
    why = _slurm_ready()
    if why:
        unavailable("slurm", why)


def _env():
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("SLURM_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _activated(env):
    """env with this interpreter's folder first on PATH, as an activated environment has it: the
    sbatch example runs the gpurun and python3 it finds there."""
    return dict(env, PATH=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]))


def _hellos(stdout):
    return sorted((int(r[0]), int(r[1]), r[3], r[4]) for r in
                  (line.split("HELLO", 1)[1].split() for line in stdout.splitlines() if "HELLO" in line))


def test_srun_four_ranks_bootstrap_from_slurm():
    proc = subprocess.run(["srun", "-n", "4", "--time=2", sys.executable, "-c", HELLO], capture_output=True,
                          text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert _hellos(proc.stdout) == [(r, 4, "slurm", "True") for r in range(4)], proc.stdout


def test_srun_mpi_pmix_with_open_mpi():
    listed = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True)
    if "pmix" not in listed.stdout + listed.stderr:
        unavailable("pmix", "this Slurm has no pmix plugin (apt-get install slurm-wlm with pmix)")
    proc = subprocess.run(["srun", "--mpi=pmix", "-n", "4", "--time=2", sys.executable, "-c", HELLO],
                          capture_output=True, text=True, timeout=120, env=_env())
    if "can not load PMIx library" in proc.stderr:
        unavailable("pmix", "Slurm's pmix plugin cannot load libpmix (apt-get install libpmix-dev)")
    assert proc.returncode == 0, proc.stderr
    assert _hellos(proc.stdout) == [(r, 4, "mpi", "True") for r in range(4)], proc.stdout


def test_gpurun_inside_an_allocation_starts_agents_through_srun():
    proc = subprocess.run(["salloc", "-n", "4", "--time=2", GPURUN, "-x", "GPUCOLL_DEBUG", sys.executable, "-c",
                           HELLO], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert _hellos(proc.stdout) == [(r, 4, "gpurun", "True") for r in range(4)], proc.stdout


def test_sbatch_example_script(tmp_path):
    out = tmp_path / "job.out"
    proc = subprocess.run(["sbatch", "--wait", "-n", "4", f"--output={out}", "--time=2",
                           os.path.join(ROOT, "examples", "slurm", "allreduce.sbatch")],
                          capture_output=True, text=True, timeout=180, env=_activated(_env()),
                          cwd=ROOT)
    text = out.read_text() if out.exists() else ""
    assert proc.returncode == 0, proc.stderr + text
    assert _hellos(text) == [(r, 4, "gpurun", "True") for r in range(4)], text
