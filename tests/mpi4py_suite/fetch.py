"""Fetch mpi4py's own test suite (and demos) from its release on PyPI, once.

The sdist of the pinned release is downloaded from PyPI's file host, its SHA-256 checked,
and `test/`, `demo/` and the pure-Python part of the package (`src/mpi4py`) are extracted
under CACHE (gitignored). Nothing of it is changed.

    python tests/mpi4py_suite/fetch.py      -> prints the folder that holds test/ and demo/
"""
import hashlib
import json
import os
import shutil
import sys
import tarfile
import urllib.request

VERSION = "4.1.2"
SHA256 = "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"
SIMPLE_INDEX = "https://pypi.org/simple/mpi4py/"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("MPI4PY_SUITE_CACHE", os.path.join(ROOT, ".mpi4py-suite"))
_PARTS = ("test/", "demo/", "src/mpi4py/")


def _sdist_url():
    """The sdist's URL, from PyPI's JSON simple index (PEP 691)."""
    req = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    name = f"mpi4py-{VERSION}.tar.gz"
    for f in files:
        if f["filename"] == name:
            return f["url"]
    raise SystemExit(f"PyPI lists no {name}")


def _download(path):
    tmp = path + ".part"
    with urllib.request.urlopen(_sdist_url(), timeout=120) as resp, open(tmp, "wb") as out:
        shutil.copyfileobj(resp, out)
    with open(tmp, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SHA256:
        os.unlink(tmp)
        raise SystemExit(f"mpi4py-{VERSION}.tar.gz has SHA-256 {digest}, expected {SHA256}")
    os.replace(tmp, path)


def fetch():
    """The folder holding test/, demo/ and src/mpi4py of the release (made on first use)."""
    top = os.path.join(CACHE, f"mpi4py-{VERSION}")
    if os.path.isfile(os.path.join(top, "test", "main.py")):
        return top
    os.makedirs(CACHE, exist_ok=True)
    sdist = os.path.join(CACHE, f"mpi4py-{VERSION}.tar.gz")
    if not os.path.isfile(sdist):
        _download(sdist)
    prefix = f"mpi4py-{VERSION}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(prefix) and m.name[len(prefix):].startswith(_PARTS)
                   and (m.isfile() or m.isdir())]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(CACHE, members=members, **safe)
    return top


if __name__ == "__main__":
    print(fetch())
    sys.exit(0)
