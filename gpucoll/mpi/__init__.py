"""The pieces of gpucoll.MPI, mpi4py's API over gpucoll, one concept per module.

constants (integer constants), exception (error classes, mixed into every gpucoll error),
datatype, op, status, request, group, info, message (buffer arguments -> NumPy views),
comm (communicators over gpucoll's Communicator), collectives and pointtopoint (the buffer
methods, with what gpucoll's engines lack built on its primitives), unsupported (one table:
the names that raise NotImplementedError). gpucoll/MPI.py assembles the namespace.

Leaf modules (constants, exception) import nothing from gpucoll: errors.py builds on them.
"""
