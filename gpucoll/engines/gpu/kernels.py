"""Compile gpucoll/kernels/coll.cu with NVRTC (through CuPy) and cache the cubins on disk.

One module per element type (-DGC_T=<type>) holds the reducing kernels, one more
(-DGC_COPY) the byte-copying ones. Cubins are built for the device's own architecture
(sm_90 on an H100/H200) and stored in GPUCOLL_CACHE_DIR (default ~/.cache/gpucoll), keyed
by the source, the options and NVRTC's version; a second process finds them there.
"""
import hashlib
import os
import tempfile

from ..._native import cuda
from ...base import config, dtypes, log
from ...base.errors import GpucollError

_SOURCE = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "kernels", "coll.cu"))

# The C type each dtype reduces as (bool and complex are mapped by the dispatcher).
C_TYPES = {
    dtypes.INT8: "signed char", dtypes.UINT8: "unsigned char", dtypes.INT16: "short",
    dtypes.UINT16: "unsigned short", dtypes.INT32: "int", dtypes.UINT32: "unsigned",
    dtypes.INT64: "long long", dtypes.UINT64: "unsigned long long", dtypes.FLOAT16: "h16",
    dtypes.BFLOAT16: "b16", dtypes.FLOAT32: "float", dtypes.FLOAT64: "double",
}
REDUCE_KERNELS = ("ar_oneshot", "ar_oneshot_multi", "ar_twoshot", "ar_registered", "rs_staged", "rs_registered",
                  "red_staged")
COPY_KERNELS = ("barrier", "ag_staged", "ag_registered", "bc_staged", "bc_registered", "a2a_staged", "a2a_registered",
                "ga_staged", "sc_staged", "p2p_slots")


def cache_dir():
    path = config.CACHE_DIR.get() or os.path.join(os.path.expanduser("~"), ".cache", "gpucoll")
    os.makedirs(path, exist_ok=True)
    return path


def _nvrtc_compile(source, options):
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, "coll.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except Exception as exc:
            raise GpucollError(f"NVRTC could not compile gpucoll/kernels/coll.cu ({' '.join(options)}): {exc}\n"
                               f"{nvrtc.getProgramLog(prog)}") from None
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _nvrtc_version():
    try:
        from cupy_backends.cuda.libs import nvrtc

        return ".".join(map(str, nvrtc.getVersion()))
    except Exception:
        return "?"


def cubin(define, arch):
    """The cubin of coll.cu for one define (`GC_T=float` or `GC_COPY`) and arch (e.g. 90)."""
    with open(_SOURCE) as f:
        source = f.read()
    options = (f"--gpu-architecture=sm_{arch}", "-std=c++17", f"-D{define}")
    key = hashlib.sha256("\0".join((source, *options, _nvrtc_version())).encode()).hexdigest()[:32]
    path = os.path.join(cache_dir(), f"coll-sm{arch}-{key}.cubin")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        pass
    log.info("INIT", "compiling gpucoll/kernels/coll.cu with NVRTC (%s)", " ".join(options))
    image = _nvrtc_compile(source, options)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".coll-")
    with os.fdopen(fd, "wb") as f:
        f.write(image)
    os.replace(tmp, path)  # atomic: ranks compiling at once all leave one good file
    return image


class Kernels:
    """Function handles of the loaded modules of one device (cached per dtype)."""

    def __init__(self, arch):
        self.arch = arch
        self._mods = {}

    def _load(self, define, names):
        mod = cuda.module_load(cubin(define, self.arch))
        return {name: cuda.module_function(mod, name) for name in names}

    def reduce(self, code):
        fns = self._mods.get(code)
        if fns is None:
            fns = self._mods[code] = self._load(f"GC_T={C_TYPES[code]}", REDUCE_KERNELS)
        return fns

    def copy(self):
        fns = self._mods.get("copy")
        if fns is None:
            fns = self._mods["copy"] = self._load("GC_COPY", COPY_KERNELS)
        return fns
