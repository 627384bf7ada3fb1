"""`python -m gpucoll.launcher ...` is the same as `gpurun ...`."""
from .cli import main

main()
