"""Host point to point on the native engine (cython_src/include/gc_p2p.h) in real gpurun jobs:
matching order across the eager and rendezvous protocols, bad input and faults
(tests/scripts/p2p_native.py). Each case runs over shared memory (one host), over TCP
(GPUCOLL_SHM_DISABLE=1: the protocol between hosts, bytes streamed after the receive matched)
and over OFI (libfabric's tcp provider, GPUCOLL_NET=ofi: the same protocol on the RDMA path,
large payloads read one-sided from the sender's registered memory)."""
import os

import pytest
from conftest import ofi_missing, requires

ENVS = {
    "shm": {},
    "tcp": {"GPUCOLL_SHM_DISABLE": "1"},
    "ofi": {"GPUCOLL_SHM_DISABLE": "1", "GPUCOLL_NET": "ofi"},
    # TCP with 3 stripes and a receive ring smaller than a stripe: large payloads, read straight into
    # their place, start with bytes already in the ring and arrive on every socket out of order
    "narrow-tcp": {"GPUCOLL_SHM_DISABLE": "1", "GPUCOLL_NSOCKS": "3", "GPUCOLL_BUFFSIZE": str(96 << 10)},
    # OFI with 8 slots and one-sided reads from 4 KiB: credits run out, and payloads of every size
    # but the smallest go by reads, some through the bounce ring, some into their place
    "narrow-ofi": {"GPUCOLL_SHM_DISABLE": "1", "GPUCOLL_NET": "ofi", "GPUCOLL_BUFFSIZE": str(96 << 10),
                   "GPUCOLL_OFI_RMA_MIN": "4096"},
}
_OFI = requires("ofi", ofi_missing())
TRANSPORTS = [pytest.param(name, marks=[_OFI] if "ofi" in name else []) for name in ("ofi", "shm", "tcp")]


def run(gpurun_job, mode, transport, timeout="20", limit=90, **extra):
    env = dict(ENVS[transport], GPUCOLL_TIMEOUT=timeout, **extra)
    return gpurun_job(2, "p2p_native.py", mode, env=env, timeout=limit)


@pytest.mark.parametrize("transport", TRANSPORTS + ["narrow-tcp", pytest.param("narrow-ofi", marks=_OFI)])
def test_messages_arrive_whole_and_in_order_whatever_their_protocol(gpurun_job, transport):
    job = run(gpurun_job, "order", transport).check()
    got = job.json_lines()[1]
    sizes = [8, 3 << 20, 0, 100, 1 << 20, 70000, 17, 5 << 20, 16384, 16385]
    assert got["got"] == [[0, 5, n] for n in sizes], got["got"]
    assert all(got["whole"]), got["whole"]
    assert got["tagged"] == {"7": True, "8": True, "9": True}
    assert [t for t in got["threads"] if not t.startswith("gpucoll-accept-")] == ["MainThread"], got["threads"]


@pytest.mark.parametrize("transport", ["shm", "tcp", "narrow-tcp"])
def test_runs_of_equal_small_messages_cross_stripe_chunks_whole(gpurun_job, transport):
    """Between hosts a frame that would leave less room in its stripe chunk than it takes is
    followed by a PAD frame up to the chunk's end (gc_p2p__pad): the padding is read away, whole
    or written in parts, and every message arrives as sent."""
    job = run(gpurun_job, "stripes", transport).check()
    for rank, got in job.json_lines().items():
        assert all(got["whole"]) and len(got["whole"]) == (6 if rank == 1 else 3), (rank, got)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_truncation_raises_on_the_receiver_naming_both_sizes(gpurun_job, transport):
    job = run(gpurun_job, "truncate", transport).check()
    res = job.json_lines()
    small, large = res[1]["errors"]
    assert small["type"] == "TruncationError" and "rank 0 sent 300 bytes" in small["message"], small
    assert "holds 100" in small["message"], small
    assert large["type"] == "TruncationError" and f"rank 0 sent {2 << 20} bytes" in large["message"], large
    assert "holds 1000" in large["message"], large
    assert res[1]["next"] is True
    assert all(t < 10 for t in res[0]["send_seconds"]), res[0]  # the sender completed


def test_tags_outside_0_to_tag_ub_are_refused(gpurun_job):
    job = run(gpurun_job, "tags", "shm").check()
    for rank, got in job.json_lines().items():
        assert got.pop("tag_ub_ok") is True
        for name, err in got.items():
            assert err is not None and err["type"] == "InvalidUsageError", (rank, name, err)
            assert "tag" in err["message"], (rank, name, err)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_two_large_sends_first_time_out_as_mpi_allows_and_sendrecv_does_not(gpurun_job, transport):
    job = run(gpurun_job, "crossing", transport, timeout="2").check()
    for rank, got in job.json_lines().items():
        err = got["send_first"]
        assert err["type"] == "TimeoutError", (rank, err)
        assert f"to rank {1 - rank}" in err["message"] and "Sendrecv" in err["message"], err
        assert got["send_first_seconds"] < 8, got
        assert got["small_crossed"] is True
        assert got["sendrecv"] == [True, 8 << 20]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nonblocking_requests_complete_through_waitall_waitany_waitsome_testall(gpurun_job, transport):
    job = run(gpurun_job, "requests", transport).check()
    for got in job.json_lines().values():
        assert got == {"whole": True, "waitany": True, "waitsome": True, "testall_before": False,
                       "testall_after": True}, got


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_probes_move_the_bytes_of_a_matched_large_receive(gpurun_job, transport):
    """A rank that only polls Iprobe still completes a large receive it posted before (MPI's
    progress rule): the sender's blocking Send returns and its next message is found. The receiver
    copies alone here: a sender that helps with the copy would complete it without the probes."""
    job = run(gpurun_job, "progress", transport, GPUCOLL_P2P_SHARED_COPY="0").check()
    res = job.json_lines()
    assert res[1] == {"probed": True, "whole": True}, res
    assert res[0]["send_seconds"] < 10, res


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_receiver_that_dies_fails_the_large_send_naming_it(gpurun_job, transport):
    job = run(gpurun_job, "receiver-dies", transport, timeout="30")
    got = job.json_lines()[0]
    assert got["error"]["type"] == "LostPeerError", job.describe()
    assert "Send to rank 1" in got["error"]["message"], got
    assert got["seconds"] < 10, got


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_sender_that_dies_mid_rendezvous_fails_the_receive_naming_it(gpurun_job, transport):
    job = run(gpurun_job, "sender-dies", transport, timeout="30")
    got = job.json_lines()[1]
    assert got["error"]["type"] == "LostPeerError", job.describe()
    assert "Recv from rank 0" in got["error"]["message"], got
    assert got["seconds"] < 10, got


