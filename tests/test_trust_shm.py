"""Shared memory only the job can touch; forked children refused; any contiguous order accepted.

Jobs run through gpurun (tests/scripts/trust_shm.py). The squatter is a second, unprivileged
user: the test runs as root and starts it with setpriv (uid 65534); without those it skips.
The segment-file rules are also checked in this process (shm_segment.py), with leftovers made
by real processes that have ended.
"""
import glob
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from gpucoll._native import direct
from gpucoll.base.errors import SharedMemoryError
from gpucoll.transports import shm_direct
from gpucoll.transports.shm import ShmChannels
from gpucoll.transports.shm_segment import SHM_DIR, JobSegments, create, open_checked

FAST_FAIL = {"GPUCOLL_TIMEOUT": "10", "GPUCOLL_INIT_TIMEOUT": "10"}  # a broken check fails, not hangs
OTHER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _other_user_python():
    """An interpreter that uid 65534 may run, or None (not root, no setpriv)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    for python in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if python and subprocess.run(OTHER + [python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


OTHER_PY = _other_user_python()
needs_other_user = pytest.mark.skipif(OTHER_PY is None, reason="needs root, setpriv and a Python uid 65534 may run")


def _files_of(uid):
    return {p for p in glob.glob(f"{SHM_DIR}/gpucoll-*") if os.lstat(p).st_uid == uid}


@pytest.fixture
def other_users_files():
    """Removes the files uid 65534 leaves in /dev/shm during the test."""
    before = _files_of(65534)
    yield
    for path in _files_of(65534) - before:
        os.unlink(path)


def _check_refused(job, nranks, words):
    res = job.check().json_lines()
    assert sorted(res) == list(range(nranks)), job.describe()
    planted = res[0]["files"]
    for rank, got in res.items():
        assert got["type"] == "SharedMemoryError", (rank, got)
        msg = got["message"]
        assert words in msg and "This job did not create it" in msg and "Remove the file" in msg, msg
        assert any(path in msg for path in planted), (msg, planted)  # names the file
        assert got["elapsed"] < 5, got              # at once: no rank waits for a timeout
        assert got["after"] == [float(nranks)] * 4  # the job goes on over its other communicators
    assert res[0]["unchanged"] is True, "a rank wrote into the squatted file"
    return planted


@needs_other_user
@pytest.mark.parametrize("algo", ["auto", "ring"])  # the direct segment; the rank pairs' segments
def test_segments_squatted_by_another_user_are_refused_on_every_rank(gpurun_job, other_users_files, algo):
    job = gpurun_job(3, "trust_shm.py", "squat-user", OTHER_PY, env=dict(FAST_FAIL, GPUCOLL_ALGO=algo), timeout=60)
    planted = _check_refused(job, 3, "belongs to uid 65534")
    assert len(planted) == (1 if algo == "auto" else 3)
    assert job.seconds < 30


@pytest.mark.parametrize("algo", ["auto", "ring"])
def test_segments_with_another_jobs_token_are_refused_on_every_rank(gpurun_job, algo):
    job = gpurun_job(3, "trust_shm.py", "squat-token", env=dict(FAST_FAIL, GPUCOLL_ALGO=algo), timeout=60)
    _check_refused(job, 3, "holds a segment with another job's token")


# ---- leftovers --------------------------------------------------------------------------------

MAKE = """
    import os, sys, time
    from gpucoll.transports import shm_direct
    from gpucoll.transports.shm import ShmChannels
    from gpucoll.transports.shm_segment import JobSegments
    kept = []
    for spec in sys.argv[1:]:
        if spec == "stay":
            continue
        job, what, peer_pid = spec.split(":")
        segs = JobSegments(job, b"an earlier job")
        if what == "direct":  # local rank 0 of 2 creates; the other never attaches
            kept.append(shm_direct.create_or_attach(segs, "w", 0, 2, slot_bytes=4096))
        else:                 # rank 0 of a pair creates; its peer (pid peer_pid) has not attached
            chans = ShmChannels(segs, "w/coll", 0, [os.getpid(), int(peer_pid)], capacity=4096)
            kept.append((chans, chans.channel(1)))
    print("made", flush=True)
    if "stay" in sys.argv:  # stays alive until killed
        time.sleep(120)
