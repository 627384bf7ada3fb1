"""A rank that records its pid and a child's pid, then behaves as told (for gpurun tests).

    python rank_behaviour.py MODE PIDDIR [FAIL_RANK]

Every rank starts a `sleep 100` child (a grandchild of gpurun), writes "PID CHILD_PID" to
PIDDIR/rank.N, and waits until every rank has done so. Then, on FAIL_RANK (default 1):

    raise    raise an exception          exit3   os._exit(3)
    sigkill  SIGKILL itself               wait    (every rank) sleep until stopped
    usr1     (every rank) wait for SIGUSR1, print that it came, exit 0
    leave    (every rank) exit 0, leaving the child behind

Ranks other than FAIL_RANK sleep until gpurun stops them.
"""
import os
import signal
import subprocess
import sys
import time

mode, piddir = sys.argv[1], sys.argv[2]
fail_rank = int(sys.argv[3]) if len(sys.argv) > 3 else 1
rank = int(os.environ["GPUCOLL_RANK"])
size = int(os.environ["GPUCOLL_SIZE"])

got_usr1 = []
if mode == "usr1":
    signal.signal(signal.SIGUSR1, lambda *_: got_usr1.append(1))

child = subprocess.Popen(["sleep", "100"])
tmp = os.path.join(piddir, f".rank.{rank}")
with open(tmp, "w") as f:
    f.write(f"{os.getpid()} {child.pid}\n")
os.rename(tmp, os.path.join(piddir, f"rank.{rank}"))

deadline = time.monotonic() + 10
while len([n for n in os.listdir(piddir) if n.startswith("rank.")]) < size:
    if time.monotonic() > deadline:
        sys.exit("the other ranks never wrote their pids")
    time.sleep(0.02)
print(f"rank {rank} ready")

if mode == "usr1":
    while not got_usr1 and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"rank {rank} got SIGUSR1" if got_usr1 else f"rank {rank} saw no SIGUSR1")
    sys.exit(0)
if mode == "leave":
    os._exit(0)
if rank == fail_rank:
    if mode == "raise":
        raise RuntimeError(f"rank {rank} fails on purpose")
    if mode == "exit3":
        os._exit(3)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
