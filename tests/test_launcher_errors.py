"""gpurun's own errors, met as users meet them: each is one clear line and a documented exit
code (docs/launcher.md's table), never a traceback; and the failure report shows the user's
frames."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from test_launcher import GPURUN, gpurun, python_c

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_CODES_DOC = os.path.join(HERE, "..", "docs", "launcher.md")


def one_line(proc, code):
    """Assert gpurun exited with `code` and said why in one line; return that line."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpurun: "), proc.stderr
    return lines[0]


def script(tmp_path, name, text, mode=0o644):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return str(path)


# --- the command line (exit 2) --------------------------------------------------------
def test_output_dir_that_cannot_be_made(tmp_path):
    proc, _ = gpurun("-np", 1, "--output-dir", "/proc/x", "echo", "hi")
    assert one_line(proc, 2) == "gpurun: --output-dir /proc/x: cannot create it (No such file or directory)"
    a_file = script(tmp_path, "taken", "")
    proc, _ = gpurun("-np", 1, "--output-dir", a_file, "echo", "hi")   # refused while parsing
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"Invalid value for '--output-dir': Directory '{a_file}' is a file." in proc.stderr
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    if os.geteuid() != 0:  # root writes anywhere
        proc, _ = gpurun("-np", 1, "--output-dir", read_only / "logs", "echo", "hi")
        assert one_line(proc, 2) == f"gpurun: --output-dir {read_only / 'logs'}: cannot create it (Permission denied)"


