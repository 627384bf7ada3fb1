"""Surviving lost ranks (gpurun --on-failure=continue; gpucoll/api/fault.py), with real ranks
that die by SIGKILL or SIGALRM (tests/scripts/fault_tolerance.py): survivors of a loop of 1,000 exact
all-reduces revoke, shrink and finish, whether one rank dies, two at once, one at a random
moment (inside a collective or a recovery), or one while the others shrink; revoke reaches
ranks blocked in a receive, a barrier or a rendezvous send; agree and failed agree on every
survivor; misuse and the job's end are reported. Nothing is left in /dev/shm."""
import json
import os
import subprocess
import sys

import pytest

from conftest import SCRIPTS, run_job, unavailable

CONTINUE = ("--on-failure=continue",)


def survivors(job, expected):
    results = job.json_lines()
    assert sorted(results) == expected, job.describe()
    for rank in expected:
        assert f"gpurun: rank {rank} " not in job.stderr, job.describe()
    return results


@pytest.mark.parametrize("victims, step", [("2", 300), ("1,3", 500), ("0", 10)])
def test_survivors_shrink_and_finish_exact_sums(no_leftover_segments, victims, step):
    job = run_job(4, "fault_tolerance.py", "loop", victims, step, launcher_args=CONTINUE, timeout=60).check()
    dead = sorted(int(v) for v in victims.split(","))
    alive = [r for r in range(4) if r not in dead]
    for rank, got in survivors(job, alive).items():
        assert got["world"] == alive and got["sizes"] == [len(alive)], (rank, got)
        # the death itself, or the revoke of a survivor that saw it first
        assert got["errors"][0] in ("LostPeerError", "RevokedError"), (rank, got)
    for rank in dead:
        assert f"gpurun: rank {rank} (pid" in job.stderr and "SIGKILL" in job.stderr, job.describe()
    assert "the job goes on without it (--on-failure=continue)" in job.stderr


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_death_at_a_random_moment_leaves_one_consistent_communicator(no_leftover_segments, seed):
    # Two victims, each at its own random step and then up to 2 ms later: inside an all-reduce,
    # between two, or during the other's recovery. Every sum the loop checked was exact.
    job = run_job(4, "fault_tolerance.py", "loop", "1,2", -1, seed, launcher_args=CONTINUE, timeout=60).check()
    results = survivors(job, [0, 3])
    assert {tuple(got["world"]) for got in results.values()} == {(0, 3)}, job.describe()
    assert all(got["sizes"][-1] == 2 for got in results.values()), job.describe()


def test_a_rank_dying_while_the_others_shrink(no_leftover_segments):
    job = run_job(4, "fault_tolerance.py", "shrink-death", 1, 3, launcher_args=CONTINUE, timeout=60).check()
    results = survivors(job, [0, 2])
    for got in results.values():
        assert got["world"] == [0, 2] and got["sizes"][-1] == 2, job.describe()


@pytest.mark.parametrize("kind", ["recv", "barrier", "send", "recv-after-garbage"])
def test_revoke_wakes_ranks_blocked_on_the_communicator(no_leftover_segments, kind):
    # recv-after-garbage: a revocation key that names no communicator is skipped with a warning,
    # and the watcher still delivers the real revocation after it
    job = run_job(3, "fault_tolerance.py", "revoke", kind, launcher_args=CONTINUE, timeout=30).check()
    results = job.json_lines()
    assert sorted(results) == [0, 1, 2], job.describe()
    for rank, got in results.items():
        assert got["later"] == "RevokedError" and got["revoked"] is True, (rank, got)
        assert got["size"] == 3 and got["total"] == 3.0, (rank, got)
        if rank != 1:  # blocked until rank 1 revoked, 0.3 s after they started waiting
            assert got["got"] == "RevokedError" and 0.25 < got["waited"] < 5, (rank, got)
    if kind == "recv-after-garbage":
        assert "does not name a communicator" in job.stderr, job.describe()


