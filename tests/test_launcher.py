"""gpurun, tested as users run it: real gpurun processes, real ranks, no mocks."""
import os
import re
import resource
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
BEHAVE = os.path.join(SCRIPTS, "rank_behaviour.py")
# The installed console script when there is one (it is what users run), else the same code.
_SCRIPT = os.path.join(os.path.dirname(sys.executable), "gpurun")
GPURUN = [_SCRIPT] if os.access(_SCRIPT, os.X_OK) else [sys.executable, "-m", "gpucoll.launcher"]


def gpurun(*args, timeout=20, **kw):
    """Run gpurun to the end; returns the CompletedProcess (text) and the seconds it took."""
    start = time.monotonic()
    proc = subprocess.run(GPURUN + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, **kw)
    return proc, time.monotonic() - start


def python_c(code):
    """Arguments that run `code` in each rank with this interpreter."""
    return [sys.executable, "-c", code]


def gone(pid):
    """True if the process no longer exists (a zombie nobody reaps counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def job_pids(piddir, size):
    """Every pid the ranks wrote: each rank's own and its `sleep` child's."""
    pids = []
    for r in range(size):
        with open(os.path.join(piddir, f"rank.{r}")) as f:
            pids += [int(p) for p in f.read().split()]
    return pids


def wait_for_pids(piddir, size, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(piddir, f"rank.{r}")) for r in range(size)):
            return job_pids(piddir, size)
        time.sleep(0.02)
    raise AssertionError("the ranks did not all start")


def assert_all_gone(pids):
    left = [p for p in pids if not gone(p)]
    assert not left, f"processes of the job left behind: {left}"


# --- environment, arguments, programs -------------------------------------------------
def test_environment_of_four_ranks():
    code = ("import os; keys = 'GPUCOLL_RANK GPUCOLL_SIZE GPUCOLL_LOCAL_RANK GPUCOLL_LOCAL_SIZE "
            "GPUCOLL_STORE GPUCOLL_STORE_SECRET GPUCOLL_JOB_ID RANK WORLD_SIZE LOCAL_RANK "
            "LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT PYTHONUNBUFFERED'.split(); "
            "print(' '.join(k + '=' + os.environ.get(k, '<unset>') for k in keys))")
    proc, _ = gpurun("-np", 4, *python_c(code))
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        tag, rest = line.split(" ", 1)
        rows[int(tag.strip("[]"))] = dict(kv.split("=", 1) for kv in rest.split())
    assert sorted(rows) == [0, 1, 2, 3]
    stores = {env["GPUCOLL_STORE"] for env in rows.values()}
    secrets = {env["GPUCOLL_STORE_SECRET"] for env in rows.values()}
    jobs = {env["GPUCOLL_JOB_ID"] for env in rows.values()}
    assert len(stores) == len(secrets) == len(jobs) == 1
    host, port = stores.pop().rsplit(":", 1)
    assert int(port) > 0
    assert re.fullmatch(r"[0-9a-f]{32}", secrets.pop())
    for r, env in rows.items():
        assert env["GPUCOLL_RANK"] == env["RANK"] == env["GPUCOLL_LOCAL_RANK"] == env["LOCAL_RANK"] == str(r)
        assert env["GPUCOLL_SIZE"] == env["WORLD_SIZE"] == env["GPUCOLL_LOCAL_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "4"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (host, port)
        assert env["PYTHONUNBUFFERED"] == "1"


def test_store_is_served_by_gpurun():
    # A rank can reach the store at GPUCOLL_STORE, even after rank 0 is gone.
    code = ("import os, socket, time; r = int(os.environ['RANK']); "
            "host, port = os.environ['GPUCOLL_STORE'].rsplit(':', 1); "
            "time.sleep(0.3 * r); socket.create_connection((host, int(port)), timeout=2).close(); "
            "print('connected')")
    proc, _ = gpurun("-np", 2, *python_c(code))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] connected", "[1] connected"]


def test_start_up_loads_only_what_it_uses():
    """Start-up time is mostly imports: a rank started anew (as srun and mpiexec start them) that
    joins the job does not load the store's server (asyncio), and gpurun's sweep of
    shared-memory names at the end does not load NumPy."""
    code = ("import sys, gpucoll; gpucoll.COMM_WORLD.Barrier(); "
            "print(sorted(m for m in ('asyncio', 'gpucoll.bootstrap.store_server') if m in sys.modules))")
    proc, _ = gpurun("--no-preload", "-np", 2, *python_c(code))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] []", "[1] []"], proc.stdout
    sweep = ("import sys; from gpucoll.launcher.job import remove_shared_memory; remove_shared_memory('j', '00' * 16); "
             "print('numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", sweep], capture_output=True, text=True, timeout=20)
    assert done.stdout.strip() == "False", done.stderr


def test_export_sets_and_passes_variables():
    env = dict(os.environ, FROM_LAUNCHER="launcher-value")
    env.pop("NOT_SET_ANYWHERE", None)
    code = "import os; print(os.environ['A'], os.environ['FROM_LAUNCHER'], os.environ.get('NOT_SET_ANYWHERE'))"
    proc, _ = gpurun("-np", 2, "-x", "A=1=2", "-x", "FROM_LAUNCHER", "-x", "NOT_SET_ANYWHERE",
                     *python_c(code), env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] 1=2 launcher-value None",
                                                "[1] 1=2 launcher-value None"]
    assert "NOT_SET_ANYWHERE" in proc.stderr


def test_stdin_goes_to_rank_0_only():
    code = "import sys; print(repr(sys.stdin.read()))"
    proc, _ = gpurun("-np", 3, *python_c(code), input="line one\nline two\n")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] 'line one\\nline two\\n'", "[1] ''", "[2] ''"]


def test_module_with_its_own_arguments():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SCRIPTS, os.environ.get("PYTHONPATH")])))
    proc, _ = gpurun("-np", 2, "-m", "hello_module", "--np", "7", "-x", "y", env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] hello from rank 0 of 2, args ['--np', '7', '-x', 'y']",
                                                "[1] hello from rank 1 of 2, args ['--np', '7', '-x', 'y']"]


def test_python_script_and_plain_executable():
    script = os.path.join(SCRIPTS, "hello_module.py")
    proc, _ = gpurun("-np", 2, script, "a")
    assert proc.returncode == 0, proc.stderr
    assert "[1] hello from rank 1 of 2, args ['a']" in proc.stdout.splitlines()
    proc, _ = gpurun("-np", 2, "echo", "hi", "--flag")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] hi --flag", "[1] hi --flag"]


def test_missing_program():
    proc, _ = gpurun("-np", 2, "no-such-program-anywhere")
    assert proc.returncode == 127
    assert "command not found: no-such-program-anywhere" in proc.stderr
    proc, _ = gpurun("-np", 2)
    assert proc.returncode == 2


# --- output ---------------------------------------------------------------------------
LINES_CODE = """
import os, sys
r = int(os.environ['RANK'])
for i in range(200):
    body = f'rank={r} i={i} ' + str(r) * (300 + 37 * i)
    print(body)
    print('err ' + body, file=sys.stderr)
