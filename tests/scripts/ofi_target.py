"""A job that keeps computing exact results over OFI while something else knocks on its endpoints
(tests/test_ofi_trust.py).

    python ofi_target.py DIR   # writes DIR/addr-<rank> (its OFI endpoint's address, hex); runs until
                               # DIR/stop exists (60 s at most); RESULT {"rounds": n, "wrong": w}
"""
import json
import os
import sys
import time

import numpy as np

import gpucoll
import gpucoll.api.world

folder = sys.argv[1]
comm = gpucoll.COMM_WORLD
r, p = comm.rank, comm.size
base = np.arange(1000, dtype=np.int64)
big = np.arange(1 << 18, dtype=np.float64)          # 2 MiB: one-sided reads
comm.Allreduce(gpucoll.IN_PLACE, base.copy())       # the collectives' channels are met
out, back = np.full(40_000, r, np.int64), np.empty(40_000, np.int64)
comm.Sendrecv(out, (r + 1) % p, 1, back, (r - 1) % p, 1)  # and point to point's
address = gpucoll.api.world.world().seam.context.ofi().domain.address.hex()
with open(os.path.join(folder, f".addr-{r}"), "w") as f:
    f.write(address)
os.rename(os.path.join(folder, f".addr-{r}"), os.path.join(folder, f"addr-{r}"))

rounds = wrong = 0
deadline = time.monotonic() + 60
flag = np.zeros(1, np.int64)
while True:
    flag[0] = os.path.exists(os.path.join(folder, "stop")) or time.monotonic() > deadline
    comm.Allreduce(gpucoll.IN_PLACE, flag, op=gpucoll.MAX)
    if flag[0]:
        break
    y = base * (r + 1)
    comm.Allreduce(gpucoll.IN_PLACE, y)
    wrong += int(not (y == base * (p * (p + 1) // 2)).all())
    z = big * (r + 1)
    comm.Allreduce(gpucoll.IN_PLACE, z)
    wrong += int(not (z == big * (p * (p + 1) // 2)).all())
    out[:] = r * 1000 + rounds
    comm.Sendrecv(out, (r + 1) % p, 2, back, (r - 1) % p, 2)
    wrong += int(not (back == ((r - 1) % p) * 1000 + rounds).all())
    rounds += 1
print("RESULT " + json.dumps({"rank": r, "rounds": rounds, "wrong": wrong}), flush=True)
