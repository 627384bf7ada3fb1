"""`python -m gpucoll.bench ...` is the same as `gpucoll-bench ...`."""
from .cli import main

main(prog_name="gpucoll-bench")
