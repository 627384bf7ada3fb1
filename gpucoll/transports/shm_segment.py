"""Shared-memory segment files that only this job can use: names, creation, opening, clean-up.

Every segment of a job lives in /dev/shm under a name that nobody without the job secret can
predict, ``gpucoll-<job tag>-<digest>``: the job tag and the digest are HMACs of the secret, so
another user cannot create the file of a communicator before the job does (the job id alone,
which is not a secret, gives nothing away). The trust rules, for the direct segments
(shm_direct.py) and the channel segments of rank pairs (shm.py) alike:

* the creator makes the file with O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600: an existing file of
  that name is never written into. If it is a leftover of this user's whose processes are all
  gone it is removed and the creation retried; anything else raises SharedMemoryError;
* an attacher checks, before it opens the file (lstat) and again on the descriptor (fstat),
  that it is a regular file owned by this process's effective user with no group or other
  permission, opens it without following links, then checks that the header's token (an HMAC
  of the secret and the name) is the job's: a file of the right name that someone else made is
  refused with SharedMemoryError, not waited for, and never written into;
* a job removes, once per process before it first creates a segment, this user's gpucoll
  segments whose processes are all gone (``remove_leftovers``), and gpurun removes what is left
  of its own job's at the end (``JobSegments.unlink_all``)::

    segs = JobSegments(job_id, secret)
    path = segs.path("world/direct")          # /dev/shm/gpucoll-3f2a...-9c41...
    fd = create(path, nbytes, examine)        # or: fd = open_checked(path)
"""
import hashlib
import hmac
import os
import stat

from .._native import core
from ..base import log
from ..base.errors import SharedMemoryError

SHM_DIR = "/dev/shm"
PREFIX = "gpucoll-"
HEADER_BYTES = 4096  # read this much of a file to judge it (every format's header fits)

_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# NONBLOCK: neither a FIFO nor a file lease held by its owner can make an open block
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _own_pidns():
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


PIDNS = _own_pidns()  # pids written in segments are judged only inside this pid namespace


class JobSegments:
    """The names and header tokens of one job's segments, derived from the job's secret.

    `logical` names (what the segment is for: "world/direct", "world.d1/coll/0-1") never
    appear in /dev/shm; the launcher, which knows the job id and the secret, finds the job's
    files by `prefix`."""

    def __init__(self, job_id, secret):
        self.job_id = str(job_id)
        self._key = bytes(secret or b"")
        self.prefix = f"{PREFIX}{self._mac('job')[:6].hex()}-"

    def _mac(self, purpose, text=""):
        message = "\0".join(("gpucoll-shm", purpose, self.job_id, text)).encode()
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def name(self, logical):
        """The file name (no directory) of the segment called `logical` in this job."""
        return self.prefix + self._mac("name", logical)[:16].hex()

    def path(self, logical):
        return os.path.join(SHM_DIR, self.name(logical))

    def token(self, path):
        """The header token of the segment at `path`: nonzero, secret-derived, per name."""
        return int.from_bytes(self._mac("token", os.path.basename(path))[:8], "little") or 1

    def unlink_all(self):
        """Remove every segment name this job left (files of this user only); returns how many."""
        removed = 0
        for name in _listing():
            if name.startswith(self.prefix):
                removed += _unlink_if_same(os.path.join(SHM_DIR, name), None)
        return removed


def create(path, nbytes, token):
    """A descriptor of the new file `path`, created exclusively with mode 0600 and `nbytes` long.

    A file already there is judged from its header: a leftover of this user's with this token
    whose processes are gone is removed and the creation retried; anything else raises
    SharedMemoryError saying what it is and what to do."""
    remove_leftovers_once()
    for _ in range(3):
        try:
            fd = os.open(path, _CREATE_FLAGS, 0o600)
        except FileExistsError:
            _replace_leftover(path, token)
            continue
        try:
            os.fchmod(fd, 0o600)  # the umask could only have removed bits; make it exact
            os.ftruncate(fd, nbytes)
        except BaseException:
            os.close(fd)
            unlink_quietly(path)
            raise
        return fd
    raise SharedMemoryError(f"{path} keeps reappearing while this rank creates it: another "
                            "process of this user uses the same job id and secret")


