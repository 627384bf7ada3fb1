"""Run mpi4py programs on gpucoll.MPI without editing them: `import mpi4py.MPI` gives gpucoll.MPI.

    import gpucoll.mpi4py_alias
    gpucoll.mpi4py_alias.install()     # from here on, `from mpi4py import MPI` is gpucoll.MPI

mpi4py's pure-Python parts (mpi4py.futures, mpi4py.util, mpi4py.run) keep working where
mpi4py is installed: only its compiled MPI module is replaced. For every process of a job,
spawned ones included (MPIPoolExecutor's workers), put this folder on PYTHONPATH: its
sitecustomize.py installs the alias as each interpreter starts, and gpurun hands PYTHONPATH
to the processes it spawns:

    PYTHONPATH=$(python -m gpucoll.mpi4py_alias) gpurun -np 1 pool_program.py
"""
import importlib.abc
import importlib.machinery
import os
import sys

SITE = os.path.dirname(os.path.abspath(__file__))  # holds sitecustomize.py


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        from gpucoll import MPI

        return MPI

    def exec_module(self, module):
        parent = sys.modules.get("mpi4py")
        if parent is not None:
            parent.MPI = module


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "mpi4py.MPI":
            return None
        return importlib.machinery.ModuleSpec(name, _Loader(), origin="gpucoll.MPI")


def install():
    """Make `mpi4py.MPI` gpucoll.MPI in this interpreter (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    if "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].__name__ != "gpucoll.MPI":
        raise RuntimeError("mpi4py.MPI was imported before gpucoll.mpi4py_alias.install(): install it first")
