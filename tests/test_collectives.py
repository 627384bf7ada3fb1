"""Every collective, as users run them: real `gpurun` jobs, results checked against NumPy.

One job per rank count runs hundreds of cases (tests/scripts/coll_cases.py loops over a JSON
list) on several communicators of the same ranks, one per algorithm path:

    auto    what the cost model picks (on one host: mostly `direct`, the shared-memory segment)
    direct  GPUCOLL_ALGO=direct: the shared-memory segment for every collective that has it
    ring / tree / rhd / rd   GPUCOLL_ALGO forced (schedules over shared-memory channels; where the
            algorithm does not exist for a collective, the cost model picks, as documented)
    tcp     GPUCOLL_SHM_DISABLE=1 (schedules over TCP channels)

The variables are set while each communicator is made (the dispatcher reads them then), and
one more job sets them from gpurun's command line, as users do. Integer results equal NumPy's
exactly; floats are within the bound documented in coll_cases.py and bitwise identical on
every rank. Cases cover int8, int32, int64, uint16, float16, float32, float64 and bfloat16
(as [uint16 storage, Datatype('bfloat16')]), every op that applies, counts 0, 1, 7, counts not
divisible by the rank count, and a few of 3M elements that cross slots and channel buffers,
with and without IN_PLACE.
"""
import itertools
import json
import random
import re

import pytest

INTS = ("int8", "int32", "int64", "uint16")
FLOATS = ("float16", "float32", "float64", "bfloat16")
INT_OPS = ("SUM", "PROD", "MAX", "MIN", "AVG", "BAND", "BOR", "BXOR")
FLOAT_OPS = ("SUM", "PROD", "MAX", "MIN", "AVG")
REDUCING = ("allreduce", "reduce", "reduce_scatter")
MOVING = ("bcast", "allgather", "alltoall", "gather", "scatter")
IN_PLACE_OK = ("allreduce", "reduce", "reduce_scatter", "allgather", "alltoall", "gather", "scatter")
PATHS = {
    "auto": {},
    "direct": {"GPUCOLL_ALGO": "direct"},
    "ring": {"GPUCOLL_ALGO": "ring"},
    "tree": {"GPUCOLL_ALGO": "tree"},
    "rhd": {"GPUCOLL_ALGO": "rhd"},
    "rd": {"GPUCOLL_ALGO": "rd"},
    "tcp": {"GPUCOLL_SHM_DISABLE": "1"},
}
LARGE = 3_000_000


def ops_of(dtype):
    return INT_OPS if dtype in INTS else FLOAT_OPS


