"""Rank 0 floods the job's store with connections that never authenticate; then every rank
joins the job and prints how long joining took (for gpurun's tests).

    python store_flood.py COUNT          (a rank under gpurun)
    python store_flood.py --hold COUNT   (the flood itself: GPUCOLL_STORE from the rank;
                                          prints "opened N", holds them until stdin closes)
"""
import os
import resource
import socket
import subprocess
import sys
import time


def hold(count):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 100 if hard == resource.RLIM_INFINITY else min(count + 100, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    host, port = os.environ["GPUCOLL_STORE"].rsplit(":", 1)
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, int(port)))
        socks.append(s)
    print(f"opened {len(socks)}", flush=True)
    sys.stdin.read()


if sys.argv[1] == "--hold":
    hold(int(sys.argv[2]))
    sys.exit(0)

flood = None
if os.environ["GPUCOLL_RANK"] == "0":
    flood = subprocess.Popen([sys.executable, __file__, "--hold", sys.argv[1]], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    print(flood.stdout.readline().strip(), flush=True)
start = time.monotonic()
import gpucoll  # noqa: E402  (joining starts the clock)

gpucoll.COMM_WORLD.Barrier()
print(f"joined in {time.monotonic() - start:.2f} s", flush=True)
if flood is not None:
    flood.stdin.close()
    flood.wait()