@pytest.mark.parametrize("answer", ["ack", "cts", "data"])
def test_an_answer_to_a_send_never_made_drops_the_channel_and_says_so(gpurun_job, answer):
    job = run(gpurun_job, f"stray-{answer}", "shm").check()
    got = job.json_lines()[1]
    assert got["error"]["type"] == "LostPeerError", job.describe()
    assert "Recv from rank 0" in got["error"]["message"], got
    assert "a message it was never sent (424242)" in got["error"]["message"], got
    assert got["seconds"] < 10, got


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_gpu_envelope_never_reaches_a_host_buffer_as_data(gpurun_job, transport):
    """Every host receive path (the blocking short path included) treats a GPU message's envelope
    as one: it reads the data from GPU memory or raises saying why (here: nothing can be mapped),
    and never returns the envelope as the message."""
    res = run(gpurun_job, "envelope", transport).check().json_lines()
    got = res[1]["got"]
    for tag in ("1", "2", "3"):
        assert "rank 0" in got[tag] and "GPU" in got[tag] and "GPUCOLL_P2P_DISABLE=1" in got[tag], got
        assert got[f"{tag} untouched"], got
    assert res[1]["after"], res
    probed = res[1]["probed"]  # MPI probes read the envelope: the GPU message's size, not the envelope's
    assert probed[:3] == [0, 5, 3000] and "envelope is not one" in probed[3], probed


def _available_memory():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


@pytest.mark.skipif(_available_memory() < (10 << 30), reason="needs 10 GiB of free memory (two 2 GiB buffers "
                    "and the pattern on each rank)")
@pytest.mark.parametrize("transport", ["shm", pytest.param("ofi", marks=_OFI)])
def test_a_message_above_2_to_the_31_bytes_arrives_intact(gpurun_job, transport):
    job = run(gpurun_job, "huge", transport, timeout="60", limit=120).check()
    res = job.json_lines()
    assert res[1] == {"whole": True, "count": (1 << 31) + 4099}, res


@pytest.fixture(scope="module")
def two_hosts():
    from conftest import unavailable
    from netns import TestHosts, missing_requirement

    why = missing_requirement()
    if why:
        unavailable("multihost", why)
    with TestHosts(2, networks=("eth",)) as hosts:
        yield hosts


@pytest.mark.multihost
@pytest.mark.parametrize("net", ["tcp", pytest.param("ofi", marks=_OFI)])
@pytest.mark.parametrize("mode", ["order", "truncate", "crossing", "one-name"])
def test_point_to_point_between_two_hosts(two_hosts, mode, net):
    """One rank on each of two network-namespace hosts: the TCP channel, rendezvous by CTS/DATA;
    or the OFI channel (libfabric's tcp provider, large payloads read one-sided into place).
    one-name: both namespaces have the same host name, as two cloned machines do; they are still
    two hosts (their loopbacks differ), so the channel is the network one, not shared memory."""
    import json
    import subprocess
    import sys

    from conftest import GPURUN, SCRIPTS, _SCRUB
    from netns import NSEXEC

    a, b = two_hosts.names
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and k != "GPUCOLL_SOCKET_IFNAME"}
    env.update(PYTHONDONTWRITEBYTECODE="1", GPUCOLL_TIMEOUT="2" if mode == "crossing" else "20", GPUCOLL_NET=net)
    if mode == "one-name":
        env.update(NETNS_HOST_NAME="clone", GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="P2P")
    script = [os.path.join(SCRIPTS, "p2p_native.py"), "order" if mode == "one-name" else mode]
    proc = two_hosts.run(0, [*GPURUN, "--hosts", f"{a},{b}", "--launcher", "local", "--launcher-cmd",
                             f"{NSEXEC} {{host}}", sys.executable, *script],
                         env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = {int(line[1:line.index("]")]): json.loads(line.split("RESULT ", 1)[1])
           for line in proc.stdout.splitlines() if "] RESULT " in line}
    if mode in ("order", "one-name"):
        assert all(res[1]["whole"]) and res[1]["tagged"] == {"7": True, "8": True, "9": True}, res
        said = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "point to point with" in line]
        assert mode == "order" or said and all(f"via {net.upper()}" in line for line in said), said
    elif mode == "truncate":
        assert [e["type"] for e in res[1]["errors"]] == ["TruncationError"] * 2 and res[1]["next"] is True, res
    else:
        assert all(r["sendrecv"] == [True, 8 << 20] and r["small_crossed"] for r in res.values()), res
