"""One error path: every native module (core's executor, sock's channels, direct's groups)
turns a failed GC_ERR_* status into an exception through gpucoll.base.errors.native_error, so a
lost peer or a timeout reads the same and names the rank, whichever path met it.

The peers here are real: a socket whose far end is closed, a process that has exited."""
import mmap
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from gpucoll.base import errors
from gpucoll._native import core, direct, sock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEND, RECV = core.SEND, core.RECV


def test_native_status_numbers_match_the_header():
    with open(os.path.join(ROOT, "cython_src", "include", "gc_types.h")) as f:
        header = dict((name, int(value)) for name, value in
                      re.findall(r"#define\s+GC_ERR_(\w+)\s+(-?\d+)", f.read()))
    ours = {name[len("NATIVE_"):]: value for name, value in vars(errors).items() if name.startswith("NATIVE_")}
    assert ours == header


@pytest.mark.parametrize("status, kind", [
    (errors.NATIVE_PEER, errors.LostPeerError), (errors.NATIVE_TIMEOUT, errors.TimeoutError),
    (errors.NATIVE_MISMATCH, errors.MismatchError), (errors.NATIVE_USAGE, errors.InvalidUsageError),
    (errors.NATIVE_IO, errors.GpucollError), (errors.NATIVE_REVOKED, errors.RevokedError),
    (-99, errors.GpucollError)])
def test_each_status_becomes_its_exception_naming_the_ranks(status, kind):
    err = errors.native_error(status, "step 2, receiving from rank 3", (3, 5), waited=1.5, err_no=104)
    assert type(err) is kind, err
    assert err.ranks == (3, 5)
    assert str(err).startswith("step 2, receiving from rank 3"), err
    if status in (errors.NATIVE_PEER, errors.NATIVE_TIMEOUT, errors.NATIVE_IO):
        assert "rank(s) 3, 5" in str(err), err
    if status == errors.NATIVE_TIMEOUT:
        assert "after 1.5 s" in str(err), err
    if status == errors.NATIVE_MISMATCH:
        assert errors.MISMATCH_RULE in str(err), err
    if status == errors.NATIVE_IO:
        assert os.strerror(104) in str(err), err
    assert type(errors.native_error(errors.NATIVE_NOMEM, "x")) is MemoryError


def _tcp_pair():
    """Two connected TCP sockets on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        here = socket.create_connection(server.getsockname())
        there, _ = server.accept()
    return here, there


def _channel():
    """A channel to 'rank 1' over TCP, and the socket at rank 1's end."""
    here, there = _tcp_pair()
    return sock.TcpChannel([here.detach()], peer=1, address="test"), there


def _closed_channel():
    """A channel to 'rank 1' whose other end is already closed."""
    ch, there = _channel()
    there.close()
    return ch


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _lost_on_socket():
    ch = _closed_channel()
    try:
        sock.chan_recv_exact(ch.ptr, 64, timeout=5)
    finally:
        ch.close()


def _receive_in_schedule(ch, timeout):
    """A one-step schedule that receives 16 bytes from rank 1 over channel ch."""
    buf = np.zeros(16, np.float32)
    steps = np.array([[RECV, -1, -1, 0, 0, 1, 1, 0, 16]], np.int64)
    core.run_schedule(steps, np.array([0, ch.ptr], np.uint64), buf.ctypes.data, buf.ctypes.data, 0, 4, 10, 0,
                      timeout)


def _lost_in_schedule():
    ch = _closed_channel()
    try:
        _receive_in_schedule(ch, 5.0)
    finally:
        ch.close()


def _lost_in_direct_group():
    seg = mmap.mmap(-1, direct.segment_size(2, 4096))
    direct.format_segment(seg, 2, 4096, os.getpid(), 7)
    with direct.DirectGroup(seg, 0, 2) as group:
        group.watch([os.getpid(), _dead_pid()])   # rank 1 ended before it attached
        x = np.ones(4, np.float32)
        group.allreduce(x.ctypes.data, x.ctypes.data, 4, 10, 0, 5.0)


@pytest.mark.parametrize("path", [_lost_on_socket, _lost_in_schedule, _lost_in_direct_group],
                         ids=["sock", "core", "direct"])
def test_a_lost_peer_reads_the_same_and_is_named_on_every_path(path):
    with pytest.raises(errors.LostPeerError) as info:
        path()
    assert info.value.ranks == (1,)
    assert "rank(s) 1 is gone: its connection closed or its process ended" in str(info.value), info.value


def _timeout_on_socket():
    ch, there = _channel()
    try:
        sock.chan_recv_exact(ch.ptr, 64, timeout=0.3)
    finally:
        ch.close()
        there.close()


def _timeout_in_schedule():
    ch, there = _channel()
    try:
        _receive_in_schedule(ch, 0.3)
    finally:
        ch.close()
        there.close()


def _timeout_in_direct_group():
    seg = mmap.mmap(-1, direct.segment_size(2, 4096))
    direct.format_segment(seg, 2, 4096, os.getpid(), 7)
    with direct.DirectGroup(seg, 0, 2) as group:
        group.barrier(0.3)   # rank 1 never comes (and is not known to be gone)


@pytest.mark.parametrize("path", [_timeout_on_socket, _timeout_in_schedule, _timeout_in_direct_group],
                         ids=["sock", "core", "direct"])
def test_a_timeout_reads_the_same_and_names_the_rank_on_every_path(path):
    with pytest.raises(errors.TimeoutError) as info:
        path()
    message = str(info.value)
    if path is _timeout_in_schedule:
        # A schedule knows only the neighbour it waited for, which may itself be waiting: it
        # names it in the message and leaves `ranks` to the diagnosis of the late ranks.
        assert info.value.ranks == ()
        assert re.search(r"waiting for data from rank 1 at step 0: timed out after 0\.3\d* s$", message), message
    else:
        assert info.value.ranks == (1,)
        assert re.search(r"timed out after 0\.3\d* s waiting for rank\(s\) 1$", message), message