def open_checked(path, flags=os.O_RDWR):
    """A descriptor of the existing segment file `path`, or None while there is none.

    Raises SharedMemoryError when the file is not this user's private regular file: it was not
    made by this job. Such a file of another user is not even opened, and nothing is ever
    written into it; the descriptor's own fstat confirms what the name showed."""
    st = _lstat(path)
    if st is None:
        return None
    check_owner(path, st)
    try:
        fd = os.open(path, flags | _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError:  # replaced since: by a link (ELOOP), a FIFO, ... say which
        st = _lstat(path)
        if st is not None:
            check_owner(path, st)
        raise
    try:
        check_owner(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_owner(path, st):
    """Raise SharedMemoryError unless `st` is a regular file of this user with mode 0600 or less."""
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this job's user (uid {os.geteuid()})"
    elif st.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(st.st_mode):04o}: others may read or write it (this job makes 0600)"
    if problem:
        raise squatted(path, problem)


def squatted(path, problem):
    """The error for a segment name held by a file that this job did not make."""
    return SharedMemoryError(
        f"shared-memory segment {path} {problem}. This job did not create it: another user or "
        "process made a file under this job's segment name, and this rank refuses to use it (no "
        "data was written into it). Remove the file (an administrator, if another user owns it) and "
        "start the job again; keep /dev/shm with its sticky bit (mode 1777) so that files cannot "
        "be swapped; set GPUCOLL_SHM_DISABLE=1 to run without shared memory meanwhile.")


def examine(header, token=0):
    """core.SEG_* of a segment file's first bytes, whichever format it has (token 0: any)."""
    from .._native import direct  # here: gpurun cleans up through this module and need not load NumPy
    verdict = direct.examine_segment(header, token)
    if verdict == core.SEG_UNKNOWN:
        verdict = core.examine_channel(header, token, PIDNS)
    return verdict


def _replace_leftover(path, token):
    """`path` exists where this process is about to create it: remove it if it is a leftover of
    an earlier run with the same name, else raise why it cannot be replaced."""
    fd = open_checked(path, os.O_RDONLY)
    if fd is None:
        return
    try:
        st = os.fstat(fd)
        verdict = examine(os.pread(fd, HEADER_BYTES, 0), token)
    finally:
        os.close(fd)
    if verdict == core.SEG_LEFTOVER:
        log.info("SHM", "removed %s, left by an earlier run whose processes are gone", path)
        _unlink_if_same(path, st)
        return
    if verdict == core.SEG_FOREIGN:
        raise squatted(path, "holds a segment with another job's token")
    if verdict == core.SEG_IN_USE:
        raise SharedMemoryError(
            f"shared-memory segment {path} is in use by another live process of this user with the "
            "same job id and secret: two jobs started with the same identity? Give each job its own "
            "GPUCOLL_STORE_SECRET (gpurun does), or wait for the other job to end.")
    raise squatted(path, "exists but holds no gpucoll segment")


def _lstat(path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _listing():
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)]
    except OSError:
        return []


def unlink_quietly(path):
    """Remove a file this process has just created and failed to set up (it may be gone already)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _unlink_if_same(path, st):
    """Unlink `path` if it is still the file `st` described (any file of this user when st is
    None); 1 if removed. Files of other users are never touched."""
    now = _lstat(path)
    if now is None or now.st_uid != os.geteuid():
        return 0
    if st is not None and (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        return 0
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


def remove_leftovers():
    """Remove this user's gpucoll segments that no live process can use any more (left by jobs
    that crashed with no launcher to clean up); returns how many. Segments that a live process
    may still use, those of other pid namespaces and other users' files are kept."""
    removed = 0
    for name in _listing():
        path = os.path.join(SHM_DIR, name)
        st = _lstat(path)
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            continue  # another user's file is not even opened
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            verdict = examine(os.pread(fd, HEADER_BYTES, 0))
        except OSError:
            continue
        finally:
            os.close(fd)
        if verdict == core.SEG_LEFTOVER:
            removed += _unlink_if_same(path, st)
    if removed:
        log.info("SHM", "removed %d shared-memory segment(s) left by ended jobs", removed)
    return removed


_swept_in = None  # pid of the process that has swept: once per process (a forked child sweeps anew)


def remove_leftovers_once():
    global _swept_in
    if _swept_in != os.getpid():
        _swept_in = os.getpid()
        remove_leftovers()