def test_an_offer_arriving_after_a_revoke_is_refused():
    # rank 0 has not heard of the revoke (no --on-failure=continue, no fault-tolerance call: no
    # watcher); its rendezvous send reaches rank 1 after rank 1 revoked and fails, not hangs
    job = run_job(2, "fault_tolerance.py", "revoke-then-offer", timeout=30).check()
    results = job.json_lines()
    for rank in (0, 1):
        assert results[rank]["got"].startswith("RevokedError"), job.describe()


def test_agree_failed_and_ack_failed_after_a_death():
    job = run_job(4, "fault_tolerance.py", "agree", 2, launcher_args=CONTINUE, timeout=60).check()
    for rank, got in survivors(job, [0, 1, 3]).items():
        assert got["raised"] == ["LostPeerError", [2]], (rank, got)
        assert got["flag"] == 0b0111, (rank, got)   # the AND of 0b0111 (rank 0) and 0b1111 (1, 3): not 2's
        assert got["failed"] == [2] and got["acked"] == 1 and got["acked0"] == 1, (rank, got)


def test_failed_and_ack_failed_name_the_communicators_ranks():
    # world ranks 0 and 1 die; on a Split of the world in reverse order they are ranks 4 and 3
    job = run_job(5, "fault_tolerance.py", "failed-split", "0,1", launcher_args=CONTINUE, timeout=60).check()
    for rank, got in survivors(job, [2, 3, 4]).items():
        assert got == {"failed": [3, 4], "acked1": 1, "acked": 2, "acked9": 2}, (rank, got)


def test_without_a_failure_shrink_is_a_dup_and_misuse_is_named():
    job = run_job(3, "fault_tolerance.py", "misuse", launcher_args=CONTINUE, timeout=60).check()
    for rank, got in job.json_lines().items():
        assert got["shrunk"] == got["grown"] == [rank, 3] and got["flag"] == (6 & 5 & 4) and got["failed"] == [], got
        assert got["rejoin"].startswith("rejoin(): this process is not a replacement"), got
        for name in ("revoke", "shrink"):
            assert got[name] == f"{name}: communicator world.d1 was freed; create a new one with Dup() or Split()"


@pytest.mark.parametrize("respawn, replacement_dies, world", [
    (1, False, [0, 1, 4, 3]),      # the replacement (world rank 4) at the failed rank's number
    (2, True, [0, 1, 5, 3]),       # the first replacement dies as it starts: its own replacement joins
    (1, True, [0, 1, 3]),          # no replacement left: grow leaves the place out
])
def test_respawned_replacement_takes_the_failed_ranks_place(no_leftover_segments, respawn, replacement_dies, world):
    args = ("respawn", 2, 300) + (("dies",) if replacement_dies else ())
    job = run_job(4, "fault_tolerance.py", *args, launcher_args=("--respawn", respawn), timeout=60).check()
    results = survivors(job, sorted(world))
    for w, got in results.items():
        assert got["world"] == world and got["rank"] == world.index(w), (w, got)
        if w < 4:
            assert got["sizes"][-1] == len(world) and got["replaces"] is None, (w, got)
        else:  # a replacement: it started at the step the survivors had reached
            assert got["replaces"] == (2 if w == 4 else 4) and got["started"] == 300 and got["errors"] == [], got
    assert "gpurun: started rank 4 to replace rank 2" in job.stderr, job.describe()


def test_a_survivor_dying_during_shrink_or_grow_is_replaced_too(no_leftover_segments):
    # World rank 3 dies at a random moment of the recovery from rank 2's death (its shrink, its
    # grow, or the agreement on the step after it): each failed rank gets its replacement, in
    # the order gpurun saw them fail, and the world is back to 4 with exact sums.
    job = run_job(4, "fault_tolerance.py", "respawn", 2, 300, "and", 3, launcher_args=("--respawn", 2),
                  timeout=60).check()
    for w, got in survivors(job, [0, 1, 4, 5]).items():
        assert got["world"] == [0, 1, 4, 5] and got["rank"] == [0, 1, 4, 5].index(w), (w, got)
    assert "gpurun: started rank 5 to replace rank 3" in job.stderr, job.describe()


