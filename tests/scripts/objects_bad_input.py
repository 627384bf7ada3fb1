"""One rank's input to an object collective is wrong: every rank must raise, none may wait.

  alltoall   rank 1 passes a list one item short
  allgather  rank 1 passes an object that cannot be pickled (a lambda)
  bcast      the root (rank 1) passes an object that cannot be pickled
"""
import sys
import threading

import gpucoll

mode = sys.argv[1]
comm = gpucoll.COMM_WORLD
bad = comm.rank == 1
try:
    if mode == "alltoall":
        comm.alltoall(list(range(comm.size - 1 if bad else comm.size)))
    elif mode == "allgather":
        comm.allgather((lambda: 0) if bad else comm.rank)
    elif mode == "bcast":
        comm.bcast(threading.Lock() if bad else None, root=1)
    print("RESULT-NO-ERROR")
except gpucoll.InvalidUsageError as exc:
    print("RAISED", exc)
print("NEXT", comm.allgather(comm.rank))  # the communicator is still usable
