"""gpurun --bind-to: real ranks report os.sched_getaffinity(0), and the CPUs they got are checked
against gpurun's own mask (which the test sets, as taskset or Slurm would). The placement
rules (physical cores first, NUMA nodes) are checked on made-up sysfs trees."""
import json
import os
import subprocess
import sys

import pytest

from conftest import GPURUN
from launcher import binding

ALLOWED = sorted(os.sched_getaffinity(0))
SCRIPT = "import os, json; print('CPUS ' + json.dumps(sorted(os.sched_getaffinity(0))), flush=True)"


def run(np_, *flags, mask=None, env=None):
    """Run `gpurun -np np_ FLAGS python -c SCRIPT` inside CPU mask `mask` (default: the test's);
    returns ({rank: [cpus]}, gpurun's stderr)."""
    cmd = [*GPURUN, "-np", str(np_), "--timeout", "50", *flags, sys.executable, "-c", SCRIPT]
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("SLURM_STEP_ID", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK")}
    full_env.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=full_env, stdin=subprocess.DEVNULL,
                          preexec_fn=(lambda: os.sched_setaffinity(0, mask)) if mask else None)
    assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)
    got = {}
    for line in proc.stdout.splitlines():
        tag, _, rest = line.partition("] ")
        if rest.startswith("CPUS "):
            got[int(tag[1:])] = json.loads(rest[5:])
    assert sorted(got) == list(range(np_)), proc.stdout
    return got, proc.stderr


needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 allowed CPUs")


@needs_two
@pytest.mark.parametrize("flags", [("--bind-to", "core"), ()], ids=["core", "default"])
def test_core_gives_each_rank_its_own_cpu(flags):
    got, _ = run(2, *flags)
    cpus = [got[r] for r in range(2)]
    assert all(len(c) == 1 and c[0] in ALLOWED for c in cpus), cpus
    assert cpus[0] != cpus[1], cpus


def test_none_leaves_the_whole_mask():
    got, err = run(2, "--bind-to", "none", "--verbose")
    assert all(c == ALLOWED for c in got.values()), got
    assert "gpurun: ranks not bound (--bind-to none)" in err, err


@needs_two
def test_binding_stays_inside_gpurun_mask():
    last = ALLOWED[-1]
    got, _ = run(1, "--bind-to", "core", mask={last})
    assert got == {0: [last]}
    got, _ = run(1, "--bind-to", "numa", mask={last})
    assert got == {0: [last]}


def test_more_ranks_than_the_mask_holds_fall_back_to_none_with_a_note():
    cpu = ALLOWED[0]
    got, err = run(2, "--verbose", mask={cpu})
    assert got == {0: [cpu], 1: [cpu]}, got
    assert f"gpurun: not binding ranks: 2 ranks on this host, 1 CPU(s) allowed ({cpu})" in err, err
    _, quiet = run(2, mask={cpu})
    assert "binding" not in quiet, quiet   # the note is for --verbose only


@needs_two
def test_no_rebinding_under_srun_or_mpirun():
    for var, who in (("SLURM_STEP_ID", "srun"), ("OMPI_COMM_WORLD_SIZE", "mpirun")):
        got, err = run(2, "--verbose", env={var: "0" if var == "SLURM_STEP_ID" else "2"})
        assert all(c == ALLOWED for c in got.values()), (var, got)
        assert f"not binding ranks: {who} started gpurun" in err, err


def test_each_host_agent_binds_its_own_ranks():
    # two agents on this machine (--launcher local), one rank each: each binds its local rank 0
    hosts = ("--hosts", "localhost:1,127.0.0.1:1", "--launcher", "local", "--verbose")
    got, err = run(2, *hosts, "--bind-to", "core")
    assert all(len(c) == 1 for c in got.values()), got
    for node in (0, 1):
        assert f"gpurun agent (node {node}, " in err and "local rank -> CPUs: 0 -> " in err, err
    got, err = run(2, *hosts, "--bind-to", "none")
    assert all(c == ALLOWED for c in got.values()), got
    got, err = run(2, *hosts)  # by default agents sharing this machine do not bind (both would take core 0)
    assert all(c == ALLOWED for c in got.values()), got


