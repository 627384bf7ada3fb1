"""Installed at interpreter start where gpucoll/mpi4py_alias is on PYTHONPATH (see __init__.py)."""
import gpucoll.mpi4py_alias

gpucoll.mpi4py_alias.install()
