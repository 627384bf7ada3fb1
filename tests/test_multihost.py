"""gpurun across hosts, on real separate network stacks: two network namespaces joined by
veth pairs (tests/netns.py), each with its own host name. The head gpurun runs on host a
like a user on a login node; agents start through the `local` launcher with a command
template (`scripts/netns-exec.sh {host}`), or over real ssh to an sshd in each namespace.

Select with `pytest -m multihost`. Needs root and iproute2 (scripts/setup-test-system.sh).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import GPURUN, SCRIPTS, _SCRUB, unavailable
from netns import NSEXEC, TestHosts, missing_requirement

CASES = os.path.join(SCRIPTS, "multihost_cases.py")
LOCAL = ["--launcher", "local", "--launcher-cmd", f"{NSEXEC} {{host}}"]


@pytest.fixture(scope="module")
def hosts():
    why = missing_requirement()
    if why:
        unavailable("multihost", why)
    with TestHosts(2, networks=("eth", "data")) as h:
        yield h


def _env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and k != "GPUCOLL_SOCKET_IFNAME"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def gpurun_on(hosts, host, args, env=None, timeout=90):
    """Run gpurun ARGS on test host `host` to its end; (returncode, stdout, stderr, seconds)."""
    t0 = time.monotonic()
    proc = hosts.run(host, [*GPURUN, *args], env=_env(env), timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0


def results(stdout):
    out = {}
    for line in stdout.splitlines():
        tag, _, rest = line.partition("] ")
        if rest.startswith("RESULT "):
            out[int(tag[1:])] = json.loads(rest[len("RESULT "):])
    return out


def check_exact(res, hosts, per_host, network="eth"):
    """Exact results, ranks in host order, and every rank's listeners bound to its address on
    `network` (the one that reaches the store, or GPUCOLL_SOCKET_IFNAME's), never a wildcard."""
    assert sorted(res) == list(range(2 * per_host))
    layout = [hosts.names[rank // per_host] for rank in range(2 * per_host)]
    for rank, r in res.items():
        assert r["size"] == 2 * per_host
        assert r["host"] == layout[rank], "ranks are numbered in host order"
        assert (r["local_rank"], r["local_size"]) == (rank % per_host, per_host)
        assert all(r["ok"].values()), f"rank {rank}: wrong results {r['ok']}"
        mine = hosts.address(rank // per_host, network)
        assert all(a.rpartition(":")[0] == mine for a in r["listen"]), f"rank {rank} listens on {r['listen']}"
        assert r["hosts_seen"] == layout, f"rank {rank}: object allgather of host names gave {r['hosts_seen']}"


def tcp_reasons(err):
    """The reason each rank logged for carrying traffic between hosts over TCP (subsystem NET)."""
    return re.findall(r"gpucoll INFO \[NET\] between hosts: TCP sockets \((.*)\)$", err, re.M)


# --- host lists (no namespaces needed) -----------------------------------------------------------
def test_host_lists_and_rank_assignment(tmp_path):
    from gpucoll.launcher.hosts import Host, assign, from_slurm, parse_hostfile, parse_hosts

    assert parse_hosts("h1:2,h2:2") == [Host("h1", 2), Host("h2", 2)]
    assert parse_hosts("h1,h2:3,h1") == [Host("h1", 2), Host("h2", 3)]
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\nnode2:2\n\nnode3  # one slot\n")
    assert parse_hostfile(str(f)) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]
    assert assign(parse_hosts("a:2,b:2"), 3) == [("a", [0, 1]), ("b", [2])]
    with pytest.raises(ValueError, match="more than the 4 slots"):
        assign(parse_hosts("a:2,b:2"), 5)
    with pytest.raises(ValueError, match="HOST:N"):
        parse_hosts("a:x")
    assert from_slurm({"SLURM_JOB_NODELIST": "n[01-03]"}, 7) == [Host("n01", 3), Host("n02", 2), Host("n03", 2)]


# --- real separate hosts -----------------------------------------------------------------------------
@pytest.mark.multihost
def test_two_hosts_two_ranks_each_exact_results_over_the_veth_link(hosts):
    a, b = hosts.names
    before = hosts.counters(1, "eth")
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, sys.executable, CASES,
                                             "--bytes", 8 << 20])
    assert code == 0, err
    check_exact(results(out), hosts, 2)
    rx, tx = (x - y for x, y in zip(hosts.counters(1, "eth"), before))
    assert rx > 8 << 20 and tx > 8 << 20, f"host b's eth0 moved only rx {rx} / tx {tx} bytes"


@pytest.mark.multihost
def test_one_rank_per_host(hosts):
    a, b = hosts.names
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a},{b}", *LOCAL, sys.executable, CASES])
    assert code == 0, err
    check_exact(results(out), hosts, 1)