def test_verbose_says_which_cpu_each_rank_got():
    got, err = run(1, "--bind-to", "core", "--verbose")
    assert f"gpurun: local rank -> CPUs: 0 -> {got[0][0]}" in err, err


# --- placement on made-up topologies ---------------------------------------------------------

def fake_cpus(tmp_path, cores):
    """A sysfs cpu tree: cores[cpu] = (package, core id)."""
    for cpu, (package, core) in enumerate(cores):
        top = tmp_path / "cpu" / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        (top / "physical_package_id").write_text(f"{package}\n")
        (top / "core_id").write_text(f"{core}\n")
    return str(tmp_path / "cpu")


def test_core_order_takes_physical_cores_first(tmp_path):
    # 2 packages x 2 cores x 2 threads; Linux numbers the second threads after all the first ones
    interleaved = fake_cpus(tmp_path / "a", [(0, 0), (0, 1), (1, 0), (1, 1)] * 2)
    assert binding.core_order(range(8), interleaved) == [0, 1, 2, 3, 4, 5, 6, 7]
    # the siblings side by side (0 and 1 share a core): every core's first thread comes first
    paired = fake_cpus(tmp_path / "b", [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0), (1, 0)])
    assert binding.core_order(range(6), paired) == [0, 2, 4, 1, 3, 5]
    # only what the mask allows: core 0 keeps one thread, so it still comes first
    assert binding.core_order({1, 2, 3}, paired) == [1, 2, 3]
    cpus, note = binding.plan("core", 3, allowed=range(6), environ={}, cpu_sysfs=paired)
    assert cpus == [{0}, {2}, {4}] and note is None


def test_numa_deals_ranks_over_nodes_within_the_mask(tmp_path):
    for node, text in ((0, "0-3\n"), (1, "4-7\n"), (2, "\n")):   # node 2: memory only
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(text)
    nodes = str(tmp_path)
    assert binding.numa_nodes(range(8), nodes) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    cpus, _ = binding.plan("numa", 3, allowed={1, 2, 5}, environ={}, node_sysfs=nodes)
    assert cpus == [{1, 2}, {5}, {1, 2}]
    assert binding.numa_nodes({1}, str(tmp_path / "missing")) == [{1}]


def test_share_gives_each_rank_whole_cores_of_its_own(tmp_path):
    # 2 packages x 2 cores x 2 threads, second threads numbered after the first ones
    cpus8 = fake_cpus(tmp_path / "a", [(0, 0), (0, 1), (1, 0), (1, 1)] * 2)
    assert binding.shares(range(8), 2, cpus8) == [{0, 1, 4, 5}, {2, 3, 6, 7}]
    assert binding.shares(range(8), 3, cpus8) == [{0, 4}, {1, 5}, {2, 6}]  # the fourth core unused
    assert binding.shares(range(8), 5, cpus8) is None
    # five ranks on four cores: a hardware thread each, cores first
    cpus, note = binding.plan("share", 5, allowed=range(8), environ={}, cpu_sysfs=cpus8)
    assert cpus == [{0}, {1}, {2}, {3}, {4}] and note is None
    # the default shares, within gpurun's mask: a core's threads stay together
    assert binding.plan(None, 2, allowed={0, 4, 1, 5}, environ={}, cpu_sysfs=cpus8)[0] == [{0, 4}, {1, 5}]


def test_default_plan():
    cores = binding.physical_cores({0, 1, 2})
    assert binding.plan(None, 2, allowed={0, 1, 2}, environ={})[0] == binding.shares({0, 1, 2}, 2)
    assert len(cores) < 2 or all(len(c) >= 1 for c in binding.shares({0, 1, 2}, 2))
    cpus, note = binding.plan(None, 4, allowed={0, 1, 2}, environ={})
    assert cpus == [None] * 4 and "4 ranks on this host, 3 CPU(s) allowed (0-2)" in note
    cpus, note = binding.plan(None, 1, allowed={0, 1}, environ={"PMIX_RANK": "0"})
    assert cpus == [None] and "mpirun" in note
    assert binding.parse_cpulist("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert binding.cpulist({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
