"""Free() with a receive still pending: the receive fails at once, and Dup/Free cycles leave
no matching state behind."""
import gpucoll
import gpucoll.api.world as world

comm = gpucoll.COMM_WORLD
engine = world.world().seam.context.p2p.native
before = sum(engine.counts())  # posted receives and unread messages of every communicator
comm.Barrier()  # rank 0 sends only after every rank counted
for i in range(10):
    dup = comm.Dup()
    if comm.rank == 0:
        dup.send(i, 1, tag=3)
    elif comm.rank == 1:
        assert dup.recv(source=0, tag=3) == i
    dup.Free()
dup = comm.Dup()
req = dup.irecv(source=0, tag=9)
comm.Barrier()
dup.Free()
try:
    req.wait()
    print("PENDING no error")
except gpucoll.InvalidUsageError as exc:
    print("PENDING", exc)
print("LEFT", sum(engine.counts()) - before)
