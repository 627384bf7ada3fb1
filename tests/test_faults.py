"""Failures users meet, in real gpurun jobs (tests/scripts/faults.py, first_call.py, roots.py):
a rank that dies inside a collective or before a communicator's first one, a rank that comes
late to the first one, a rank that skips one (GPUCOLL_TIMEOUT), ranks whose calls disagree
(with GPUCOLL_DEBUG_CHECKS=1, and without: then the direct engine's call signatures and the
executor's message headers catch them, roots included), and bad arguments, refused before
anything is sent."""
import re

import pytest
from conftest import ofi_missing, requires

PATHS = {"auto": {}, "direct": {"GPUCOLL_ALGO": "direct"}, "ring": {"GPUCOLL_ALGO": "ring"},
         "tcp": {"GPUCOLL_SHM_DISABLE": "1"}, "ofi": {"GPUCOLL_SHM_DISABLE": "1", "GPUCOLL_NET": "ofi"}}
OFI = pytest.param("ofi", marks=requires("ofi", ofi_missing()))


@pytest.mark.parametrize("path", ["direct", "ring", "tcp", OFI])
def test_rank_dies_inside_allreduce(gpurun_job, path):
    # The survivors ignore SIGTERM so they outlive gpurun's fail-fast stop long enough to show
    # what they got; they must get it quickly, not after GPUCOLL_TIMEOUT (300 s by default).
    job = gpurun_job(3, "faults.py", "die", env=PATHS[path], launcher_args=("--grace", 20), timeout=40)
    assert job.returncode == 7, job.describe()
    assert job.seconds < 15, job.describe()
    assert "gpurun: rank 1 (host" in job.stderr and "failed first: exit code 7" in job.stderr
    lost = job.json_lines("LOST ")
    assert sorted(lost) == [0, 2], job.describe()
    for rank, info in lost.items():
        assert info["type"] == "LostPeerError", info
        assert info["elapsed"] < 10, info
        assert "allreduce #6 on communicator world" in info["message"], info
        assert info["ranks"] and ("is gone" in info["message"] or "exited" in info["message"]), info
    # Every survivor names rank 1: the direct engine sees the whole group, and on the
    # schedule paths the dispatcher checks which processes of the host have really ended
    # (the neighbour a schedule noticed first may only have left the call). A survivor that
    # already exited after its own error may be named too: its process has ended as well.
    for rank, info in lost.items():
        assert 1 in info["ranks"] and rank not in info["ranks"], lost
    if path == "direct":
        assert all(info["ranks"] == [1] for info in lost.values()), lost


@pytest.mark.parametrize("dead", [0, 2])
@pytest.mark.parametrize("path", ["direct", "ring", "tcp", OFI])
def test_rank_gone_before_first_collective_is_named_at_once(gpurun_job, path, dead):
    # A rank raises before the first collective, which sets up shared memory or sockets and
    # waits for every rank's side of it. Rank 0 creates the segments and connects first
    # (dead=0: the creator never comes); rank 2 is the one the others wait for to attach and
    # whose listener they connect to (dead=2). The survivors must not wait for GPUCOLL_TIMEOUT
    # (15 s), let alone GPUCOLL_INIT_TIMEOUT (120 s): their Allreduce names the rank at once.
    job = gpurun_job(3, "first_call.py", "dies", dead, env={"GPUCOLL_TIMEOUT": 15, **PATHS[path]},
                     launcher_args=("--grace", 20), timeout=45)
    assert job.returncode == 1, job.describe()
    assert f"gpurun: rank {dead} (host" in job.stderr and "gives up before its first collective" in job.stderr
    lost = job.json_lines("LOST ")
    assert sorted(lost) == sorted({0, 1, 2} - {dead}), job.describe()
    for rank, info in lost.items():
        assert info["type"] == "LostPeerError", (path, rank, info)
        assert info["message"].startswith(f"allreduce #0 on communicator world (rank {rank} of 3): "), info
        assert dead in info["ranks"] and rank not in info["ranks"], (path, rank, info)
        assert info["elapsed"] < 5, (path, rank, info)


@pytest.mark.parametrize("path", ["direct", "ring", "tcp"])
def test_rank_late_to_first_collective_within_timeout_succeeds(gpurun_job, path):
    # Rank 0 (the creator of the shared memory, the one that connects the sockets) comes to
    # the first collective 6 s late: later than GPUCOLL_INIT_TIMEOUT (4 s: joining the job,
    # which must still fit it on a loaded machine), well within GPUCOLL_TIMEOUT (30 s).
    env = {"GPUCOLL_INIT_TIMEOUT": 4, "GPUCOLL_TIMEOUT": 30, **PATHS[path]}
    job = gpurun_job(3, "first_call.py", "late", 6, env=env, timeout=50).check()
    assert job.json_lines() == {r: [6.0] * 8 for r in range(3)}, job.describe()


