"""Configuration variables, `gpucoll info` and the log line format."""
import os
import re
import subprocess
import sys

import pytest

from gpucoll.base import config
from gpucoll.base.errors import ConfigError

BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize("name, text, value", [
    ("GPUCOLL_TIMEOUT", "2.5", 2.5),
    ("GPUCOLL_BUFFSIZE", "4M", 4 << 20),
    ("GPUCOLL_BUFFSIZE", "512KiB", 512 << 10),
    ("GPUCOLL_SHM_DISABLE", "1", True),
    ("GPUCOLL_SHM_DISABLE", "no", False),
    ("GPUCOLL_ALGO", "Ring", "ring"),
    ("GPUCOLL_DEBUG_SUBSYS", "init,coll", ("INIT", "COLL")),
    ("GPUCOLL_NSOCKS", "4", 4),
])
def test_values_parse(name, text, value):
    assert config.by_name(name).get({name: text}) == value


@pytest.mark.parametrize("name, text, allowed", [
    ("GPUCOLL_ALGO", "fastest", "auto, direct, ring"),
    ("GPUCOLL_DEBUG", "LOUD", "none, warn, info, trace"),
    ("GPUCOLL_TIMEOUT", "soon", "a number"),
    ("GPUCOLL_NSOCKS", "0", "an integer >= 1"),
    ("GPUCOLL_SHM_DISABLE", "maybe", "0 or 1"),
    ("GPUCOLL_BUFFSIZE", "lots", "a byte count"),
])
def test_invalid_values_name_the_variable_and_what_is_allowed(name, text, allowed):
    with pytest.raises(ConfigError) as info:
        config.by_name(name).get({name: text})
    assert name in str(info.value) and repr(text) in str(info.value) and allowed in str(info.value)


def test_every_variable_is_declared_once_with_help():
    names = [v.name for v in config.ALL]
    assert len(names) == len(set(names))
    assert all(v.name.startswith("GPUCOLL_") and v.help for v in config.ALL)


def test_unknown_gpucoll_variables_are_reported():
    assert config.check_all({"GPUCOLL_TIMEOUTT": "3"}) == ["GPUCOLL_TIMEOUTT"]


def test_invalid_value_stops_a_job_with_a_clear_message():
    env = dict(os.environ, GPUCOLL_ALGO="fastest")
    out = subprocess.run([sys.executable, "-c", "import gpucoll; gpucoll.COMM_WORLD"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "GPUCOLL_ALGO='fastest' is not valid" in out.stderr


def test_gpucoll_info_lists_variables_and_gpus():
    env = dict(os.environ, GPUCOLL_NSOCKS="3")
    out = subprocess.run([os.path.join(BIN, "gpucoll"), "info"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for var in config.ALL:
        assert var.name in out.stdout
    assert re.search(r"GPUCOLL_NSOCKS\s+3\s", out.stdout)
    assert "GPUs:" in out.stdout and ("no GPU" in out.stdout or "GPU 0:" in out.stdout)


def test_gpucoll_info_under_gpurun_never_prints_the_secret():
    # What a user does to see the settings of a job: its output must not carry the secret.
    script = "gpucoll info; echo \"THE SECRET IS $GPUCOLL_STORE_SECRET\""
    env = dict(os.environ, PATH=os.pathsep.join([BIN, os.environ.get("PATH", "")]))
    out = subprocess.run([os.path.join(BIN, "gpurun"), "-np", "1", "sh", "-c", script], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    secret = re.search(r"THE SECRET IS ([0-9a-f]{32})$", out.stdout, re.M).group(1)
    assert out.stdout.count(secret) == 1 and secret not in out.stderr
    assert re.search(r"GPUCOLL_STORE_SECRET\s+<set, 32 chars>", out.stdout), out.stdout


def test_log_lines_mask_the_secret():
    secret = "0123456789abcdef" * 2
    code = ("import os; from gpucoll.base import log; "
            "log.warn('ENV', 'environment: %s', dict(os.environ)); log.warn('NET', 'plain line')")
    env = dict(os.environ, GPUCOLL_STORE_SECRET=secret)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert secret not in out.stderr
    assert "'GPUCOLL_STORE_SECRET': '<GPUCOLL_STORE_SECRET>'" in out.stderr and "plain line" in out.stderr


def test_debug_info_lines_are_shaped_and_name_algorithm_and_transport():
    script = ("import numpy as np, gpucoll; c = gpucoll.COMM_WORLD; x = np.ones(1024, np.float32); "
              "c.Allreduce(gpucoll.IN_PLACE, x)")
    env = dict(os.environ, GPUCOLL_DEBUG="INFO", GPUCOLL_DEBUG_SUBSYS="COLL,BOOTSTRAP")
    out = subprocess.run([os.path.join(BIN, "gpurun"), "-np", "2", sys.executable, "-c", script], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stderr.splitlines() if "allreduce #0" in l)
    assert re.match(r"^\[\d\] [\w.-]+:\d+:\d gpucoll INFO \[COLL\] allreduce #0 4096 B float32 SUM \S+( .+)? via \S+", line)
    assert "[BOOTSTRAP] rank" in out.stderr
