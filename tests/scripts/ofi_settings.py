"""A collective over OFI under settings that are wrong (tests/test_ofi.py):

    python ofi_settings.py buffsize    # rank 1 sets another GPUCOLL_BUFFSIZE than rank 0
    python ofi_settings.py plain       # the environment decides (an unknown provider, ...)
"""
import os
import sys

if sys.argv[1] == "buffsize" and os.environ["GPUCOLL_RANK"] == "1":
    os.environ["GPUCOLL_BUFFSIZE"] = "1M"

import numpy as np  # noqa: E402

import gpucoll  # noqa: E402

gpucoll.COMM_WORLD.Allreduce(gpucoll.IN_PLACE, np.ones(4))
