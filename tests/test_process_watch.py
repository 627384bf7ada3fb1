"""gpucoll/transports/process_watch.py, on real processes: the callback that releases a GPU team's
kernels when a peer dies (tests/test_gpu_fault_tolerance.py shows the release itself on a GPU)."""
import subprocess
import sys
import textwrap
import threading
import time

from gpucoll.transports import process_watch


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_death_is_reported_within_a_second_and_once():
    proc, other = _sleeper(), _sleeper()
    seen, event = [], threading.Event()
    token = process_watch.watch([proc.pid, other.pid], lambda pid: (seen.append(pid), event.set()))
    try:
        time.sleep(0.1)
        assert seen == []                      # nothing while both live
        start = time.monotonic()
        proc.kill()                            # not reaped: a zombie counts as ended
        assert event.wait(5), "no callback for a killed process"
        assert time.monotonic() - start < 1.0
        time.sleep(0.1)
        assert seen == [proc.pid]              # once, and only for the process that ended
    finally:
        process_watch.unwatch(token)
        for p in (proc, other):
            p.kill()
            p.wait()


def test_a_process_already_gone_is_reported_at_once_and_unwatch_stops_callbacks():
    gone = _sleeper()
    gone.kill()
    gone.wait()
    seen = []
    process_watch.unwatch(process_watch.watch([gone.pid], seen.append))
    assert seen == [gone.pid]
    proc = _sleeper()
    later = []
    token = process_watch.watch([proc.pid], later.append)
    process_watch.unwatch(token)
    proc.kill()
    proc.wait()
    time.sleep(0.2)
    assert later == []


def test_without_pidfds_the_pids_are_polled():
    # A kernel older than 5.3 has no pidfd_open: the watcher looks at the pids every POLL_S.
    code = textwrap.dedent("""
        import os, subprocess, sys, threading, time
        del os.pidfd_open
        from gpucoll.transports import process_watch
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        event = threading.Event()
        process_watch.watch([proc.pid], lambda pid: event.set())
        time.sleep(0.1)
        assert not event.is_set()
        proc.kill()
        assert event.wait(5)
        print("polled")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "polled", out.stderr
