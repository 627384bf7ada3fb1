"""MPI-IO: MPI.File over ordinary (POSIX) files that every process of the group opens.

A file's view (displacement, etype, filetype) says which of its bytes a process sees: the
filetype's data bytes, tiled from the displacement. Reads and writes move the packed bytes of
the buffer to and from those positions with pread/pwrite, one call per contiguous run, so
processes writing disjoint parts of a file never overwrite each other's bytes. Offsets and file
pointers count etypes. The individual pointer is the process's own; the shared pointer lives in
an RMA window on rank 0 (win.py) and is advanced atomically with Fetch_and_op; the ordered
calls give each rank its place in rank order. Collective calls are the independent ones plus the
agreement MPI requires (open, close, views, sizes); nonblocking and split calls complete at once.
The data representation is "native" ("internal" is the same here).
"""
import os

import numpy as np

from ..base.errors import InvalidUsageError
from ..base.mpi_constants import INTEGERS as _C
from . import errhandler as _eh
from . import message as _m
from .group import Group
from .handle import Handle
from .info import Info
from .request import Request
from .staging import staged
from .status import reset

MODE = {k: _C[f"MODE_{k}"] for k in ("RDONLY", "RDWR", "WRONLY", "CREATE", "EXCL", "DELETE_ON_CLOSE",
                                      "UNIQUE_OPEN", "SEQUENTIAL", "APPEND")}
SEEK_SET, SEEK_CUR, SEEK_END = _C["SEEK_SET"], _C["SEEK_CUR"], _C["SEEK_END"]


def file_error(message, error_class=None):
    return InvalidUsageError(message, error_class=_C["ERR_FILE"] if error_class is None else error_class)


def _os_error(exc, what, path):
    import errno

    classes = {errno.ENOENT: "ERR_NO_SUCH_FILE", errno.EEXIST: "ERR_FILE_EXISTS", errno.EACCES: "ERR_ACCESS",
               errno.EPERM: "ERR_ACCESS", errno.ENOSPC: "ERR_NO_SPACE", errno.EROFS: "ERR_READ_ONLY",
               errno.EISDIR: "ERR_BAD_FILE"}
    return file_error(f"{what}: {path}: {exc.strerror}", _C[classes.get(exc.errno, "ERR_IO")])


class _View:
    """Which file bytes a process sees: the filetype's data bytes, tiled from disp."""

    def __init__(self, disp, etype, filetype, datarep):
        self.disp, self.etype, self.filetype, self.datarep = disp, etype, filetype, datarep
        ft = filetype._t
        self.tile = ft.size                      # visible bytes per tile
        self.extent = ft.extent
        self.one = ft.byte_index(1)              # their offsets within a tile
        self.contiguous = bool(self.tile == self.extent and np.array_equal(self.one, np.arange(self.tile)))
        self.esize = etype._t.size

    def runs(self, start, nbytes):
        """[(file position, length)] of nbytes visible bytes from visible byte `start`."""
        if nbytes == 0:
            return []
        if self.contiguous:
            return [(self.disp + start, nbytes)]
        if self.tile == 0:
            raise file_error("the view's filetype has no data bytes", _C["ERR_TYPE"])
        j = np.arange(start, start + nbytes, dtype=np.int64)
        tiles, within = np.divmod(j, self.tile)
        pos = self.disp + tiles * self.extent + self.one[within]
        cuts = np.flatnonzero(np.diff(pos) != 1) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [nbytes]])
        return [(int(pos[a]), int(b - a)) for a, b in zip(starts, ends)]

    def visible(self, filesize):
        """How many visible bytes lie before filesize (the end of file, in the view)."""
        if filesize <= self.disp:
            return 0
        if self.contiguous:
            return filesize - self.disp
        whole, rest = divmod(filesize - self.disp, self.extent)
        return whole * self.tile + int(np.count_nonzero(self.one < rest))


_DEFAULT = [_eh.PREDEFINED["ERRORS_RETURN"]._s]  # the error handler of MPI.FILE_NULL


class _FileState:
    __slots__ = ("path", "fd", "amode", "comm", "group", "info", "errhandler", "atomic", "view", "pointer",
                 "shared", "split", "__weakref__")


def _byte():
    from .datatype import NAMES

    return NAMES["BYTE"]