def test_a_replacement_without_the_job_secret_is_refused():
    job = run_job(2, "fault_tolerance.py", "impostor", launcher_args=CONTINUE, timeout=60).check()
    got = job.json_lines()
    assert got[1] == {"total": 2.0}, job.describe()
    assert got[0]["total"] == 2.0 and got[0]["code"] != 0 and not got[0]["joined"], job.describe()
    assert "secret" in got[0]["stderr"], got[0]["stderr"]


def test_without_gpuruns_store_the_calls_work_failure_free():
    # Under mpiexec (bootstrapped by MPI: no store) and alone, a revoked communicator still
    # shrinks (a duplicate) and agrees (the AND of every rank's flag).
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        unavailable("mpi4py", "Open MPI is not installed in this environment (pip install 'gpucoll[mpi]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCOLL_")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    script = os.path.join(SCRIPTS, "fault_tolerance.py")
    for argv, size in (([mpiexec, "--oversubscribe", "-n", "2"], 2), ([], 1)):
        proc = subprocess.run([*argv, sys.executable, script, "nostore"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert sorted(r["shrunk"][0] for r in results) == list(range(size)), proc.stdout
        for got in results:
            assert got["shrunk"][1] == size and got["total"] == size and got["revoked"] is True, got
            assert got["flag"] == (5 & 6 if size == 2 else 5), got


def test_every_rank_failing_still_fails_the_job(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import gpucoll\ngpucoll.COMM_WORLD.Barrier()\nraise SystemExit(3)\n")
    job = run_job(2, str(script), launcher_args=CONTINUE, timeout=60)
    assert job.returncode == 3, job.describe()
    assert "the job goes on without it" in job.stderr and "failed first" in job.stderr, job.describe()


def test_respawn_is_refused_across_hosts():
    # --on-failure=continue works across hosts (tests/test_multihost.py); replacements do not
    job = run_job(2, "fault_tolerance.py", "misuse", launcher_args=("--respawn", "1", "--hosts", "a:1,b:1"),
                  timeout=30)
    assert job.returncode == 2 and "--respawn runs on one host" in job.stderr, job.describe()


def test_an_agreement_is_the_first_offer_even_for_a_survivor_that_saw_less():
    # Survivor 0 sees rank 2's process gone and decides without it; survivor 1 does not see
    # that (another host, say) and has not heard from gpurun: its wait for rank 2 times out, it
    # finds the decision and must take it (failed {2}, the AND of 0's and 1's flags), not its
    # own view (nobody failed).
    import threading

    from gpucoll.bootstrap import failures
    from gpucoll.bootstrap.store import StoreClient
    from gpucoll.bootstrap.store_server import StoreServer

    secret = b"s" * 16
    with StoreServer("127.0.0.1", 0, secret).start() as srv:
        results = {}

        def survivor(rank, flag, sees_two_gone, delay):
            with StoreClient("127.0.0.1", srv.port, secret) as store:
                threading.Event().wait(delay)
                results[rank] = failures.agree(store, "t/1", [10, 11, 12], rank, flag,
                                               lambda w: sees_two_gone and w == 12, timeout=5.0)
        threads = [threading.Thread(target=survivor, args=(0, 0b110, True, 0.0)),
                   threading.Thread(target=survivor, args=(1, 0b011, False, 0.05))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert results == {0: (0b010, {2}), 1: (0b010, {2})}, results


def _with_store(run):
    from gpucoll.bootstrap.store import StoreClient
    from gpucoll.bootstrap.store_server import StoreServer

    secret = b"s" * 16
    with StoreServer("127.0.0.1", 0, secret).start() as srv:
        with StoreClient("127.0.0.1", srv.port, secret) as store:
            return run(store)


def test_an_agreement_counts_the_ranks_gpurun_recorded_as_failed():
    # No survivor sees rank 2's process end (another host, say): only gpurun's record of the
    # failure in the store lets the agreement end without rank 2, well inside its timeout.
    import threading
    import time

    from gpucoll.bootstrap import failures

    def agreement(store):
        store.set(failures.FAILED, json.dumps([12]).encode())
        results = {}

        def survivor(rank, flag):
            results[rank] = failures.agree(store, "t/2", [10, 11, 12], rank, flag, lambda w: False, timeout=20.0)
        started = time.monotonic()
        threads = [threading.Thread(target=survivor, args=(r, f)) for r, f in ((0, 0b110), (1, 0b011))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return results, time.monotonic() - started
    results, took = _with_store(agreement)
    assert results == {0: (0b010, {2}), 1: (0b010, {2})}, results
    assert took < 5, took


@pytest.mark.parametrize("key, value, shape", [
    ("failed", b"garbage", "a JSON list of world ranks"),
    ("failed", b"5", "a JSON list of world ranks"),
    ("failed", b'["2"]', "a JSON list of world ranks"),
    ("flag", b"abc", "an integer flag"),
    ("decision", b"[]", '{"value": int, "failed": [ranks]}'),
    ("decision", b'{"value": 1}', '{"value": int, "failed": [ranks]}'),
    ("replacement", b"{}", '{"world_rank": int} or {"none": why}'),
])
def test_a_malformed_fault_tolerance_record_is_named(key, value, shape):
    from gpucoll.base.errors import GpucollError
    from gpucoll.bootstrap import failures

    with pytest.raises(GpucollError) as info:
        failures.record(f"gpucoll/ft/{key}", value, key)
    assert f"at gpucoll/ft/{key}, which is not {shape}" in str(info.value)


def test_an_agreement_over_a_malformed_post_names_its_key():
    from gpucoll.base.errors import GpucollError
    from gpucoll.bootstrap import failures

    def agreement(store):
        store.set("gpucoll/ft/agree/t/3/f/1", b"\xff not a flag")
        with pytest.raises(GpucollError) as info:
            failures.agree(store, "t/3", [10, 11], 0, 1, lambda w: False, timeout=5.0)
        return str(info.value)
    assert "at gpucoll/ft/agree/t/3/f/1, which is not an integer flag" in _with_store(agreement)


@pytest.mark.parametrize("api", ["own", "mpi"])
def test_a_receive_from_any_source_fails_for_a_failed_rank_only(no_leftover_segments, api):
    # ULFM: rank 3 is killed, rank 4 ends well. A nonblocking receive from any rank fails for
    # rank 3 alone and stays posted (ERR_PROC_FAILED_PENDING) until acknowledged, then takes
    # rank 1's message; a blocking one (and a Probe) fails for rank 2, killed while it waits
    # (ERR_PROC_FAILED), and is taken back: rank 1's next message reaches the next receive.
    job = run_job(5, "any_source_failure.py", api, env={"GPUCOLL_TIMEOUT": "15"}, launcher_args=CONTINUE,
                  timeout=60).check()
    results = job.json_lines()
    assert list(results) == [0], job.describe()   # under --on-failure=continue a failing rank 0 still exits 0
    got = results[0]
    pending = "ERR_PROC_FAILED_PENDING" if api == "mpi" else [3]
    assert got["pending"][:2] == ["ProcFailedPendingError", pending], got
    assert got["pending_again"][:2] == got["pending"][:2], got
    assert got["failed"] == ([3] if api == "own" else 1) and got["acked"] == 1, got
    assert got["first"] == [1, True], got
    if api == "mpi":
        assert got["pending_general"][:2] == got["pending"][:2], got
        assert got["first_general"] == [1, True], got
    failed = "ERR_PROC_FAILED" if api == "mpi" else [2]
    assert got["blocking"][:2] == ["LostPeerError", failed], got
    if api == "mpi":
        assert got["probe"][:2] == got["iprobe"][:2] == ["LostPeerError", "ERR_PROC_FAILED"], got
        assert got["iprobe_acked"] is False, got
    assert got["acked_then"] == 2 and got["second"] == [1, True], got
    assert "rank 4 (pid" not in job.stderr, job.describe()   # it ended well: not reported as failed


@pytest.mark.parametrize("launcher_args", [(), CONTINUE])
def test_a_rank_that_ended_well_fails_no_receive_from_any_source(launcher_args):
    job = run_job(3, "any_source_failure.py", "mpi", "ended-well", env={"GPUCOLL_TIMEOUT": "15"},
                  launcher_args=launcher_args, timeout=60).check()
    assert job.json_lines() == {0: {"first": [1, True]}}, job.describe()
