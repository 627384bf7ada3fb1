"""Free() with a receive still pending: the receive fails at once, and Dup/Free cycles leave
no matching state behind."""
import gpucoll
import gpucoll.world as world

comm = gpucoll.COMM_WORLD
inbox = world.world()._ctx.inbox
before = len(inbox._boxes)
comm.Barrier()  # rank 0 sends only after every rank counted: a message makes its box on arrival
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
print("LEFT", len(inbox._boxes) - before)
