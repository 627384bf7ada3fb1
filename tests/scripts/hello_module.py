"""Says hello with its rank and arguments (run by gpurun as `-m hello_module` or a script)."""
import os
import sys

print(f"hello from rank {os.environ['GPUCOLL_RANK']} of {os.environ['GPUCOLL_SIZE']}, args {sys.argv[1:]}")