"""


def _make(*specs, stay=False):
    """Segments made by a new Python process (job:direct:0 or job:pair:PEER_PID each), which has
    ended when this returns, unless `stay`: then the running process is returned."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(MAKE), *specs] + (["stay"] if stay else []),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "made"
    if stay:
        return proc
    assert proc.wait(60) == 0


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_later_job_removes_segments_whose_processes_are_gone(gpurun_job, other_users_files):
    jobs = {k: f"t{uuid.uuid4().hex[:10]}" for k in ("direct", "pair", "live", "peer-alive", "other")}
    path = {k: shm_direct.segment_path(JobSegments(j, b"an earlier job"), "w") for k, j in jobs.items()}
    for k in ("pair", "peer-alive"):
        path[k] = ShmChannels(JobSegments(jobs[k], b"an earlier job"), "w/coll", 0).path(1)
    live = _make(f"{jobs['live']}:direct:0", stay=True)
    try:
        # One process makes them all, then ends (a process removes leftovers before it creates).
        _make(f"{jobs['direct']}:direct:0",                # creator gone
              f"{jobs['pair']}:pair:{_dead_pid()}",        # creator and expected peer gone
              f"{jobs['peer-alive']}:pair:{live.pid}")     # creator gone, its peer may still come
        if OTHER_PY:  # another user's segment whose creator is gone: never touched
            image = bytearray(direct.segment_size(2, 4096))
            direct.format_segment(image, 2, 4096, _dead_pid(), 1)
            subprocess.run(OTHER + [OTHER_PY, "-c", f"open({path['other']!r}, 'wb').write(bytes.fromhex("
                                    f"{image.hex()!r}))"], check=True)
        for k in path:
            assert os.path.exists(path[k]) or (k == "other" and not OTHER_PY), k
        job = gpurun_job(2, "trust_shm.py", "fortran").check()  # any job that makes a segment
        assert all(not got["failures"] for got in job.json_lines().values())
        assert not os.path.exists(path["direct"]), "a dead creator's direct segment was left"
        assert not os.path.exists(path["pair"]), "a channel of two dead processes was left"
        assert os.path.exists(path["live"]), "the segment of a live process was removed"
        assert os.path.exists(path["peer-alive"]), "a channel whose peer is alive was removed"
        if OTHER_PY:
            assert os.path.exists(path["other"]), "another user's file was touched"
    finally:
        live.kill()
        live.wait()
        for k in ("live", "peer-alive", "direct", "pair"):
            if os.path.exists(path[k]):
                os.unlink(path[k])


def test_a_creator_replaces_its_own_leftover_and_refuses_a_live_segment():
    job = f"t{uuid.uuid4().hex[:10]}"
    segs = JobSegments(job, b"an earlier job")  # the same job identity run again (a derived secret)
    _make(f"{job}:direct:0")
    group = shm_direct.create_or_attach(segs, "w", 0, 2, slot_bytes=4096)  # replaces it
    path = shm_direct.segment_path(segs, "w")
    try:
        with pytest.raises(SharedMemoryError, match="in use by another live process"):
            create(path, 4096, segs.token(path))  # this time its creator (this process) is alive
    finally:
        group.close()
        os.unlink(path)


def test_an_attacher_refuses_links_fifos_and_files_others_may_write(tmp_path):
    segs = JobSegments(f"t{uuid.uuid4().hex[:10]}", b"secret")
    path = shm_direct.segment_path(segs, "w")
    target = tmp_path / "target"
    target.write_bytes(bytes(4096))
    cases = {"link": lambda: os.symlink(target, path), "fifo": lambda: os.mkfifo(path, 0o600),
             "mode": lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)) or os.chmod(path, 0o660)}
    words = {"link": "not a regular file", "fifo": "not a regular file", "mode": "has mode 0660"}
    for name, make in cases.items():
        make()
        try:
            with pytest.raises(SharedMemoryError, match=words[name]):
                open_checked(path)
            with pytest.raises(SharedMemoryError, match=words[name]):  # nor replaced by its creator
                create(path, 4096, segs.token(path))
        finally:
            os.unlink(path)
    assert target.read_bytes() == bytes(4096)


# ---- fork ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["auto", "ring"])  # direct engine with its fast path; pair channels
def test_a_forked_child_cannot_use_its_parents_communicators(gpurun_job, algo):
    job = gpurun_job(2, "trust_shm.py", "fork", env=dict(FAST_FAIL, GPUCOLL_ALGO=algo), timeout=60).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1], job.describe()
    for rank, got in res.items():
        assert got["fast_path"] is (algo == "auto")
        assert len(got["child"]) == (9 if rank == 0 else 8), got["child"]  # rank 0: + "pending Wait"
        for name, said in got["child"].items():
            assert said.startswith("InvalidUsageError: communicator world belongs to process"), (rank, name, said)
            assert "is a fork of it" in said and "'spawn'" in said, said
        assert got["child_exit"] == 0
        # the parent's results are exact after the child used, freed and dropped the communicator
        assert got["parent"] == [[1.0 + 2 * i, 1.0 + 2 * i, 7.0 + i] for i in range(3)], got
        assert got["dup"] == [3, 3, 3]
        assert got["pending"] == [2.0] * 4


# ---- Fortran order ------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["auto", "ring"])
def test_fortran_ordered_buffers_are_taken_in_memory_order(gpurun_job, algo):
    res = gpurun_job(2, "trust_shm.py", "fortran", env={"GPUCOLL_ALGO": algo}).check().json_lines()
    assert sorted(res) == [0, 1]
    for rank, got in res.items():
        assert got["failures"] == [], (rank, got["failures"])
        assert got["fast_path"] is True
        assert "not contiguous" in got["non_contiguous"], got["non_contiguous"]