def build_cases(size, seed, large=False):
    """The case list of one job: every (collective, dtype, op) pair, counts and IN_PLACE
    varied in rotation so each appears with each collective, plus p2p and barriers."""
    rng = random.Random(seed)
    odd = 2 * size + 1 if size > 1 else 5  # not divisible by the rank count
    counts = [0, 1, 7, odd, 1000]
    cases = []

    def add(coll, dtype, op=None, count=7, inplace=False, root=0):
        cases.append({"coll": coll, "dtype": dtype, "op": op, "count": count, "inplace": inplace,
                      "root": root, "seed": rng.randrange(1 << 30)})

    # Every dtype x every op for each reducing collective, count and IN_PLACE in rotation.
    turn = itertools.count()
    for coll in REDUCING:
        for dtype in INTS + FLOATS:
            for op in ops_of(dtype):
                t = next(turn)
                add(coll, dtype, op, counts[t % len(counts)], inplace=bool(t % 3 == 1), root=t % max(size, 1))
    # Data movement: every dtype x every count, IN_PLACE and roots in rotation.
    for coll in MOVING:
        for dtype, count in itertools.product(INTS + FLOATS, counts):
            t = next(turn)
            add(coll, dtype, None, count, inplace=coll in IN_PLACE_OK and t % 2 == 0, root=t % size)
    for dtype, count in itertools.product(("int32", "float16", "bfloat16"), (0, 1, 1000)):
        add("sendrecv", dtype, None, count)
        add("sendrecv_blocking", dtype, None, count)
    for _ in range(3):
        add("barrier", "int8")
    if large:
        add("allreduce", "float32", "SUM", LARGE)
        add("allreduce", "int64", "BXOR", LARGE, inplace=True)
        add("reduce_scatter", "int32", "SUM", LARGE // size)
        add("allgather", "float64", None, LARGE // size, inplace=True)
        add("bcast", "bfloat16", None, LARGE, root=size - 1)
        add("reduce", "float16", "MAX", LARGE, root=1 % size)
        add("alltoall", "int8", None, LARGE // size)
    return cases


def run_cases(gpurun_job, tmp_path, size, paths, cases, env=None, timeout=120):
    spec = {"paths": [{"name": name, "env": PATHS.get(name, {})} for name in paths], "cases": cases}
    path = tmp_path / f"cases-{size}.json"
    path.write_text(json.dumps(spec))
    job = gpurun_job(size, "coll_cases.py", path, env={"GPUCOLL_TIMEOUT": 30, **(env or {})}, timeout=timeout)
    job.check()
    result = job.json_lines()[0]
    assert result["size"] == size
    assert sorted(result["paths"]) == sorted(paths), job.describe()
    failures = result["failures"]
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:40])
    for name, counts in result["paths"].items():
        assert counts["cases"] == len(cases), name
    return job, result


def used(job, name):
    line = [l for l in job.lines(0) if l.startswith(f"PATH {name} ")]
    assert line, job.describe()
    return line[0]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_every_collective_dtype_op_and_path(gpurun_job, tmp_path, size):
    cases = build_cases(size, seed=size, large=size == 4)
    job, _ = run_cases(gpurun_job, tmp_path, size, list(PATHS), cases, timeout=240)
    if size > 1:
        assert "available=['direct']" in used(job, "auto") and "forced=auto" in used(job, "auto")
        for forced in ("direct", "ring", "tree", "rhd", "rd"):
            assert f"transport=shm forced={forced}" in used(job, forced)
    assert "transport=tcp" in used(job, "tcp")


def test_variables_from_the_command_line(gpurun_job, tmp_path):
    # GPUCOLL_ALGO and GPUCOLL_SHM_DISABLE as users set them: for the whole job, on COMM_WORLD.
    cases = [c for c in build_cases(3, seed=33) if c["count"] in (1, 7, 1000)]
    job, _ = run_cases(gpurun_job, tmp_path, 3, ["world"], cases,
                       env={"GPUCOLL_ALGO": "rhd", "GPUCOLL_SHM_DISABLE": "1"})
    assert "transport=tcp forced=rhd" in used(job, "world")


def test_debug_info_names_algorithm_and_transport(gpurun_job):
    job = gpurun_job(2, "debug_log.py", env={"GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL"}).check()
    for rank in (0, 1):
        lines = [l for l in job.lines(rank, "stderr") if " gpucoll INFO [COLL] " in l]
        text = "\n".join(lines)
        # host:pid:rank gpucoll INFO [COLL] <op> #<seq> <bytes> B <dtype> [<op>] [root r] <algorithm> [<how>]
        # via <transport>; <how>: the direct engine's own choice
        found = re.findall(rf"^\S+:\d+:{rank} gpucoll INFO \[COLL\] allreduce #0 28 B float32 SUM (\S+)( .+)? via (\S+)$",
                           text, re.M)
        assert len(found) == 4, text
        assert found[1:] == [("direct", " one-shot (up to 65536 B)", "SHM/direct"), ("ring", "", "SHM"),
                             (found[3][0], "", "TCP")], text
        assert found[3][0] in ("ring", "rhd", "tree", "rd"), text
        assert re.search(r"\[COLL\] bcast #1 8 B int64 root 1 (\S+) via (\S+)$", text, re.M), text


@pytest.mark.parametrize("size", [2, 3])
def test_host_allreduce_fast_path_matches_the_general_one(gpurun_job, size):
    job = gpurun_job(size, "host_fast.py").check()
    res = job.json_lines()
    assert sorted(res) == list(range(size)), job.describe()
    for rank, got in res.items():
        assert got["installed"] is True
        assert got["failures"] == [], got["failures"]
        assert got["avg"] == (size + 1) / 2
        assert got["bool"] == [True, False, True]
        # every valid call after the first ran on the fast path, none on the general one
        assert got["valid"]["fast, general"] == [got["valid"]["calls"], 0], got["valid"]
        assert set(got["errors"].values()) == {"InvalidUsageError"}, got["errors"]
        assert got["bad"] == [0, 0], "bad arguments are refused before either path runs"
        assert got["ordered"] is True, f"the blocking call overtook the queued one: {got['ordered_head']}"
        assert got["repeated"] == [10, 0] and got["seq_step"] == 10, got
    # rank 0's Iallreduce waited for the late last rank: the blocking call behind it took the general path
    assert res[0]["behind_queued"] == [0, 2], res[0]


@pytest.mark.parametrize("size", [2, 3])
def test_host_fast_paths_of_every_kind_match_the_general_one(gpurun_job, size):
    job = gpurun_job(size, "host_fast_kinds.py", timeout=120).check()
    res = job.json_lines()
    assert sorted(res) == list(range(size)), job.describe()
    for rank, got in res.items():
        assert got["installed"] is True
        assert got["failures"] == [], got["failures"]
        # every valid call ran on the fast path, none on the general one
        assert got["valid"]["fast, general"] == [got["valid"]["calls"], 0], got["valid"]
        assert got["general"] == [0, 2], "a NumPy root and an explicit own block are the general path's"
        assert set(got["errors"].values()) == {"InvalidUsageError"}, got["errors"]
        assert got["bad"] == [0, 0], "bad arguments are refused before either path runs"
        assert got["after"] == [size * (size + 1) / 2] * 3