class File(Handle):
    """An open file of a group of processes (File() is MPI.FILE_NULL)."""

    __slots__ = ()
    _kind = "file"

    def __repr__(self):
        return "<gpucoll.MPI.File null>" if self._s is None else f"<gpucoll.MPI.File {self._s.path}>"

    def _st(self, what):
        if self._s is None:
            raise file_error(f"File.{what}: the file is MPI.FILE_NULL")
        return self._s

    # --- opening and closing (collective) -------------------------------------------------------------
    @classmethod
    def Open(cls, comm, filename, amode=None, info=None):
        """Open filename on every process of comm (collective); amode: MPI.MODE_* flags."""
        amode = MODE["RDONLY"] if amode is None else int(amode)
        core = comm._c("File.Open")
        path = os.fsdecode(os.fspath(filename))
        access = [m for m in ("RDONLY", "RDWR", "WRONLY") if amode & MODE[m]]
        if len(access) != 1 or (amode & MODE["RDONLY"] and amode & (MODE["CREATE"] | MODE["EXCL"])) or \
                (amode & MODE["RDWR"] and amode & MODE["SEQUENTIAL"]):
            raise file_error(f"File.Open: amode {amode} must have exactly one of MODE_RDONLY, MODE_RDWR, "
                             "MODE_WRONLY (and no MODE_CREATE or MODE_EXCL with MODE_RDONLY)", _C["ERR_AMODE"])
        flags = {"RDONLY": os.O_RDONLY, "RDWR": os.O_RDWR, "WRONLY": os.O_WRONLY}[access[0]]
        first = flags | (os.O_CREAT if amode & MODE["CREATE"] else 0) | (os.O_EXCL if amode & MODE["EXCL"] else 0)
        fd, problem = None, None
        if core.rank == 0:  # creates it (exclusively when asked) before the others open it
            try:
                fd = os.open(path, first, 0o666)
            except OSError as exc:
                problem = (exc.errno, exc.strerror)
        problem = core.bcast(problem, 0)
        if problem is None and core.rank != 0:
            try:
                fd = os.open(path, flags)
            except OSError as exc:
                problem = (exc.errno, exc.strerror)
        problems = core.allgather(problem)
        bad = next((p for p in problems if p is not None), None)
        if bad is not None:
            if fd is not None:
                os.close(fd)
            raise _os_error(OSError(*bad), "File.Open", path)
        s = _FileState()
        s.path, s.fd, s.amode, s.comm = path, fd, amode, core.Dup()
        s.group = Group._from_ranks(core.world_ranks)
        s.info = dict(info.items()) if info else {}
        s.errhandler = _DEFAULT[0]
        s.atomic, s.split = False, None
        s.view = _View(0, _byte(), _byte(), "native")
        s.pointer = 0
        s.shared = _SharedPointer(comm)
        handle = cls._of(s)._register()
        if amode & MODE["APPEND"]:
            end = handle.Get_size()
            s.pointer = end
            s.shared.set(end)
        return handle

    def Close(self):
        """Close the file (collective); MODE_DELETE_ON_CLOSE removes it."""
        s = self._st("Close")
        s.comm.Barrier()
        os.close(s.fd)
        s.shared.free()
        if s.amode & MODE["DELETE_ON_CLOSE"] and s.comm.rank == 0:
            try:
                os.unlink(s.path)
            except FileNotFoundError:
                pass
        s.comm.Barrier()
        s.comm.Free()
        self._s = None

    def free(self):
        """Close the file unless it is MPI.FILE_NULL (what freeing a file handle means)."""
        if self._s is not None:
            self.Close()

    @classmethod
    def Delete(cls, filename, info=None):
        path = os.fsdecode(os.fspath(filename))
        try:
            os.unlink(path)
        except OSError as exc:
            raise _os_error(exc, "File.Delete", path) from None

    # --- what the file is ---------------------------------------------------------------------------
    def Get_size(self):
        return os.fstat(self._st("Get_size").fd).st_size

    size = property(Get_size)

    def Set_size(self, size):
        """Truncate or extend the file to size bytes (collective)."""
        s = self._st("Set_size")
        if s.comm.rank == 0:
            os.ftruncate(s.fd, int(size))
        s.comm.Barrier()

    def Preallocate(self, size):
        """Make the file at least size bytes long (collective)."""
        s = self._st("Preallocate")
        if s.comm.rank == 0 and os.fstat(s.fd).st_size < size:
            os.ftruncate(s.fd, int(size))
        s.comm.Barrier()

    def Get_amode(self):
        return self._st("Get_amode").amode

    amode = property(Get_amode)

    def Get_group(self):
        return self._st("Get_group").group.Dup()

    group = property(Get_group)
    group_size = property(lambda self: self._st("group_size").comm.size)
    group_rank = property(lambda self: self._st("group_rank").comm.rank)

    def Get_info(self):
        return Info.Create(self._st("Get_info").info)

    def Set_info(self, info):
        self._st("Set_info").info = dict(info.items()) if info else {}

    info = property(Get_info, Set_info)

    def Get_atomicity(self):
        return self._st("Get_atomicity").atomic

    def Set_atomicity(self, flag):
        """Kept (each pwrite is one system call; runs of a non-contiguous view are several)."""
        self._st("Set_atomicity").atomic = bool(flag)

    atomicity = property(Get_atomicity, Set_atomicity)

    def Sync(self):
        os.fsync(self._st("Sync").fd)

    def Get_type_extent(self, datatype):
        self._st("Get_type_extent")
        return datatype.Get_extent()[1]

    # error handlers; MPI.FILE_NULL's is the default of files opened afterwards
    def Get_errhandler(self):
        return _eh.Errhandler._of(_DEFAULT[0] if self._s is None else self._s.errhandler)

    def Set_errhandler(self, errhandler):
        if not errhandler:
            raise file_error("Set_errhandler: the handler is MPI.ERRHANDLER_NULL", _C["ERR_ARG"])
        if self._s is None:
            _DEFAULT[0] = errhandler._s
        else:
            self._s.errhandler = errhandler._s

    def Call_errhandler(self, errorcode):
        _eh.invoke(self._st("Call_errhandler").errhandler, self, errorcode)

    @classmethod
    def Create_errhandler(cls, errhandler_fn):
        return _eh.create(errhandler_fn)

    # --- views ------------------------------------------------------------------------------------------
    def Set_view(self, disp=0, etype=None, filetype=None, datarep="native", info=None):
        """See the file from byte disp through filetype, in units of etype (collective); both file
        pointers go back to 0."""
        s = self._st("Set_view")
        etype = _byte() if etype is None else etype
        filetype = etype if filetype is None else filetype
        if datarep not in ("native", "internal"):
            raise file_error(f"Set_view: data representation {datarep!r} is not supported (native only)",
                             _C["ERR_UNSUPPORTED_DATAREP"])
        if filetype._t.size % max(etype._t.size, 1):
            raise file_error("Set_view: the filetype is not made of whole etypes", _C["ERR_ARG"])
        s.view = _View(int(disp), etype, filetype, datarep)
        s.pointer = 0
        s.comm.Barrier()
        if s.comm.rank == 0:
            s.shared.set(0)
        s.comm.Barrier()

    def Get_view(self):
        """The view (disp, etype, filetype, datarep); derived types come back as new handles."""
        v = self._st("Get_view").view

        def copy(t):
            return t if t.is_predefined else t.Dup()
        return v.disp, copy(v.etype), copy(v.filetype), v.datarep

    # --- data access --------------------------------------------------------------------------------------
    def _io(self, buf, start, write, status, what):
        """Read or write buf at visible byte start; returns the bytes moved."""
        s = self._st(what)
        if write and s.amode & MODE["RDONLY"]:
            raise file_error(f"{what}: the file was opened MODE_RDONLY", _C["ERR_READ_ONLY"])
        if not write and s.amode & MODE["WRONLY"]:
            raise file_error(f"{what}: the file was opened MODE_WRONLY", _C["ERR_ACCESS"])
        msg = _m.simple(buf, write, what=f"{what} buf")
        moved = 0
        if msg is not None and msg.nbytes:
            try:
                if write:
                    data = msg.data()
                    for pos, length in s.view.runs(start, msg.nbytes):
                        os.pwrite(s.fd, data[moved:moved + length], pos)
                        moved += length
                else:
                    chunks = []
                    for pos, length in s.view.runs(start, msg.nbytes):
                        got = os.pread(s.fd, length, pos)
                        chunks.append(got)
                        moved += len(got)
                        if len(got) < length:
                            break
                    msg.store(np.frombuffer(b"".join(chunks), np.uint8))
            except OSError as exc:
                raise _os_error(exc, what, s.path) from None
        if status is not None:
            reset(status)
            status.source, status.tag, status.nbytes = _C["ANY_SOURCE"], _C["ANY_TAG"], moved
        return moved

    def _at(self, offset, buf, write, status, what):
        return _through_host(buf, write, what,
                             lambda host: self._io(host, int(offset) * self._st(what).view.esize, write, status, what))

    def _individual(self, buf, write, status, what):
        return _through_host(buf, write, what, lambda host: self._individual_io(host, write, status, what))

    def _individual_io(self, buf, write, status, what):
        s = self._st(what)
        moved = self._io(buf, s.pointer * s.view.esize, write, status, what)
        s.pointer += moved // s.view.esize
        return moved

    def _shared(self, buf, write, status, what):
        return _through_host(buf, write, what, lambda host: self._shared_io(host, write, status, what))

    def _shared_io(self, buf, write, status, what):
        s = self._st(what)
        msg = _m.simple(buf, write, what=f"{what} buf")
        nbytes = 0 if msg is None else msg.nbytes
        start = s.shared.fetch_add(nbytes // s.view.esize)
        return self._io(buf, start * s.view.esize, write, status, what)

    def _ordered(self, buf, write, status, what):
        return _through_host(buf, write, what, lambda host: self._ordered_io(host, write, status, what))

    def _ordered_io(self, buf, write, status, what):
        s = self._st(what)
        msg = _m.simple(buf, write, what=f"{what} buf")
        mine = (0 if msg is None else msg.nbytes) // s.view.esize
        counts = s.comm.allgather(mine)
        base = s.comm.bcast(s.shared.get() if s.comm.rank == 0 else None, 0)
        start = base + sum(counts[:s.comm.rank])
        moved = self._io(buf, start * s.view.esize, write, status, what)
        s.comm.Barrier()
        if s.comm.rank == 0:
            s.shared.set(base + sum(counts))
        s.comm.Barrier()
        return moved

    def Read_at(self, offset, buf, status=None):
        self._at(offset, buf, False, status, "Read_at")

    def Write_at(self, offset, buf, status=None):
        self._at(offset, buf, True, status, "Write_at")

    def Read(self, buf, status=None):
        self._individual(buf, False, status, "Read")

    def Write(self, buf, status=None):
        self._individual(buf, True, status, "Write")

    def Read_shared(self, buf, status=None):
        self._shared(buf, False, status, "Read_shared")

    def Write_shared(self, buf, status=None):
        self._shared(buf, True, status, "Write_shared")

    def Read_ordered(self, buf, status=None):
        self._ordered(buf, False, status, "Read_ordered")

    def Write_ordered(self, buf, status=None):
        self._ordered(buf, True, status, "Write_ordered")

    # collective forms: the independent ones (each process's part is its own)
    Read_at_all, Write_at_all, Read_all, Write_all = Read_at, Write_at, Read, Write

    # nonblocking forms: done at the call
    def Iread_at(self, offset, buf):
        return _done(self._at, offset, buf, False, "Iread_at")

    def Iwrite_at(self, offset, buf):
        return _done(self._at, offset, buf, True, "Iwrite_at")

    Iread_at_all, Iwrite_at_all = Iread_at, Iwrite_at

    def Iread(self, buf):
        return _done(lambda b, w, st, what: self._individual(b, w, st, what), None, buf, False, "Iread")

    def Iwrite(self, buf):
        return _done(lambda b, w, st, what: self._individual(b, w, st, what), None, buf, True, "Iwrite")

    Iread_all, Iwrite_all = Iread, Iwrite

    def Iread_shared(self, buf):
        return _done(lambda b, w, st, what: self._shared(b, w, st, what), None, buf, False, "Iread_shared")

    def Iwrite_shared(self, buf):
        return _done(lambda b, w, st, what: self._shared(b, w, st, what), None, buf, True, "Iwrite_shared")

    # split collectives: the work is done by *_begin, *_end reports it
    def _begin(self, run, *args):
        s = self._st("split collective")
        if s.split is not None:
            raise file_error("a split collective is already active on this file (call its *_end first)",
                             _C["ERR_OTHER"])
        from .status import Status

        st = Status()
        run(*args, st)
        s.split = st

    def _end(self, status):
        s = self._st("split collective")
        if s.split is None:
            raise file_error("no split collective is active on this file (call a *_begin first)", _C["ERR_OTHER"])
        if status is not None:
            status.source, status.tag, status.nbytes = s.split.source, s.split.tag, s.split.nbytes
        s.split = None

    def Read_at_all_begin(self, offset, buf):
        self._begin(self.Read_at, offset, buf)

    def Write_at_all_begin(self, offset, buf):
        self._begin(self.Write_at, offset, buf)

    def Read_all_begin(self, buf):
        self._begin(self.Read, buf)

    def Write_all_begin(self, buf):
        self._begin(self.Write, buf)

    def Read_ordered_begin(self, buf):
        self._begin(self.Read_ordered, buf)

    def Write_ordered_begin(self, buf):
        self._begin(self.Write_ordered, buf)

    def Read_at_all_end(self, buf, status=None):
        self._end(status)

    Write_at_all_end = Read_all_end = Write_all_end = Read_ordered_end = Write_ordered_end = Read_at_all_end

    # --- file pointers ----------------------------------------------------------------------------------
    def _seek(self, offset, whence, current, what):
        s = self._st(what)
        if whence == SEEK_SET:
            new = offset
        elif whence == SEEK_CUR:
            new = current + offset
        elif whence == SEEK_END:
            new = s.view.visible(os.fstat(s.fd).st_size) // s.view.esize + offset
        else:
            raise file_error(f"{what}: whence {whence} is not SEEK_SET, SEEK_CUR or SEEK_END", _C["ERR_ARG"])
        if new < 0:
            raise file_error(f"{what}: the position would be negative ({new})", _C["ERR_ARG"])
        return int(new)

    def Seek(self, offset, whence=SEEK_SET):
        s = self._st("Seek")
        s.pointer = self._seek(offset, whence, s.pointer, "Seek")

    def Get_position(self):
        return self._st("Get_position").pointer

    def Seek_shared(self, offset, whence=SEEK_SET):
        """Move the shared pointer (collective: every process passes the same arguments)."""
        s = self._st("Seek_shared")
        s.comm.Barrier()
        if s.comm.rank == 0:
            s.shared.set(self._seek(offset, whence, s.shared.get(), "Seek_shared"))
        s.comm.Barrier()

    def Get_position_shared(self):
        return self._st("Get_position_shared").shared.get()

    def Get_byte_offset(self, offset):
        """The file's byte position of view offset `offset` (etypes)."""
        v = self._st("Get_byte_offset").view
        runs = v.runs(int(offset) * v.esize, 1)
        return runs[0][0] if runs else v.disp


class _SharedPointer:
    """The shared file pointer: an 8-byte counter in an RMA window on rank 0."""

    def __init__(self, comm):
        from .win import Win

        self.win = Win.Allocate(8 if comm.Get_rank() == 0 else 0, 8, comm=comm)
        if comm.Get_rank() == 0:
            np.frombuffer(self.win.tomemory(), np.int64)[0] = 0
        self.win.Fence()

    def fetch_add(self, count):
        from .op import PREDEFINED

        before = np.zeros(1, np.int64)
        self.win.Lock(0)
        self.win.Fetch_and_op(np.array([count], np.int64), before, 0, 0, op=PREDEFINED["SUM"])
        self.win.Unlock(0)
        return int(before[0])

    def get(self):
        return self.fetch_add(0)

    def set(self, value):
        from .op import PREDEFINED

        before = np.zeros(1, np.int64)
        self.win.Lock(0)
        self.win.Fetch_and_op(np.array([value], np.int64), before, 0, 0, op=PREDEFINED["REPLACE"])
        self.win.Unlock(0)

    def free(self):
        self.win.Free()


def _through_host(buf, write, what, run):
    """run(buf) with a GPU buffer replaced by a host copy (files are read and written from host
    memory, as a CUDA-aware MPI stages them); what a read put in the copy goes back to the GPU."""
    return staged(what, [(buf, not write, "buf")], run, True)


def _done(run, offset, buf, write, name):
    """Run a data access now; its request is complete (status: the bytes moved)."""
    from .status import Status

    st = Status()
    if offset is None:
        run(buf, write, st, name)
    else:
        run(offset, buf, write, st, name)
    return Request._of(_Moved(st, name))


class _Moved:
    """A finished file access, whose status Wait/Test report."""

    _value = None

    def __init__(self, status, name):
        self.status, self.name = status, name

    def Test(self, status=None):
        if status is not None:
            status.source, status.tag, status.nbytes = self.status.source, self.status.tag, self.status.nbytes
        return True

    Wait = Test

