"""Forward each rank's stdout and stderr to gpurun's, one whole line at a time.

Every rank writes into its own pipes; gpurun's event loop reads them, cuts the data at
newlines and writes complete lines (tagged `[rank] ` unless --no-tag-output) to its own
stdout or stderr. Only gpurun's one loop writes to those, so the lines of different ranks
never mix, and a line is never split however long it is. The text after the last newline
waits for the rest of its line; at the end of the stream it is written with a newline added.
"""
import collections
import os
import select

from .report import EXIT_USAGE
from .spawn import LaunchError


class Sink:
    """One of gpurun's own file descriptors (1 or 2), written with whole buffers.

    If whoever reads gpurun's output goes away (EPIPE, a closed descriptor), the output
    is dropped but the job goes on: a closed pager must not kill a training run.
    """

    def __init__(self, fd):
        self.fd = fd
        self.broken = False

    def write(self, data):
        """Write all of `data` (bytes) before returning."""
        if self.broken or not data:
            return
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                # Our stdout may have been inherited in non-blocking mode: wait until it drains.
                select.select([], [self.fd], [])
                continue
            except InterruptedError:
                continue
            except OSError:
                self.broken = True
                return
            view = view[n:]


class RankStream:
    """One pipe of one rank (its stdout or its stderr) and where its lines go.

    `prefix` is written before every line (b"" for none); `tee` is a binary file that gets
    the raw bytes as well (--output-dir); with `keep_tail` > 0 the last lines are kept for
    the failure report.
    """

    READ_SIZE = 1 << 16
    #: Kept lines are clipped to this many bytes: the report wants tracebacks, not data.
    TAIL_WIDTH = 2000

    def __init__(self, rank, name, pipe, sink, prefix=b"", tee=None, keep_tail=0):
        self.rank = rank
        self.name = name
        self.pipe = pipe
        self.fd = pipe.fileno()
        self.sink = sink
        self.prefix = prefix
        self.tee = tee
        self.tail = collections.deque(maxlen=keep_tail) if keep_tail else None
        self.closed = False
        # bytearray: appending chunk after chunk of one long line stays linear in its length.
        self._partial = bytearray()

    def pump(self):
        """Read what the pipe holds and forward the complete lines. False at end of stream."""
        try:
            data = os.read(self.fd, self.READ_SIZE)
        except InterruptedError:
            return True
        except OSError:
            data = b""
        if not data:
            self.close()
            return False
        self.feed(data)
        return True

    def feed(self, data):
        """Forward `data`: whole lines now, the rest once its newline arrives."""
        if self.tee is not None:
            self.tee.write(data)
        cut = data.rfind(b"\n")
        if cut < 0:
            self._partial += data
            return
        if self._partial:
            lines = self._partial + data[:cut + 1]
            self._partial = bytearray(data[cut + 1:])
        else:
            lines = data[:cut + 1]
            if cut + 1 < len(data):
                self._partial += data[cut + 1:]
        self._emit(lines)

    def _emit(self, lines):
        # `lines` ends with b"\n"; one write for the whole batch keeps every line in one piece.
        body = lines[:-1]
        if self.prefix:
            self.sink.write(self.prefix + body.replace(b"\n", b"\n" + self.prefix) + b"\n")
        else:
            self.sink.write(lines)
        if self.tail is not None:
            keep = self.tail.maxlen
            self.tail.extend(line[:self.TAIL_WIDTH] for line in bytes(body).rsplit(b"\n", keep)[-keep:])

    def close(self):
        """Flush a last line that has no newline, and close the pipe and the tee file."""
        if self.closed:
            return
        self.closed = True
        if self._partial:
            partial, self._partial = self._partial, bytearray()
            self._emit(partial + b"\n")
        try:
            self.pipe.close()
        except OSError:
            pass
        if self.tee is not None:
            self.tee.close()

    def tail_text(self):
        """The kept last lines, decoded for the report."""
        if not self.tail:
            return []
        return [line.decode("utf-8", "replace") for line in self.tail]


def make_output_dir(path):
    """Create --output-dir (parents too) if it is given; a LaunchError (exit 2) that says
    why when it cannot be created or written."""
    if not path:
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"--output-dir {path}: cannot create it ({exc.strerror or exc})", EXIT_USAGE) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchError(f"--output-dir {path}: cannot write files in it (permission denied)", EXIT_USAGE)


def open_output_file(directory, name):
    """DIR/NAME for a rank's raw output, or a LaunchError (exit 2) that says why not."""
    path = os.path.join(directory, name)
    try:
        return open(path, "wb")
    except OSError as exc:
        raise LaunchError(f"--output-dir {directory}: cannot write {path} ({exc.strerror or exc})",
                          EXIT_USAGE) from None
