"""What the documentation (README.md, docs/) promises and no other test checks, tried the way a
user would meet it (rank side: tests/scripts/readme_claims.py)."""
import os
import subprocess
import sys

import pytest

from test_gpu_collectives import job_env, needs_gpu


def test_debug_file_pattern_gives_each_rank_its_own_file(gpurun_job, tmp_path):
    # GPUCOLL_DEBUG_FILE: "%h is the host, %p the pid, %r the rank"; the logs go there, not to stderr.
    env = {"GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL",
           "GPUCOLL_DEBUG_FILE": str(tmp_path / "gc-%h-%p-%r.log")}
    job = gpurun_job(2, "readme_claims.py", "log", env=env).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1], job.describe()
    want = {f"gc-{res[r]['host']}-{res[r]['pid']}-{r}.log": r for r in res}
    assert sorted(os.listdir(tmp_path)) == sorted(want), os.listdir(tmp_path)
    for name, r in want.items():
        text = (tmp_path / name).read_text()
        head = f"{res[r]['host']}:{res[r]['pid']}:{r} gpucoll INFO [COLL] allreduce #0 64 B float32 SUM "
        assert any(line.startswith(head) for line in text.splitlines()), text
    assert "gpucoll INFO" not in job.stderr, job.stderr


@pytest.mark.parametrize("env, fast", [
    ({}, 19),                                                            # on after the first call
    ({"GPUCOLL_DEBUG_CHECKS": "1"}, 0),                                  # every call cross-checked
    ({"GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "COLL"}, 0),      # every call logged
    ({"GPUCOLL_DEBUG": "INFO", "GPUCOLL_DEBUG_SUBSYS": "NET"}, 19),      # other logs leave it on
], ids=["default", "debug-checks", "coll-info", "net-info"])
def test_host_fast_path_turns_off_under_debug_checks_and_coll_logs(gpurun_job, env, fast):
    job = gpurun_job(2, "readme_claims.py", "fast", env=env).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1], job.describe()
    for r, got in res.items():
        assert got["wrong"] == [], got
        assert (got["fast"], got["general"]) == (fast, {"direct": 20 - fast}), got


def test_dlpack_host_buffers(gpurun_job):
    # Objects that offer nothing but __dlpack__ (over NumPy memory here): results land in their memory.
    job = gpurun_job(3, "readme_claims.py", "dlpack").check()
    res = job.json_lines()
    assert sorted(res) == [0, 1, 2], job.describe()
    for r, got in res.items():
        assert {k: got[k] for k in ("allreduce", "bcast", "allgather", "sendrecv")} == dict.fromkeys(
            ("allreduce", "bcast", "allgather", "sendrecv"), True), (r, got)


@pytest.mark.gpu
@needs_gpu
def test_dlpack_gpu_buffers(gpurun_job):
    job = gpurun_job(2, "readme_claims.py", "dlpack-gpu", env=job_env(2), timeout=180).check()
    res = job.json_lines()
    assert sorted(res) == [0, 1], job.describe()
    assert all(got["allreduce"] is True and got["bcast"] is True for got in res.values()), res


def test_mistyped_variable_gets_a_warning(gpurun_job):
    job = gpurun_job(2, "readme_claims.py", "log", env={"GPUCOLL_TIMEOUTT": "5", "GPUCOLL_NSOCKS": "3"}).check()
    for r in (0, 1):
        warnings = [line for line in job.lines(r, "stderr") if " gpucoll WARN [ENV] " in line]
        assert len(warnings) == 1, f"rank {r} warned {warnings}; its stderr: {job.lines(r, 'stderr')}"
        assert warnings[0].endswith("unknown variable(s) GPUCOLL_TIMEOUTT: nothing reads them (a typo?)"), warnings
    assert job.json_lines()[0]["sum"] == 2.0

