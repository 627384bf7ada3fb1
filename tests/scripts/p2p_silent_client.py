"""A client connects to rank 1's listener and says nothing: messages from rank 0 must still
arrive at once (the hellos of the point-to-point set-up are handshaken beside the silent one)."""
import json
import socket
import time

import gpucoll
import gpucoll.api.world as world

comm = gpucoll.COMM_WORLD
if comm.rank == 0:
    host, port = world.world().seam.context.tcp_addresses[1].rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    time.sleep(0.2)  # the listener has accepted it by now
comm.Barrier()
start = time.monotonic()
if comm.rank == 0:
    comm.send("hi", 1, tag=1)
else:
    got = comm.recv(source=0, tag=1)
    print("RESULT " + json.dumps({"got": got, "seconds": time.monotonic() - start}), flush=True)
comm.Barrier()