@pytest.mark.multihost
def test_socket_ifname_chooses_the_data_network(hosts):
    """eth0 comes first, so it is the default; GPUCOLL_SOCKET_IFNAME=data puts the store, the
    agents' connections and every data socket on data0, and the bytes show up there."""
    a, b = hosts.names
    eth0, data0 = hosts.counters(1, "eth"), hosts.counters(1, "data")
    env = {"GPUCOLL_SOCKET_IFNAME": "data", "GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "NET"}
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, sys.executable, CASES,
                                             "--bytes", 16 << 20], env=env)
    assert code == 0, err
    check_exact(results(out), hosts, 2, network="data")
    listens = [line for line in err.splitlines() if "TCP endpoint" in line and "listens on" in line]
    assert len(listens) == 4 and all(" 10.78.1." in line and "(data0)" in line for line in listens), listens
    d_rx = hosts.counters(1, "data")[0] - data0[0]
    e_rx = hosts.counters(1, "eth")[0] - eth0[0]
    assert d_rx > 16 << 20, f"data0 received {d_rx} bytes"
    assert e_rx < 1 << 20, f"eth0 received {e_rx} bytes: traffic did not follow GPUCOLL_SOCKET_IFNAME"


@pytest.mark.multihost
def test_hierarchical_allreduce_is_chosen_and_logged(hosts):
    """2 hosts x 2 ranks: the cost model picks reduce inside each host (shared memory),
    allreduce among the leaders (TCP), bcast inside each host; 1 rank per host stays flat."""
    a, b = hosts.names
    env = {"GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL,NET"}
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, sys.executable, CASES], env=env)
    assert code == 0, err
    check_exact(results(out), hosts, 2)
    assert "allreduce #0 8 B int64 SUM hierarchical via SHM+TCP" in err
    # why TCP: what this machine has (the namespaces share its /sys), said once by each TCP rank
    from gpucoll.transports import verbs

    found = verbs.devices()
    why = (f"no RDMA device ({verbs.SYSFS} is empty or absent)" if not found else
           f"RDMA device(s) {', '.join(d.describe() for d in found)} found, but this build has no verbs transport")
    assert set(tcp_reasons(err)) == {why}, tcp_reasons(err)
    leaders = [line for line in err.splitlines() if "allreduce #0 8 B" in line and " via TCP" in line]
    assert leaders and {line[1] for line in leaders} == {"0", "2"}, "only the leaders talk across hosts"
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a},{b}", *LOCAL, sys.executable, CASES],
                                  env={**env, "GPUCOLL_IB_DISABLE": "1"})
    assert code == 0 and "hierarchical" not in err
    assert tcp_reasons(err) == ["GPUCOLL_IB_DISABLE=1"] * 2, err


@pytest.mark.multihost
def test_ofi_carries_the_traffic_between_hosts_on_the_chosen_network(hosts):
    """GPUCOLL_NET=ofi: libfabric's tcp provider opens its domain on the interface of
    GPUCOLL_SOCKET_IFNAME, the leaders' all-reduce rides OFI, the bytes cross the data network."""
    from conftest import ofi_missing

    why = ofi_missing()
    if why:
        unavailable("ofi", why)
    a, b = hosts.names
    data0 = hosts.counters(1, "data")
    env = {"GPUCOLL_NET": "ofi", "GPUCOLL_SOCKET_IFNAME": "data", "GPUCOLL_DEBUG": "INFO",
           "GPUCOLL_DEBUG_SUBSYS": "NET,COLL"}
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, sys.executable, CASES,
                                             "--bytes", 16 << 20], env=env)
    assert code == 0, err
    check_exact(results(out), hosts, 2, network="data")
    assert "allreduce #0 8 B int64 SUM hierarchical via SHM+OFI" in err, err
    endpoints = [line for line in err.splitlines() if "OFI endpoint of rank" in line]
    assert endpoints and all("tcp;ofi_rxm" in line and "domain data0" in line for line in endpoints), endpoints
    assert hosts.counters(1, "data")[0] - data0[0] > 16 << 20


@pytest.mark.multihost
def test_lost_host_ends_the_job_and_is_named(hosts):
    a, b = hosts.names
    code, out, err, seconds = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, sys.executable, CASES,
                                                   "--die-rank", "2"], env={"GPUCOLL_TIMEOUT": "20"})
    assert code == 125, err
    assert f"lost host {b} (node 1, ranks 2-3)" in err
    assert "stopped 2 other rank(s): 0, 1" in err
    assert seconds < 30
    leftover = subprocess.run(["pgrep", "-f", CASES], capture_output=True, text=True).stdout
    assert not leftover.strip(), "ranks outlived their job"


FAULTS = os.path.join(SCRIPTS, "fault_tolerance.py")


