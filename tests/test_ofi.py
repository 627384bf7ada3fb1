"""The OFI transport (cython_src/include/gc_ofichan.h, gpucoll/transports/ofi.py) on libfabric's
software providers: the channel on its own, collectives and point to point in real gpurun jobs
with GPUCOLL_NET=ofi (GPUCOLL_SHM_DISABLE=1 puts every pair of ranks on it), and bad settings.
Between two hosts: tests/test_multihost.py; the point-to-point protocol cases over OFI:
tests/test_p2p_native.py."""
import os
import re
import socket
import threading

import pytest
from conftest import ofi_missing, requires
from test_collectives import build_cases, run_cases, used

pytestmark = requires("ofi", ofi_missing())
OFI = {"GPUCOLL_SHM_DISABLE": "1", "GPUCOLL_NET": "ofi"}


def channel_pair(provider, domain, slot_bytes, nslots, rma_min):
    """Two channels between two endpoints of this process, met over a socket pair."""
    from gpucoll._native import ofi

    doms = [ofi.OfiDomain(provider, domain, ofi.MR_VERBS) for _ in range(2)]
    a, b = socket.socketpair()
    chans = [ofi.OfiChannel(d, s.detach(), peer=1 - i, slot_bytes=slot_bytes, nslots=nslots, rma_min=rma_min)
             for i, (d, s) in enumerate(zip(doms, (a, b)))]
    blobs = [c.setup_blob() for c in chans]
    chans[0].connect(blobs[1])
    chans[1].connect(blobs[0])
    return doms, chans


def exchange(chans, sizes):
    """Each side sends a stream of random messages of `sizes` while receiving the other's; both
    byte streams must arrive whole and in order."""
    from gpucoll._native import sock

    data = [[os.urandom(n) for n in sizes] for _ in range(2)]
    got = [[None] * len(sizes) for _ in range(2)]

    def side(i):
        for k, n in enumerate(sizes):
            got[i][k] = bytes(sock.chan_sendrecv(chans[i].ptr, data[i][k], n, timeout=30))

    t = threading.Thread(target=side, args=(1,))
    t.start()
    side(0)
    t.join()
    return got[0] == data[1] and got[1] == data[0]


SIZES = [1, 16, 64, 65, 4096, 4097, 32 << 10, 100_000, 3 << 20, 7, 262_144, 1 << 20, 0, 48]


@pytest.mark.parametrize("provider, domain", [("tcp;ofi_rxm", "lo"), ("shm", None)])
def test_channel_carries_every_size_whole_and_in_order(provider, domain):
    """Eager messages (injected, copied through slots, cut at slot boundaries, credits running out
    with 4 slots) and one-sided reads through the bounce ring (from 64 KiB). tcp;ofi_rxm takes
    remote offsets and keys chosen here; shm asks for FI_MR_VIRT_ADDR (remote virtual addresses)."""
    from gpucoll._native import ofi

    try:
        doms, chans = channel_pair(provider, domain, 4096, 4, 64 << 10)
    except ofi.OfiUnavailable as exc:
        if provider == "shm":
            pytest.skip(f"libfabric's shm provider does not open here: {exc}")
        raise
    try:
        assert set(doms[0].mr_mode) >= {"FI_MR_LOCAL", "FI_MR_VIRT_ADDR", "FI_MR_ALLOCATED", "FI_MR_PROV_KEY"}
        assert exchange(chans, SIZES)
        assert exchange(chans, SIZES[::-1])
        big = sum(n >= 64 << 10 for n in SIZES)
        for ch in chans:  # each side sent the large ones as RMA messages and read the other's
            got = ch.stats()
            assert got["rma"] == 2 * big and got["read_bounce"] == 2 * sum(n for n in SIZES if n >= 64 << 10), got
            assert got["eager"] >= 2 * (len(SIZES) - big), got
    finally:
        for c in chans:
            c.close()
        for d in doms:
            d.close()


def test_every_collective_over_ofi_with_exact_results(gpurun_job, tmp_path):
    """Schedules (auto, ring, tree, rhd, rd) over OFI channels, 3 ranks, large cases included (one-sided
    reads of the 3M-element blocks)."""
    cases = build_cases(3, seed=30, large=True)
    job, _ = run_cases(gpurun_job, tmp_path, 3, ["auto", "ring", "tree", "rhd", "rd"], cases, env=OFI, timeout=240)
    for path in ("auto", "ring", "tree", "rhd", "rd"):
        assert "label=OFI" in used(job, path), used(job, path)


