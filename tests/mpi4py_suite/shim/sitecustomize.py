"""The spawned processes of the suite's jobs (test_spawn.py puts the release's own package first
on sys.path): `mpi4py.MPI` is gpucoll.MPI there too."""
import gpucoll.mpi4py_alias

gpucoll.mpi4py_alias.install()