@pytest.mark.multihost
@pytest.mark.parametrize("args, alive", [
    (("loop", "3", 300), [0, 1, 2]),          # a rank of the other host, not its leader
    (("loop", "0", 300), [1, 2, 3]),          # the leader of the head's host
    (("loop", "1,3", -1, 5), [0, 2]),         # one on each host, each at a random moment
    (("lose-host", "2", 300), [0, 1]),        # host b's agent dies, and its ranks with it
])
def test_survivors_on_both_hosts_shrink_and_finish_exact_sums(hosts, args, alive):
    # gpurun --on-failure=continue across hosts: the head records each failure (or a lost
    # host's ranks) for the survivors, whose revoke reaches ranks waiting on the other host's
    # leader; every sum they check after the recovery is exact (tests/scripts/fault_tolerance.py).
    a, b = hosts.names
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, "--on-failure=continue",
                                             sys.executable, FAULTS, *args], env={"GPUCOLL_TIMEOUT": "30"})
    assert code == 0, err
    res = results(out)
    assert sorted(res) == alive, (out, err)
    for rank, got in res.items():
        assert got["world"] == alive and got["sizes"][-1] == len(alive), (rank, got)
    if args[0] == "lose-host":
        assert f"lost host {b} (node 1): its agent's connection dropped; the job goes on without its rank(s) 2-3" in err
    else:
        for dead in sorted(set(range(4)) - set(alive)):
            host = a if dead < 2 else b
            assert f"gpurun: rank {dead} (pid" in err and f"on {host} ended with signal" in err, err
    leftover = subprocess.run(["pgrep", "-f", FAULTS], capture_output=True, text=True).stdout
    assert not leftover.strip(), "ranks outlived their job"


@pytest.mark.multihost
def test_rank_failure_on_the_other_host_is_reported_with_its_traceback(hosts):
    a, b = hosts.names
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", *LOCAL, sys.executable, "-c",
                                             "import gpucoll,time; c=gpucoll.COMM_WORLD; c.Barrier()\n"
                                             "if c.rank == 3: raise SystemExit('rank 3 gives up')\n"
                                             "time.sleep(30)"])
    assert code == 1, err
    assert f"rank 3 (host {b}, pid" in err and "failed first: exit code 1" in err
    assert "rank 3 gives up" in err


@pytest.mark.multihost
def test_gpurun_started_by_hand_on_each_host(hosts):
    master = f"{hosts.address(0)}:29411"
    args = ["--nnodes", "2", "--master", master, "-np", "2", sys.executable, CASES]
    other = hosts.popen(1, [*GPURUN, "--node-rank", "1", *args], env=_env(), stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        code, out, err, _ = gpurun_on(hosts, 0, ["--node-rank", "0", *args])
        out1, err1 = other.communicate(timeout=60)
    finally:
        other.kill()
    assert code == 0 and other.returncode == 0, err + err1
    res = results(out)
    res.update(results(out1))
    check_exact(res, hosts, 2)
    assert sorted(results(out1)) == [2, 3], "node 1's ranks print on node 1"


# --- real ssh --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sshd(hosts, tmp_path_factory):
    for tool in ("sshd", "ssh", "ssh-keygen"):
        if not (shutil.which(tool) or os.path.exists(f"/usr/sbin/{tool}")):
            unavailable("sshd", f"{tool} is missing (apt-get install openssh-server openssh-client)")
    d = tmp_path_factory.mktemp("ssh")
    os.chmod(d, 0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d / "id"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d / "hostkey"], check=True)
    shutil.copy(d / "id.pub", d / "authorized_keys")
    os.makedirs("/run/sshd", exist_ok=True)
    procs, lines = [], []
    for i, name in enumerate(hosts.names):
        cfg = d / f"sshd_{name}"
        cfg.write_text(f"ListenAddress {hosts.address(i)}\nPort 22\nHostKey {d / 'hostkey'}\n"
                       f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                       f"PasswordAuthentication no\nUsePAM no\nStrictModes no\nPidFile {d / name}.pid\n"
                       "AcceptEnv LANG\n")
        procs.append(hosts.popen(i, ["/usr/sbin/sshd", "-D", "-e", "-f", cfg], stderr=subprocess.DEVNULL))
        lines += [f"Host {name}", f"  HostName {hosts.address(i)}", f"  IdentityFile {d / 'id'}",
                  "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR",
                  "  BatchMode yes"]
    (d / "config").write_text("\n".join(lines) + "\n")
    time.sleep(0.5)
    yield d / "config"
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


@pytest.mark.multihost
def test_agents_over_real_ssh(hosts, sshd):
    a, b = hosts.names
    code, out, err, _ = gpurun_on(hosts, 0, ["--hosts", f"{a}:2,{b}:2", "--launcher", "ssh", "--launcher-cmd",
                                             f"ssh -F {sshd} {{host}}", sys.executable, CASES])
    assert code == 0, err
    check_exact(results(out), hosts, 2)
