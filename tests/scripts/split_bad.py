"""One rank passes Split a color that is not an integer: every rank must raise, none hang."""
import gpucoll

comm = gpucoll.COMM_WORLD
try:
    comm.Split(1.5 if comm.rank == 1 else 0, comm.rank)
    print("RAISED none")
except gpucoll.InvalidUsageError as exc:
    print("RAISED", exc)
sub = comm.Split(None if comm.rank == 0 else 3, -comm.rank)  # None: stay out
print("AFTER", "none" if sub is None else f"{sub.rank}/{sub.size}")
