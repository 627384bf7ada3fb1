"""Warmed start (launcher/warm.py): gpurun forks the ranks of a Python program from its own
interpreter, which has NumPy and gpucoll imported. A forked rank must not be told apart from
one started anew (`--no-preload`): each test runs the same job both ways and compares what the
program sees, how it ends, and what gpurun reports."""
import json
import os
import subprocess
import sys

import pytest

from test_launcher import GPURUN, SCRIPTS, python_c

STATE = os.path.join(SCRIPTS, "rank_state.py")
ENDINGS = os.path.join(SCRIPTS, "rank_endings.py")
# Each job has its own store, secret and id: these differ between any two jobs.
PER_JOB = {"GPUCOLL_STORE", "GPUCOLL_STORE_SECRET", "GPUCOLL_JOB_ID", "MASTER_PORT"}
FORKED = "ranks forked from this interpreter"


def run(*args, stdin_text="", cwd=None, env=None):
    """gpurun -v ARGS to the end: (returncode, stdout, stderr, gpurun's pid)."""
    proc = subprocess.Popen(GPURUN + ["-v", *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    out, err = proc.communicate(stdin_text, timeout=60)
    return proc.returncode, out, err, proc.pid


def states(*args, **kw):
    """{rank: state} of rank_state.py run through gpurun (forked unless args say --no-preload)."""
    code, out, err, pid = run(*args, **kw)
    assert code == 0, err
    found = {}
    for line in out.splitlines():
        tag, _, rest = line.partition(" ")
        if rest.startswith("STATE "):
            state = json.loads(rest[len("STATE "):])
            state["parent_is_gpurun"] = state.pop("parent", None) == pid
            for name in PER_JOB:
                state["environ"].pop(name)
            found[int(tag.strip("[]"))] = state
    return found, err


def both_ways(*args, **kw):
    """The states of the same job forked and started anew, after checking each was."""
    warm, warm_err = states(*args, **kw)
    plain, plain_err = states("--no-preload", *args, **kw)
    assert FORKED in warm_err and FORKED not in plain_err, (warm_err, plain_err)
    assert sorted(warm) == sorted(plain) == [0, 1]
    return warm, plain


def assert_alike(warm, plain):
    """Every observation alike but the random draws (each rank's own: the next test)."""
    for rank in plain:
        for state in (warm[rank], plain[rank]):
            del state["numpy_draw"], state["random_draw"]
        assert sorted(warm[rank]) == sorted(plain[rank])
        for key in plain[rank]:
            assert warm[rank][key] == plain[rank][key], (rank, key, warm[rank][key], plain[rank][key])


@pytest.mark.parametrize("how", ["script", "module"])
def test_forked_rank_sees_what_a_new_one_sees(how):
    # argv, sys.path, __main__, cwd, environment, stdio (rank 0 reads gpurun's stdin), its own
    # session, the parent-death signal, the CPU binding, signal handlers and mask, open fds.
    if how == "script":
        args, cwd = [STATE, "x", "--flag"], None
    else:
        args, cwd = ["-m", "rank_state", "x", "--flag"], SCRIPTS
    warm, plain = both_ways("--bind-to", "core", "-np", 2, *args, stdin_text="typed at\r\ngpurun\n", cwd=cwd)
    assert_alike(warm, plain)
    for rank, state in warm.items():
        assert state["argv"][1:] == ["x", "--flag"] and state["main"]["name"] == "__main__"
        assert state["stdin_text"] == ("typed at\r\ngpurun\n" if rank == 0 else "")  # no newline translation
        assert state["stdout"]["name"] == "<stdout>"
        assert state["session_leader"] and state["parent_is_gpurun"] and state["pdeathsig"] == 9
        assert state["fds"] == [0, 1, 2] and state["blocked"] == []
        assert state["signals"]["SIGINT"] == "default_int_handler" and state["signals"]["SIGCHLD"] == "SIG_DFL"
        assert state["environ"]["GPUCOLL_RANK"] == str(rank)
    assert warm[0]["affinity"] != warm[1]["affinity"] or len(os.sched_getaffinity(0)) == 1


@pytest.mark.parametrize("preload", [(), ("--preload", "numpy.random")])
def test_forked_ranks_draw_their_own_random_numbers(preload):
    # NumPy's global generator, once numpy.random is imported in gpurun, was seeded there: every
    # forked rank reseeds it, as its own import would; Python's `random` reseeds at the fork.
    warm, _ = states(*preload, "-np", 2, STATE)
    assert warm[0]["numpy_draw"] != warm[1]["numpy_draw"]
    assert warm[0]["random_draw"] != warm[1]["random_draw"]


def test_forked_rank_has_the_blas_pool_its_own_import_would_make():
    # gpurun imports NumPy with a pool of one thread; each forked rank sizes it as its own
    # import would (by OMP_NUM_THREADS here), so a rank runs the same threads both ways.
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs: a pool of 2 threads")
    counts = {}
    for threads in ("1", "2"):
        args = ("-x", f"OMP_NUM_THREADS={threads}", "--bind-to", "none", "-np", 2, STATE)
        warm, plain = states(*args)[0], states("--no-preload", *args)[0]
        assert [warm[r]["threads"] for r in (0, 1)] == [plain[r]["threads"] for r in (0, 1)], threads
        counts[threads] = warm[0]["threads"]
    assert counts["2"] == counts["1"] + 1, counts  # one more BLAS worker


def test_python_c_is_forked_like_python_is_run():
    code = ("import sys, json, __main__; print('STATE ' + json.dumps({'argv': sys.argv, 'path0': sys.path[0], "
            "'main': sorted(vars(__main__)), 'loader': __main__.__loader__.__name__}))")
    outs = []
    for extra in ((), ("--no-preload",)):
        rc, out, err, _ = run(*extra, "-np", 1, *python_c(code), "a", "b")
        assert rc == 0, err
        outs.append(out)
        assert (FORKED in err) == (not extra), err
    assert outs[0] == outs[1]
    assert json.loads(outs[0].split("STATE ", 1)[1])["argv"] == ["-c", "a", "b"]


@pytest.mark.parametrize("mode", ["exit-message", "exit-code", "raise", "interrupt", "at-exit", "stdout-closed",
                                  "hook-fails", "file-left-open", "lazy-proxy"])
def test_forked_rank_ends_as_a_new_one_does(mode, tmp_path):
    # The exit status, the traceback (starting at the program's own line, no frame of gpurun's),
    # sys.exit's message, the end by SIGINT, threads joined before atexit, buffers flushed.
    left_open = [tmp_path / "warm.txt", tmp_path / "plain.txt"]
    extra = lambda i: [left_open[i]] if mode == "file-left-open" else []  # noqa: E731
    warm = run("-np", 1, ENDINGS, mode, *extra(0))
    plain = run("--no-preload", "-np", 1, ENDINGS, mode, *extra(1))
    assert FORKED in warm[2]
    assert warm[0] == plain[0] and warm[1] == plain[1]
    strip = lambda err: [l for l in err.splitlines() if "pid" not in l and "forked" not in l and "--no-preload" not in l]  # noqa: E731
    assert strip(warm[2]) == strip(plain[2])
    expected = {"exit-message": 1, "exit-code": 3, "raise": 1, "interrupt": 130, "at-exit": 0, "stdout-closed": 0,
                "hook-fails": 1, "file-left-open": 0, "lazy-proxy": 0}[mode]
    assert warm[0] == expected, warm
    if mode == "raise":
        assert f'Traceback (most recent call last):\n[0]   File "{ENDINGS}", line' in warm[2]
    if mode == "at-exit":
        assert warm[1].splitlines() == ["[0] buffered line", "[0] thread done", "[0] atexit ran"]
    if mode == "hook-fails":
        assert "Original exception was:" in warm[2] and "raised by the program" in warm[2]
    if mode == "file-left-open":
        assert [p.read_text() for p in left_open] == ["kept", "kept"]


def test_a_preload_that_cannot_be_imported_stops_the_job_before_any_rank():
    rc, out, err, _ = run("--preload", "json,no_such_module_here", "-np", 2, STATE)
    assert rc == 1 and out == ""
    assert "gpurun: --preload no_such_module_here: cannot import it (ModuleNotFoundError" in err, err


def test_a_preload_that_starts_a_thread_makes_ranks_start_anew():
    env = dict(os.environ, PYTHONPATH=SCRIPTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rc, out, err, _ = run("--preload", "starts_thread", "-np", 2, STATE, env=env)
    assert rc == 0, err
    assert "ranks start as new processes: importing starts_thread started 1 thread(s)" in err, err
    assert FORKED not in err and out.count("STATE ") == 2


def test_a_preload_is_imported_once_before_the_fork():
    rc, out, err, _ = run("--preload", "json, decimal", "-np", 2, *python_c(
        "import sys; print('decimal' in sys.modules)"))
    assert rc == 0, err
    assert "with numpy, gpucoll" in err and "decimal imported" in err, err
    assert sorted(out.split()) == ["True", "True", "[0]", "[1]"]


def test_ranks_start_anew_when_their_environment_changes_what_python_reads_at_start():
    rc, out, err, _ = run("-x", "PYTHONHASHSEED=7", "-np", 1, *python_c("print(hash('x') == hash('x'))"))
    assert rc == 0, err
    assert "ranks start as new processes: the ranks' PYTHONHASHSEED differs from gpurun's" in err, err


def test_a_program_that_is_not_this_python_is_executed():
    rc, out, err, _ = run("-np", 2, "echo", "hi")
    assert rc == 0 and sorted(out.splitlines()) == ["[0] hi", "[1] hi"]
    assert FORKED not in err


def test_preload_options_exclude_each_other():
    rc, _, err, _ = run("--preload", "json", "--no-preload", "-np", 1, STATE)
    assert rc == 2 and "--preload and --no-preload exclude each other" in err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("nprocs", [4, 32, 256])
def test_joining_costs_each_rank_the_same_few_store_requests(nprocs):
    # COMM_WORLD's set-up: the size check and two all-gathers of a set and a gather each,
    # whatever the number of ranks; no rank reads the others' keys one by one.
    env = dict(os.environ, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="BOOTSTRAP")
    rc, out, err, _ = run("-np", nprocs, *python_c("import gpucoll; gpucoll.COMM_WORLD.Barrier()"), env=env)
    assert rc == 0, err[-3000:]
    counts = [int(line.rsplit(" after ", 1)[1].split()[0]) for line in out.splitlines() + err.splitlines()
              if "COMM_WORLD ready in" in line]
    assert len(counts) == nprocs, (out + err)[-3000:]
    assert set(counts) == {5}, sorted(set(counts))


def test_a_forked_rank_may_fork_and_start_threads_itself():
    code = ("import os, sys, threading, gpucoll\n"
            "c = gpucoll.COMM_WORLD\n"
            "t = threading.Thread(target=lambda: print('thread', c.rank, flush=True)); t.start(); t.join()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    print('child of', c.rank, flush=True); os._exit(3)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "c.Barrier()\n"
            "print('child exit', os.waitstatus_to_exitcode(status), flush=True)\n")
    rc, out, err, _ = run("-np", 2, *python_c(code))
    assert rc == 0 and FORKED in err, err
    lines = sorted(line.split(" ", 1)[1] for line in out.splitlines())
    assert lines == ["child exit 3", "child exit 3", "child of 0", "child of 1", "thread 0", "thread 1"], out
