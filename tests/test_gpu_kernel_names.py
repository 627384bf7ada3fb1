"""The GPU engine finds its CUDA source and every kernel it loads by name is defined there: a moved
file or a renamed kernel otherwise shows only on a GPU machine, at the first collective."""
import re

from gpucoll.engines.gpu import kernels


def test_every_kernel_the_engine_loads_is_defined_in_the_source():
    with open(kernels._SOURCE) as f:
        defined = set(re.findall(r"^KERNEL\s+(\w+)\s*\(", f.read(), re.M))
    assert set(kernels.REDUCE_KERNELS + kernels.COPY_KERNELS) <= defined
