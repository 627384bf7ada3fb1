"""Build script: the Cython transports in cython_src/ compile into gpucoll._native.

Nothing here links against CUDA, MPI or rdma-core: native libraries are dlopen'ed
at first use, so the package builds and imports on a machine without them.
"""
import glob
import os

from setuptools import Extension, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def native_extensions():
    from Cython.Build import cythonize

    exts = []
    for pyx in sorted(glob.glob(os.path.join("cython_src", "*.pyx"))):
        name = os.path.splitext(os.path.basename(pyx))[0]
        exts.append(
            Extension(
                f"gpucoll._native.{name}",
                [pyx],
                include_dirs=[os.path.join(HERE, "cython_src", "include")],
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
