"""`python -m gpucoll.mpi4py_alias` prints the folder to put on PYTHONPATH."""
from . import SITE

print(SITE)
