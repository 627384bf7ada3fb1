"""The root of an object scatter passes a list of the wrong length: every rank must raise."""
import gpucoll

comm = gpucoll.COMM_WORLD
try:
    comm.scatter(list(range(comm.size - 1)) if comm.rank == 0 else None, root=0)
    print("RESULT-NO-ERROR")
except gpucoll.InvalidUsageError as exc:
    print("RAISED", exc)