print(f'rank={r} tail', end='')
"""


def check_lines(text, tagged, prefix=""):
    seen = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(?:\[(\d)\] )?" + prefix + r"rank=(\d) (i=(\d+) (\d+)|tail)", line)
        assert m, f"mixed or broken line: {line[:120]!r}"
        tag, r = m.group(1), int(m.group(2))
        assert (tag is not None) == tagged
        if tagged:
            assert int(tag) == r
        if m.group(4) is not None:
            i = int(m.group(4))
            assert m.group(5) == str(r) * (300 + 37 * i)
            assert seen.get(r, -1) == i - 1, "lines of one rank out of order"
            seen[r] = i
        else:
            seen[r] = "tail"
    return seen


def test_tagged_output_keeps_whole_lines():
    proc, _ = gpurun("-np", 4, *python_c(LINES_CODE))
    assert proc.returncode == 0, proc.stderr
    assert check_lines(proc.stdout, tagged=True) == {r: "tail" for r in range(4)}
    err_seen = check_lines(proc.stderr, tagged=True, prefix="err ")
    assert err_seen == {r: 199 for r in range(4)}


def test_very_long_lines_stay_whole():
    # Lines much longer than one pipe read (64 KiB) arrive in pieces and must be joined.
    code = ("import os, sys; r = os.environ['RANK']; "
            "[sys.stdout.write(f'{r}:{k}:' + chr(97 + k) * 300000 + chr(10)) for k in range(3)]")
    proc, _ = gpurun("-np", 3, *python_c(code))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 9
    for line in lines:
        m = re.fullmatch(r"\[(\d)\] (\d):(\d):([a-c]+)", line)
        assert m and m.group(1) == m.group(2), line[:80]
        assert m.group(4) == chr(97 + int(m.group(3))) * 300000


def test_no_tag_output():
    proc, _ = gpurun("-np", 2, "--no-tag-output", *python_c(LINES_CODE))
    assert proc.returncode == 0, proc.stderr
    assert check_lines(proc.stdout, tagged=False) == {0: "tail", 1: "tail"}


def test_output_dir(tmp_path):
    code = "import os, sys; r = os.environ['RANK']; print('out', r); print('err', r, file=sys.stderr, end='')"
    proc, _ = gpurun("-np", 2, "--output-dir", tmp_path / "logs", *python_c(code))
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        assert (tmp_path / "logs" / f"rank.{r}.out").read_text() == f"out {r}\n"
        assert (tmp_path / "logs" / f"rank.{r}.err").read_text() == f"err {r}"
    assert f"[1] err 1\n" in proc.stderr


# --- failures -------------------------------------------------------------------------
def run_failing(tmp_path, mode, size=4, fail_rank=2):
    proc, took = gpurun("-np", size, BEHAVE, mode, tmp_path, fail_rank)
    assert took < 5, f"the job took {took:.1f} s to end"
    assert_all_gone(job_pids(tmp_path, size))
    return proc


def test_rank_that_raises_ends_the_job(tmp_path):
    proc = run_failing(tmp_path, "raise")
    assert proc.returncode == 1
    assert "rank 2 (host" in proc.stderr and "failed first: exit code 1" in proc.stderr
    report = proc.stderr[proc.stderr.index("gpurun: rank 2"):]
    assert "    RuntimeError: rank 2 fails on purpose" in report
    assert "Traceback (most recent call last):" in report
    assert "stopped 3 other rank(s): 0, 1, 3" in report


def test_rank_that_exits_3(tmp_path):
    proc = run_failing(tmp_path, "exit3", fail_rank=0)
    assert proc.returncode == 3
    assert "gpurun: rank 0 (host" in proc.stderr and "failed first: exit code 3" in proc.stderr


def test_rank_killed_by_sigkill(tmp_path):
    proc = run_failing(tmp_path, "sigkill", size=2, fail_rank=1)
    assert proc.returncode == 128 + 9
    assert "gpurun: rank 1 (host" in proc.stderr
    assert "failed first: signal SIGKILL (9)" in proc.stderr


def test_leftover_children_are_ended_after_a_clean_exit(tmp_path):
    proc, took = gpurun("-np", 2, BEHAVE, "leave", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert took < 5
    assert_all_gone(job_pids(tmp_path, 2))


def test_timeout_names_ranks_still_running_and_ends_them(tmp_path):
    # Each rank starts a `sleep` child and records both pids; rank 1 exits at once, leaving its child.
    code = ("import os, subprocess, sys, time; r = int(os.environ['RANK']); c = subprocess.Popen(['sleep', '100']); "
            "p = os.path.join(sys.argv[1], f'rank.{r}'); open(p + '.tmp', 'w').write(f'{os.getpid()} {c.pid}'); "
            "os.rename(p + '.tmp', p); time.sleep(0 if r == 1 else 30)")
    proc, took = gpurun("-np", 3, "--timeout", 2, *python_c(code), tmp_path)
    assert proc.returncode == 124, proc.stderr
    assert took < 6
    assert "ranks still running: 0, 2" in proc.stderr
    assert_all_gone(job_pids(tmp_path, 3))


@pytest.mark.parametrize("preload", [True, False])
def test_timeout_shows_where_each_rank_still_running_was(tmp_path, preload):
    # Rank 1 never reaches the all-reduce that rank 0 waits in; a third rank, not Python, sleeps.
    # Each Python rank's stack names the line it hangs at; the sleeping executable ends by the
    # request (no handler) without counting as a failure: the job still ends as a timeout.
    script = tmp_path / "hang.py"
    script.write_text("import time, numpy as np, gpucoll\n"
                      "comm = gpucoll.COMM_WORLD\n"
                      "if comm.rank == 1:\n"
                      "    time.sleep(60)  # rank 1 hangs here\n"
                      "comm.Allreduce(gpucoll.IN_PLACE, np.ones(4))  # rank 0 waits here\n")
    args = ("-np", 2, "--timeout", 3) + (() if preload else ("--no-preload",))
    proc, took = gpurun(*args, sys.executable, script)
    assert proc.returncode == 124, proc.stderr
    assert "the stacks of the ranks still running (0, 1) follow" in proc.stderr, proc.stderr
    assert f'[0]   File "{script}", line 5 in <module>' in proc.stderr, proc.stderr
    assert f'[1]   File "{script}", line 4 in <module>' in proc.stderr, proc.stderr
    assert "ranks still running: 0, 1" in proc.stderr and took < 8, proc.stderr
    plain = gpurun("-np", 1, "--timeout", 1, "sleep", 30)[0]
    assert plain.returncode == 124 and "ranks still running: 0" in plain.stderr, plain.stderr
    if preload:  # a gpurun that is a rank of another passes the request on to its own ranks
        nested, _ = gpurun("-np", 1, "--timeout", 3, *GPURUN, "-np", 2, sys.executable, script)
        assert nested.returncode == 124, nested.stderr
        assert f'[0] [1]   File "{script}", line 4 in <module>' in nested.stderr, nested.stderr


# --- signals --------------------------------------------------------------------------
def start_gpurun(*args):
    return subprocess.Popen(GPURUN + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_sigint_sigterm_and_sighup_end_every_rank(tmp_path, sig):
    proc = start_gpurun("-np", 3, BEHAVE, "wait", tmp_path)
    try:
        pids = wait_for_pids(tmp_path, 3)
        start = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert time.monotonic() - start < 5
    assert proc.returncode == 128 + sig, err
    assert f"got {sig.name}" in err
    assert_all_gone(pids)


def test_rank_that_ignores_sigterm_is_killed_after_grace():
    code = ("import os, signal, time; r = int(os.environ['RANK']); "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready'); "
            "time.sleep(0.5) if r == 0 else None; os._exit(5) if r == 0 else time.sleep(30)")
    proc, took = gpurun("-np", 2, "--grace", 0.5, *python_c(code))
    assert proc.returncode == 5
    assert took < 3
    assert "failed first: exit code 5" in proc.stderr


def test_a_second_signal_kills_at_once():
    # The ranks ignore SIGTERM and --grace is long: only the second signal can end them soon.
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)")
    proc = start_gpurun("-np", 2, "--grace", 60, *python_c(code))
    try:
        assert proc.stdout.readline().endswith("ready\n")
        assert proc.stdout.readline().endswith("ready\n")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "gpurun ended before the grace period was over"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert time.monotonic() - start < 3
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "got SIGTERM" in err


SPIN = ("import os, sys; d = sys.argv[1]; "
        "open(os.path.join(d, '.pid.' + os.environ['RANK']), 'w').write(str(os.getpid())); "
        "os.rename(os.path.join(d, '.pid.' + os.environ['RANK']), os.path.join(d, 'pid.' + os.environ['RANK']))\n"
        "while True: pass")


def test_ranks_die_with_a_killed_gpurun(tmp_path):
    # SIGKILL leaves gpurun no chance to stop anything: the kernel ends the ranks
    # (their parent-death signal), busy as they are.
    proc = start_gpurun("-np", 2, sys.executable, "-c", SPIN, tmp_path)
    try:
        deadline = time.monotonic() + 20
        while len(list(tmp_path.glob("pid.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
        assert len(pids) == 2, "the ranks did not start"
        proc.kill()
        proc.wait(timeout=5)
        deadline = time.monotonic() + 3
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.kill()
    left = [p for p in pids if not gone(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"ranks still running 3 s after gpurun was killed: {left}"


def test_ranks_start_while_gpurun_has_one_thread():
    # The parent-death signal is set by code that runs in the child between fork and exec,
    # which is only safe when the parent has one thread: the store's thread starts later.
    code = """
