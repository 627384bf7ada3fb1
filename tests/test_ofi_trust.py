"""Nothing from a process that has not proved the job's secret gets into an OFI channel: an
impostor on the ranks' libfabric endpoints (raw bytes on the tcp provider's port; a libfabric
client sending tagged messages under guessed tags, one-sided writes and reads under guessed keys)
while the job computes; every result stays exact and the job goes on (docs/trust.md)."""
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import GPURUN, SCRIPTS, _SCRUB, ofi_missing, requires

pytestmark = requires("ofi", ofi_missing())
HERE = os.path.dirname(os.path.abspath(__file__))


def _ip_port(hex_address):
    raw = bytes.fromhex(hex_address)
    assert len(raw) >= 8 and int.from_bytes(raw[:2], "little") == socket.AF_INET, hex_address
    return socket.inet_ntoa(raw[4:8]), int.from_bytes(raw[2:4], "big")


def test_an_impostor_on_the_ofi_endpoints_gets_nothing_in(tmp_path):
    impostor = tmp_path / "ofi_impostor"
    built = subprocess.run(["gcc", "-O1", "-o", str(impostor), os.path.join(HERE, "impostor", "ofi_impostor.c"),
                            "-lfabric"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(GPUCOLL_SHM_DISABLE="1", GPUCOLL_NET="ofi", GPUCOLL_TIMEOUT="30", PYTHONDONTWRITEBYTECODE="1")
    job = subprocess.Popen([*GPURUN, "-np", "2", "--timeout", "100", sys.executable,
                            os.path.join(SCRIPTS, "ofi_target.py"), str(tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"addr-{r}").exists() for r in (0, 1)):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        reports = []
        for r in (0, 1):
            address = (tmp_path / f"addr-{r}").read_text()
            ip, port = _ip_port(address)
            for junk in (os.urandom(4096), bytes(64), b"\xff" * 300):   # raw bytes on the provider's port
                with socket.create_connection((ip, port), timeout=5) as s:
                    s.sendall(junk)
                    time.sleep(0.05)
            got = subprocess.run([str(impostor), "tcp;ofi_rxm", address, "300"], capture_output=True, text=True,
                                 timeout=120)
            assert got.returncode == 0, got.stderr
            reports.append(got.stdout.strip())
        (tmp_path / "stop").write_text("")
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, err[-4000:]
    results = [line for line in out.splitlines() if "RESULT " in line]
    assert len(results) == 2, out
    for line in results:
        assert '"wrong": 0' in line, line
        assert int(line.split('"rounds": ')[1].split(",")[0].rstrip("}")) > 5, line
    for report in reports:   # the impostor did reach the endpoints: its operations left
        sent = int(report.split()[1])
        assert sent > 0, reports