def test_np_glued_to_its_number():
    proc, _ = gpurun("-np4", *python_c("import os; print(os.environ['WORLD_SIZE'])"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[{r}] 4" for r in range(4)]
    for args, shown in ((["-np0", "echo"], "-np0"), (["-npx", "echo"], "-npx"), (["-np", "many", "echo"], "'many'")):
        proc, _ = gpurun(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{shown} is not a number of ranks: give a whole number >= 1, as in -np 4" in proc.stderr, proc.stderr


# --- programs that cannot run (126) or are not there (127) ----------------------------
def test_shell_script_without_execute_bit_is_not_run_as_python(tmp_path):
    with_shebang = script(tmp_path, "job.sh", "#!/bin/bash\necho hello\n")
    proc, _ = gpurun("-np", 2, with_shebang)
    assert one_line(proc, 126) == (f"gpurun: {with_shebang} is not executable: chmod +x {with_shebang}, or name "
                                   f"its interpreter (gpurun ... bash {with_shebang})")
    plain = script(tmp_path, "job", "echo hello\n")
    proc, _ = gpurun("-np", 2, plain)
    assert one_line(proc, 126) == (f"gpurun: {plain} is not executable and is not Python: chmod +x {plain}, "
                                   f"or name its interpreter (gpurun ... sh {plain})")


def test_python_without_execute_bit_or_suffix_still_runs(tmp_path):
    bare = script(tmp_path, "train", "import os\nprint('rank', os.environ['RANK'])\n")
    shebang = script(tmp_path, "train2", "#!/usr/bin/env python3\nprint('hello')\n")
    proc, _ = gpurun("-np", 2, bare)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] rank 0", "[1] rank 1"]
    proc, _ = gpurun("-np", 1, shebang)
    assert proc.returncode == 0 and proc.stdout == "[0] hello\n", proc.stderr


def test_missing_interpreter_is_not_a_missing_program(tmp_path):
    absolute = script(tmp_path, "a.sh", "#!/no/such/shell\necho x\n", 0o755)
    proc, _ = gpurun("-np", 1, absolute)
    assert one_line(proc, 127) == (f"gpurun: {absolute}: its interpreter /no/such/shell (named by its #! line) "
                                   "is missing")
    through_env = script(tmp_path, "b.sh", "#!/usr/bin/env no-such-shell-anywhere\necho x\n", 0o755)
    if not os.path.exists("/usr/bin/env"):
        pytest.skip("no /usr/bin/env")
    proc, _ = gpurun("-np", 1, through_env)
    assert one_line(proc, 127) == (f"gpurun: {through_env}: its interpreter no-such-shell-anywhere (named by its "
                                   "#! line, through env) is missing: not found on PATH")


def test_directory_and_file_in_the_current_directory(tmp_path):
    proc, _ = gpurun("-np", 1, str(tmp_path))
    assert one_line(proc, 126) == f"gpurun: {tmp_path} is a directory, not a program"
    script(tmp_path, "local-tool", "#!/bin/sh\necho x\n", 0o755)
    proc, _ = gpurun("-np", 1, "local-tool", cwd=tmp_path)
    assert one_line(proc, 127) == ("gpurun: command not found: local-tool (there is a file local-tool here: "
                                   "to run it, give its path, ./local-tool)")


# --- gpurun's own set-up (125) --------------------------------------------------------
def test_no_free_port_for_the_store():
    # A network namespace whose only ephemeral port is taken: gpurun cannot get a port.
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing")
    hold_and_run = (f"import socket, subprocess, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                    f"sys.exit(subprocess.run({GPURUN + ['-np', '1', 'echo', 'hi']!r}).returncode)")
    shell = ("echo '41000 41000' > /proc/sys/net/ipv4/ip_local_port_range || exit 99; "
             f"exec {sys.executable} -c \"{hold_and_run}\"")
    flags = "-n" if os.geteuid() == 0 else "-rn"
    proc = subprocess.run(["unshare", flags, "sh", "-c", shell], capture_output=True, text=True, timeout=60)
    if proc.returncode == 99 or "unshare:" in proc.stderr:
        pytest.skip(f"cannot make a network namespace here: {proc.stderr.strip()}")
    line = one_line(proc, 125)
    assert line == ("gpurun: cannot serve the store on 127.0.0.1: no free port is left (every port of the range "
                    "41000-41000 is in use). End the programs that hold them, or widen "
                    "net.ipv4.ip_local_port_range.")


# --- the failure report ---------------------------------------------------------------
USER_JOB = """\
import time, numpy as np, gpucoll
c = gpucoll.COMM_WORLD

def train_step(x):
    c.Allreduce(gpucoll.IN_PLACE, x)

x = np.ones(4)
train_step(x)
if c.rank == 1:
    time.sleep(60)
train_step(x)
"""


def test_failure_report_shows_the_users_frames_not_gpucolls(tmp_path):
    # A timeout raised deep inside gpucoll: its own frames once pushed the user's file and
    # line out of the report's last 20 lines.
    path = script(tmp_path, "user_job.py", USER_JOB)
    env = dict(os.environ, GPUCOLL_SHM_DISABLE="1", GPUCOLL_TIMEOUT="0.5")
    proc, _ = gpurun("-np", 2, path, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    report = proc.stderr[proc.stderr.index("gpurun: rank 0 (host"):].splitlines()
    assert re.fullmatch(r"gpurun: rank 0's traceback \(the last in its stderr; \d+ frame\(s\) inside gpucoll "
                        r"left out\):", report[1]), report
    body = "\n".join(report[2:report.index("gpurun: stopped 1 other rank(s): 1")])
    assert body.startswith("    Traceback (most recent call last):\n"
                           f'      File "{path}", line 11, in <module>\n'
                           "        train_step(x)\n"
                           f'      File "{path}", line 5, in train_step\n'
                           "        c.Allreduce(gpucoll.IN_PLACE, x)\n"
                           "      ... "), body
    assert re.search(r"^      \.\.\. \d+ frame\(s\) inside gpucoll \.\.\.\n    gpucoll\.TimeoutError: "
                     r"allreduce #1 on communicator world \(rank 0 of 2\): (waiting for data from rank 1 at step \d+: )?"
                     r"timed out", body, re.M), body
    assert "dispatch.py" not in body and "core.pyx" not in body


def test_failure_report_is_bounded(tmp_path):
    path = script(tmp_path, "deep.py", "def f(n):\n    return f(n + 1)\nf(0)\n")
    proc, _ = gpurun("-np", 1, path)
    assert proc.returncode == 1
    report = proc.stderr[proc.stderr.index("gpurun: rank 0 (host"):].splitlines()
    assert len(report) < 50, report
    assert report[-2] == "    RecursionError: maximum recursion depth exceeded", report
    assert f'      File "{path}", line 3, in <module>' in report


# --- the documentation ----------------------------------------------------------------
def test_docs_and_help_list_the_same_exit_codes():
    doc = open(EXIT_CODES_DOC).read()
    table = doc[doc.index("| exit code | when |"):]
    table = table[:table.index("\n\n")]
    documented = set(re.findall(r"^\| ([\d, +NS]+) \|", table, re.M))
    codes = {c.strip() for row in documented for c in row.split(",")}
    help_text = subprocess.run(GPURUN + ["--help"], capture_output=True, text=True, timeout=20).stdout
    section = help_text[help_text.index("Exit code:"):]
    firsts = [line.split()[0] for line in section.splitlines()[1:] if line.strip()]
    listed = {c for first in firsts if re.fullmatch(r"[\dNS+/]+", first) for c in first.split("/")}
    assert codes == listed, (codes, listed)