def test_point_to_point_and_collectives_say_they_ride_ofi(gpurun_job):
    job = gpurun_job(2, "debug_log.py", env={**OFI, "GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "NET,COLL"})
    job.check()
    for rank in (0, 1):
        err = "\n".join(job.lines(rank, "stderr"))
        assert "between hosts: OFI provider tcp;ofi_rxm (GPUCOLL_NET=ofi and no RDMA device" in err, err
        assert "OFI endpoint of rank" in err and "domain lo" in err, err
        assert " via OFI" in err and " via TCP" not in err, err


def test_buffer_sizes_that_differ_across_ranks_are_named(gpurun_job):
    job = gpurun_job(2, "ofi_settings.py", "buffsize", env={**OFI, "GPUCOLL_TIMEOUT": "20"}, timeout=60)
    assert job.returncode != 0
    assert "set GPUCOLL_BUFFSIZE alike on every rank" in job.stderr, job.describe()


def test_an_unknown_provider_is_refused_naming_it(gpurun_job):
    job = gpurun_job(2, "ofi_settings.py", "plain",
                     env={**OFI, "GPUCOLL_OFI_PROVIDER": "nosuchfabric", "GPUCOLL_TIMEOUT": "20"}, timeout=60)
    assert job.returncode != 0
    assert "InvalidUsageError: GPUCOLL_OFI_PROVIDER='nosuchfabric': libfabric offers no such provider" in job.stderr, \
        job.describe()
    assert "it offers " in job.stderr and "tcp;ofi_rxm" in job.stderr, job.describe()


def test_large_point_to_point_is_read_into_place_and_small_goes_eager(gpurun_job):
    """A 3 MiB Send/Recv: the receiver reads it one-sided straight into the receive buffer (no
    bounce, no copy on the sender); 8-byte messages go eager."""
    job = gpurun_job(2, "ofi_settings.py", "p2p", env=OFI, timeout=60).check()
    res = job.json_lines()
    assert res[0]["whole"] and res[1]["whole"], res
    sender, receiver = res[0]["stats"], res[1]["stats"]
    assert sender["rma"] >= 1 and receiver["read_direct"] >= 3 << 20, (sender, receiver)
    assert receiver["read_bounce"] == 0, receiver
    assert sender["eager"] >= 100, sender


def test_pretend_hosts_talk_over_ofi(gpurun_job):
    """GPUCOLL_TEST_HOST=pretend%r: each rank its own host; every collective between them rides OFI."""
    env = {"GPUCOLL_TEST_HOST": "pretend%r", "GPUCOLL_NET": "ofi", "GPUCOLL_DEBUG": "INFO",
           "GPUCOLL_DEBUG_SUBSYS": "COLL,NET"}
    job = gpurun_job(3, "multihost_cases.py", "--bytes", 1 << 20, env=env, timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2], job.describe()
    for rank, r in res.items():
        assert all(r["ok"].values()), f"rank {rank}: wrong results {r['ok']}"
    colls = re.findall(r"gpucoll INFO \[COLL\] allreduce #\d+ \d+ B .* via (\S+)$", job.stderr, re.M)
    assert colls and set(colls) == {"OFI"}, colls


def test_loading_libfabric_keeps_the_programs_signal_handlers():
    """Some providers (PSM2's) install their own SIGINT/SIGTERM/SIGSEGV handlers when libfabric
    loads or lists providers: a rank that ignores SIGTERM would die, Ctrl-C would stop raising
    KeyboardInterrupt. After loading, listing and opening, both still behave as the program set."""
    import subprocess
    import sys

    code = ("import os, signal\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "from gpucoll._native import ofi\n"
            "ofi.load(); ofi.interfaces(); ofi.OfiDomain('tcp;ofi_rxm', None, ofi.MR_VERBS).close()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    import time; time.sleep(1)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "interrupted", (got.returncode, got.stdout, got.stderr)


def test_alloc_mem_keeps_one_registration_and_a_reused_address_gets_its_own(gpurun_job):
    """Reads into MPI.Alloc_mem memory register it once; once it is freed, a NumPy array the
    allocator puts at the same address is registered per read, never through the old
    registration (which named the old pages). Every message exact."""
    env = {"GPUCOLL_TEST_HOST": "pretend%r", "GPUCOLL_NET": "ofi"}
    job = gpurun_job(2, "ofi_registration.py", env=env, timeout=120).check()
    res = job.json_lines()[1]
    assert res["whole"] == [True] * 5 and res["same_address"], res
    kept, reused_address = res["counts"]
    assert kept == {"registrations": 1, "reused": 2}, res
    assert reused_address["registrations"] >= 3 and reused_address["reused"] == 2, res