def test_rank_dies_job_ends_with_report(gpurun_job):
    # What a user's job does: gpurun stops the others and reports the rank that failed.
    job = gpurun_job(3, "faults.py", "die-default", timeout=40)
    assert job.returncode == 7, job.describe()
    assert job.seconds < 10, job.describe()
    assert "gpurun: rank 1 (host" in job.stderr and "failed first: exit code 7" in job.stderr
    assert "stopped 2 other rank(s): 0, 2" in job.stderr
    assert "gpurun: exiting with 7" in job.stderr


@pytest.mark.parametrize("path", ["direct", "ring", "tcp"])
def test_skipped_collective_times_out_naming_call_and_rank(gpurun_job, path):
    size = 3
    job = gpurun_job(size, "faults.py", "skip", env={"GPUCOLL_TIMEOUT": 2, **PATHS[path]}, timeout=40).check()
    late = job.json_lines("TIMEOUT ")
    assert sorted(late) == [0, 1], job.describe()
    for rank, info in late.items():
        assert info["type"] == "TimeoutError" and info["is_builtin_timeout"], info
        msg = info["message"]
        assert msg.startswith(f"allreduce #2 on communicator world (rank {rank} of {size}): "), msg
        assert re.search(r"\b2(\.\d+)? s\b", msg) and info["ranks"] == [2], msg
        assert "rank(s) 2" in msg, msg
        assert 1.9 <= info["elapsed"] < 8, info
        # The times the message gives add up to when the error came (a check for late ranks
        # may follow the timeout itself).
        told = sum(float(t) for t in re.findall(r"(\d+(?:\.\d+)?) s\b", msg))
        assert abs(told - info["elapsed"]) < 0.75, (msg, info["elapsed"])


def test_mismatched_calls_raise_on_every_rank(gpurun_job):
    job = gpurun_job(3, "faults.py", "mismatch", env={"GPUCOLL_DEBUG_CHECKS": 1}).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2], job.describe()
    expect = {  # what differs, who differs, and how the odd one out is described
        "count": ("count", [1], "rank 1: allreduce count=5 dtype=float32"),
        "dtype": ("dtype", [2], "rank 2: allreduce count=4 dtype=float64"),
        "op": ("op", [0], "rank 0: allreduce count=4 dtype=float32 op=MAX"),
        "root": ("root", [1], "rank 1: bcast count=4 dtype=float32 op=- root=1"),
        "operation": ("operation", [2], "rank 2: allgather count=4"),
    }
    for rank, got in res.items():
        for case, (field, ranks, odd) in expect.items():
            info = got[case]
            assert info["type"] == "MismatchError", (rank, case, info)
            assert f"#{list(expect).index(case)} on communicator world" in info["message"], info
            assert "differing: " in info["message"] and field in info["message"].split("differing: ")[1], info
            assert odd in info["message"] and info["ranks"] == ranks, info
        assert got["after"] == [3.0] * 4  # the communicator still works


@pytest.mark.parametrize("path", ["auto", "ring", "tcp"])
def test_mismatched_calls_raise_without_debug_checks(gpurun_job, path):
    # No cross-check round: what the direct engine (auto: one host) or the executor's headers
    # (ring over shared memory, tcp) find by themselves. Every rank gets MismatchError from the
    # call itself, at once, never a wrong buffer or a hang: the data of the call (count, dtype,
    # op), or for Bcast the root every rank announces before any data moves ("root": ranks 0
    # and 2 take root 0, rank 1 itself; "roots-all-differ": every rank waits for another root,
    # so no rank would send anything).
    env = {"GPUCOLL_TIMEOUT": 2, **PATHS[path]}
    job = gpurun_job(3, "faults.py", "unchecked", env=env, timeout=90).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2], job.describe()
    for rank, got in res.items():
        assert sorted(got) == ["count", "dtype", "op", "root", "roots-all-differ"], got
        for case, info in got.items():
            assert info["type"] == "MismatchError", (path, rank, case, info)
            assert "every rank must call collectives in the same order" in info["message"], info
            assert info["where"] == "call" and info["elapsed"] < 1.5, (path, rank, case, info)
    if path == "auto":  # the direct engine names both calls
        assert ("rank 1 called allreduce with 20 x float32 SUM, this rank with allreduce with 10 x float32 SUM"
                in res[0]["count"]["message"]), res[0]["count"]
        assert "20 x float32 MAX" in res[0]["op"]["message"] and "20 x int32 SUM" in res[0]["dtype"]["message"]
    else:
        assert "reduces with MAX" in res[0]["op"]["message"] or "reduces with SUM" in res[0]["op"]["message"]


