"""Build script: the Cython transports in cython_src/ compile into gpucoll._native.

Nothing here links against CUDA, MPI, rdma-core or libfabric: native libraries are dlopen'ed
at first use, so the package builds and imports on a machine without them. The OFI transport
(ofi.pyx) needs libfabric's headers to build (Debian: libfabric-dev); where they are absent
it is left out and traffic between hosts uses TCP. Headers elsewhere: CPATH or C_INCLUDE_PATH.
"""
import glob
import os

from setuptools import Extension, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def libfabric_headers():
    """The folder holding rdma/fabric.h, or None."""
    dirs = [d for var in ("CPATH", "C_INCLUDE_PATH") for d in os.environ.get(var, "").split(os.pathsep) if d]
    for folder in dirs + ["/usr/include", "/usr/local/include", "/opt/libfabric/include"]:
        if os.path.exists(os.path.join(folder, "rdma", "fabric.h")):
            return folder
    return None


def native_extensions():
    from Cython.Build import cythonize

    exts = []
    ofi_headers = libfabric_headers()
    for pyx in sorted(glob.glob(os.path.join("cython_src", "*.pyx"))):
        name = os.path.splitext(os.path.basename(pyx))[0]
        include = [os.path.join(HERE, "cython_src", "include")]
        if name == "ofi":
            if ofi_headers is None:
                print("gpucoll: libfabric's headers (rdma/fabric.h) not found: building without the OFI "
                      "transport (install libfabric-dev for it)")
                continue
            include.append(ofi_headers)
        exts.append(
            Extension(
                f"gpucoll._native.{name}",
                [pyx],
                include_dirs=include,
                extra_compile_args=["-O3", "-std=gnu11", "-fno-strict-aliasing"],
                libraries=["dl", "rt"],
            )
        )
    return cythonize(
        exts,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )


packages = find_packages(include=["gpucoll", "gpucoll.*"]) + ["gpucoll.launcher"]

setup(
    packages=packages,
    package_dir={"gpucoll.launcher": "launcher"},
    ext_modules=native_extensions(),
)
