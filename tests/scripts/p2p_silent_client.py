"""A client connects to rank 1's inbox and says nothing: messages from rank 0 must still
arrive at once (the hello of each connection is read off the delivery thread)."""
import json
import socket
import time

import gpucoll
import gpucoll.world as world

comm = gpucoll.COMM_WORLD
if comm.rank == 0:
    host, port = world.world()._ctx.p2p_addresses[1].rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    time.sleep(0.2)  # the inbox has accepted it by now
comm.Barrier()
start = time.monotonic()
if comm.rank == 0:
    comm.send("hi", 1, tag=1)
else:
    got = comm.recv(source=0, tag=1)
    print("RESULT " + json.dumps({"got": got, "seconds": time.monotonic() - start}), flush=True)
comm.Barrier()