def assert_roots_raised_at_the_call(job):
    """What tests/scripts/roots.py (3 ranks) reports must show: every call with disagreeing
    roots raised MismatchError on every rank in that very call, at once (well before
    GPUCOLL_TIMEOUT), naming two or more of the roots used; every call with agreeing roots
    gave exactly MPI's data."""
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2], job.describe()
    for rank, got in res.items():
        assert got.pop("agree") == [], (rank, job.describe())
        assert len(got) == 16, sorted(got)
        for case, info in got.items():
            kind, _, roots = case.split("/")
            assert info["type"] == "MismatchError" and info["where"] == "call", (rank, case, info)
            msg = info["message"]
            assert msg.startswith(f"{kind} #0 on communicator world.d"), (rank, case, msg)
            named = {int(r) for r in re.findall(r"\broot[ =](\d+)", msg)}
            assert len(named) >= 2 and named <= ({0, 1, 2} if roots == "self" else {0, 1}), (rank, case, msg)
            assert info["elapsed"] < 8, (rank, case, info)


@pytest.mark.parametrize("path", ["auto", "ring", "tcp"])
def test_disagreeing_roots_raise_on_every_rank_at_that_call(gpurun_job, path):
    # Bcast, Reduce, Gather and Scatter (16 B and 400 KB) where every rank takes itself for
    # the root (nobody receives) or where roots are {0, 0, 1}: the direct engine (auto) makes
    # every rank wait for every rank's announcement of its call, schedules (ring over shared
    # memory, tcp) start with a round of headers. GPUCOLL_TIMEOUT is 20 s.
    job = gpurun_job(3, "roots.py", env={"GPUCOLL_TIMEOUT": 20, **PATHS[path]}, timeout=120).check()
    assert_roots_raised_at_the_call(job)


@pytest.mark.parametrize("path", ["auto", "tcp"])
def test_gpu_root_check_raises_on_every_rank_at_that_call(gpurun_job, path):
    # The check that rooted GPU calls make on the host before launching (the kernels carry no
    # signature): a barrier carrying the call's signature over the direct segment (auto), the
    # cross-check's all-gather elsewhere (tcp). Run here on its own, without a GPU.
    job = gpurun_job(3, "roots.py", "--agree", env={"GPUCOLL_TIMEOUT": 20, **PATHS[path]}, timeout=120).check()
    assert_roots_raised_at_the_call(job)


def test_bad_arguments_raise_before_anything_is_sent(gpurun_job):
    res = gpurun_job(3, "faults.py", "badargs").check().json_lines()
    for rank in (0, 2):
        assert res[rank] == {"after": [6, 6, 6]}
    got = res[1]
    assert got.pop("after") == [6, 6, 6]  # only rank 1 made the bad calls: nothing went out
    assert got.pop("seq_unchanged") is True
    words = {  # a few words each message must contain
        "non-contiguous sendbuf": "not contiguous", "non-contiguous buf": "not contiguous",
        "different sizes": "same number of elements", "different dtypes": "same dtype",
        "allgather recvbuf size": "not a multiple", "reduce_scatter sizes": "must hold size x recvbuf",
        "alltoall not divisible": "not a multiple", "scatter root sendbuf": "not a multiple",
        "gather root recvbuf": "not a multiple", "root too large": "root 3 is out of range",
        "negative root": "root -1 is out of range", "root not an int": "integer rank",
        "BAND on float": "bitwise", "BXOR on float64 reduce": "bitwise", "MAX on complex": "complex",
        "unknown op": "unknown reduction op", "read-only recvbuf": "read-only",
        "read-only Bcast on a receiver": "read-only", "read-only Recv": "read-only",
        "object dtype": "dtype object", "not a buffer": "not a buffer",
        "IN_PLACE on a non-root": "only allowed on the root", "Send to a rank out of range": "out of range",
        "Recv from a rank out of range": "out of range", "Isend negative dest": "out of range",
        "negative count in a buffer spec": "count -1 must be a non-negative integer",
        "overlapping buffers": "overlap in memory", "allgather sendbuf at another rank's block": "overlap",
        "big-endian buffer": "byte order", "negative tag": "tag -5 is not allowed",
        "tag not an int": "tag 1.5 is not allowed",
    }
    assert sorted(got) == sorted(words)
    for name, info in got.items():
        assert info["type"] == "InvalidUsageError", (name, info)
        assert words[name] in info["message"], (name, info["message"])


def test_connection_closed_inside_a_message_fails_the_receive(gpurun_job):
    # The receive being filled is no longer posted; it must still be told, not wait for ever.
    job = gpurun_job(2, "p2p_faults.py", "cut", env={"GPUCOLL_TIMEOUT": "5"}, timeout=40).check()
    cut = job.json_lines("CUT ")
    assert sorted(cut) == [1], job.describe()
    assert cut[1]["type"] == "LostPeerError", cut
    assert "in the middle of a 65536-byte message with tag 5" in cut[1]["message"], cut
    assert cut[1]["elapsed"] < 4, cut
