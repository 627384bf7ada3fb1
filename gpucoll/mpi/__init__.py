"""The pieces of gpucoll.MPI, mpi4py's API over gpucoll, one concept per module.

constants (integer constants), exception (error classes, mixed into every gpucoll error),
handle (what handle classes share), datatype and derived (predefined and derived datatypes),
op, status, request (Request, Prequest, Grequest), group, info, errhandler, attributes,
buffer (MPI.buffer), dlpack and cai (DLPack and __cuda_array_interface__ buffers), memory
(Msg and as_array: host memory under a message), message (buffer arguments -> bytes, count,
datatype), composite (operations built from several of
gpucoll's), comm (communicators over gpucoll's Communicator), collectives and pointtopoint
(their buffer methods), matched (MPI.Message), environment (module functions), pickler
(MPI.pickle), kinds (the communicator classes by name, so that no module imports one above
it), docs (mpi4py's docstring layout), unsupported (one table: the names that raise
NotImplementedError).
gpucoll/MPI.py assembles the namespace.

Leaf modules (constants, exception) import nothing from gpucoll: errors.py builds on them.
"""
