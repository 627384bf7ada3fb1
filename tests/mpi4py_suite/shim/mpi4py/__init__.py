"""mpi4py with one change: `mpi4py.MPI` is `gpucoll.MPI`.

The harness (tests/mpi4py_suite/run.py) puts this folder first on PYTHONPATH and names the
release's own pure-Python package in MPI4PY_SUITE_SRC. This file loads that package's
`__init__.py` as `mpi4py` (so rc, util, futures, run and typing are mpi4py's own, and find
`mpi4py.MPI` through sys.modules) and maps the MPI module to gpucoll's. Nothing else."""
import importlib.util
import os
import sys

_src = os.environ["MPI4PY_SUITE_SRC"]
_spec = importlib.util.spec_from_file_location(__name__, os.path.join(_src, "__init__.py"),
                                               submodule_search_locations=[_src])
_module = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _module
_spec.loader.exec_module(_module)

from gpucoll import MPI  # noqa: E402

sys.modules[__name__ + ".MPI"] = MPI
_module.MPI = MPI
