"""A collective over OFI under settings that are wrong (tests/test_ofi.py):

    python ofi_settings.py buffsize    # rank 1 sets another GPUCOLL_BUFFSIZE than rank 0
    python ofi_settings.py plain       # the environment decides (an unknown provider, ...)
    python ofi_settings.py p2p         # 100 small messages and a 3 MiB one, 0 -> 1; JSON: the p2p
                                       # channel's OfiChannel.stats()
"""
import json
import os
import sys

if sys.argv[1] == "buffsize" and os.environ["GPUCOLL_RANK"] == "1":
    os.environ["GPUCOLL_BUFFSIZE"] = "256K"

import numpy as np  # noqa: E402

import gpucoll  # noqa: E402
import gpucoll.api.world  # noqa: E402

comm = gpucoll.COMM_WORLD
if sys.argv[1] != "p2p":
    comm.Allreduce(gpucoll.IN_PLACE, np.ones(4))
    sys.exit(0)
small = np.zeros(1, np.int64)
big = np.arange(3 << 18, dtype=np.int32) if comm.rank == 0 else np.zeros(3 << 18, np.int32)
for i in range(100):
    if comm.rank == 0:
        small[0] = i
        comm.Send(small, 1, tag=1)
    else:
        comm.Recv(small, 0, tag=1)
if comm.rank == 0:
    comm.Send(big, 1, tag=2)
else:
    comm.Recv(big, 0, tag=2)
comm.Barrier()
ofi = gpucoll.api.world.world().seam.context.ofi()
p2p = [s for (comm_id, _), s in ofi.stats().items() if comm_id == "p2p"]
print("RESULT " + json.dumps({"rank": comm.rank, "whole": bool((big == np.arange(3 << 18)).all()), "stats": p2p[0]}))