import sys, threading
from gpucoll.launcher import job, cli
seen, start_rank = [], job.start_rank
def counting(*args, **kw):
    seen.append(threading.active_count())
    return start_rank(*args, **kw)
job.start_rank = counting
try:
    cli.main(["-np", "3", "true"])
except SystemExit as exc:
    print(exc.code, seen)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.stdout.split("\n")[-2] == "0 [1, 1, 1]", proc.stdout + proc.stderr


def test_sigusr1_is_forwarded(tmp_path):
    proc = start_gpurun("-np", 2, BEHAVE, "usr1", tmp_path)
    try:
        pids = wait_for_pids(tmp_path, 2)
        time.sleep(0.1)  # let every rank print "ready" (its handler is in place before)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "[0] rank 0 got SIGUSR1" in out and "[1] rank 1 got SIGUSR1" in out
    assert_all_gone(pids)


# --- the store under a flood of strangers ---------------------------------------------
def test_flood_of_idle_connections_to_the_store(tmp_path):
    # Rank 0 opens 3000 connections to gpurun's store that never authenticate (gpurun with
    # the usual 1024 descriptors), then the ranks join: quickly, and gpurun's stderr holds
    # a summary line or two, not a traceback per connection.
    count = 3000
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < count + 100:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below the {count + 100} descriptors the flood needs")

    def cramped():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    proc, took = gpurun("-np", 2, os.path.join(SCRIPTS, "store_flood.py"), count, timeout=60, preexec_fn=cramped)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"[0] opened {count}" in proc.stdout
    joined = [float(t) for t in re.findall(r"joined in ([\d.]+) s", proc.stdout)]
    assert len(joined) == 2 and max(joined) < 8, proc.stdout
    assert "Traceback" not in proc.stderr and "Invalid file descriptor" not in proc.stderr, proc.stderr[:3000]
    own = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
    assert 1 <= len(own) <= 3, proc.stderr[:3000]
    for line in own:
        assert re.search(r"gpucoll WARN \[BOOTSTRAP\] store 127\.0\.0\.1:\d+ turned away \d+ connection\(s\) "
                         r"that had not authenticated: \d+ over the limit of 256 waiting to authenticate", line), line


def test_each_rank_gets_its_share_of_threads():
    # OMP_NUM_THREADS: the CPUs each rank may use (1 for one CPU each), unless gpurun's own
    # environment sets it; -x wins over both. OpenMP and OpenBLAS size their pools by it.
    code = "import os; print(os.environ.get('OMP_NUM_THREADS'))"
    cpus = len(os.sched_getaffinity(0))
    cases = [(("--bind-to", "none", "-np", 1), {}, str(cpus)),
             (("--bind-to", "core", "-np", 2), {}, "1"),
             (("--bind-to", "none", "-np", 2 * cpus), {}, "1"),
             (("-np", 2), {"OMP_NUM_THREADS": "3"}, "3"),
             (("-x", "OMP_NUM_THREADS=5", "-np", 2), {"OMP_NUM_THREADS": "3"}, "5")]
    for args, extra, want in cases:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        proc, _ = gpurun(*args, *python_c(code), env=dict(env, **extra))
        assert proc.returncode == 0, proc.stderr
        got = {line.split()[-1] for line in proc.stdout.splitlines()}
        assert got == {want}, (args, extra, proc.stdout)
