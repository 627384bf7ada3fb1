"""The point-to-point channels of this process: one per peer process, opened on first use.

Point to point has no communicator-wide moment at which both sides of a pair could build
their channel together (a rank may wait with ANY_SOURCE for a peer it never names), so a
channel is built by one side and announced to the other through the process's one TCP
listener (transports/tcp.py), on a connection that proves the job's secret like every other:

- the lower world rank of a pair always builds: it creates the shared-memory segment (one
  host, unless GPUCOLL_SHM_DISABLE=1) or connects the TCP stripes (claims with comm id
  "p2p"), hands the channel to the engine, then connects once more with the claim "p2p/open"
  to say so; the higher rank's listener then attaches the segment, or takes the stripes, and
  hands its side to the engine;
- a higher rank that needs the channel first asks the lower one to build it (claim
  "p2p/ask") and waits until the announcement has arrived.

Setting up runs on short-lived threads (never on the listener's own thread, which must keep
handshaking the stripes it waits for); the messages themselves never pass through Python.
"""
import socket
import threading
import time

from ..base import config, log
from ..base.errors import GpucollError, LostPeerError
from ..base.errors import TimeoutError as GpucollTimeout
from . import handshake, net
from .handshake import Claim, HandshakeError, Purpose

COMM_ID = "p2p"             # the channels' id among the collectives' (shm segment names, TCP claims)
OPEN, ASK = "p2p/open", "p2p/ask"
SHM_EAGER_MAX = 16 << 10    # within a host, larger messages are read from the sender's memory
TCP_EAGER_MAX = 256 << 10   # between hosts, larger messages wait for their receive (no unexpected copy);
                            # up to this size a round trip costs more than the copy an early message takes


class Links:
    """ctx: the process's world.Context; engine: its gpucoll._native.p2p.P2PCore."""

    def __init__(self, ctx, engine):
        self._ctx, self._engine = ctx, engine
        self._cond = threading.Condition()
        self._chans = {}         # world rank -> the channel object (kept alive behind its pointer)
        self.ready = self._chans  # `peer in links.ready`: no set-up is due (read without a lock)
        self._opening = set()    # world ranks whose channel this process is building
        self._failed = {}        # world rank -> why building it failed
        self._shm = None
        self._use_shm = not config.SHM_DISABLE.get()
        self._serving = False
        self.add_peers([w for w in range(ctx.size) if ctx.pids[w] is not None])

    def add_peers(self, peers):
        """Tell the engine of world ranks `peers` (all of them at start, spawned ones later)."""
        ctx = self._ctx
        self._engine.grow(ctx.size)
        for peer in peers:
            if peer == ctx.rank:
                continue
            local = self._same_host(peer)
            pid = ctx.watch_pid(peer)
            self._engine.set_peer(peer, pid, bool(local and pid), SHM_EAGER_MAX if local else TCP_EAGER_MAX)
        if self._shm is not None:
            self._shm.pids = list(ctx.pids)
            self._shm.watch = [ctx.watch_pid(w) for w in range(ctx.size)]
        if ctx.size > 1:
            self.serve()

    def serve(self):
        """Take announcements on the process's listener (once there is another process to make them)."""
        if not self._serving:
            self._serving = True
            self._ctx.tcp().serve(Purpose.P2P, self._announced)

    def _same_host(self, peer):
        return self._use_shm and self._ctx.hosts[peer] == self._ctx.hosts[self._ctx.rank]

    def _shm_channels(self):
        if self._shm is None:
            from .shm import ShmChannels
            from .shm_segment import JobSegments

            ctx = self._ctx
            self._shm = ShmChannels(JobSegments(ctx.job_id, ctx.secret), COMM_ID, ctx.rank, ctx.pids,
                                    watch=[ctx.watch_pid(w) for w in range(ctx.size)],
                                    timeout=config.INIT_TIMEOUT.get())
        return self._shm

    # --- the side that needs a channel ----------------------------------------------------------
    def ensure(self, peer):
        """Make sure the channel to world rank `peer` exists (built here, or asked for)."""
        if peer in self._chans or peer == self._ctx.rank:
            return
        if peer >= self._ctx.size or self._ctx.pids[peer] is None:
            self._ctx.look_up(peer)
        if self._ctx.rank < peer:
            self._build(peer)
            return
        with self._cond:
            if peer in self._chans:
                return
            asked = peer in self._opening
            self._opening.add(peer)
        if not asked:
            try:
                self._announce(peer, ASK)
            except GpucollError:
                with self._cond:
                    self._opening.discard(peer)
                raise
        self._await(peer)

    def _await(self, peer):
        timeout = config.INIT_TIMEOUT.get()
        deadline = time.monotonic() + timeout
        with self._cond:
            while peer not in self._chans:
                if peer in self._failed:
                    raise LostPeerError(f"point to point with rank {peer}: {self._failed[peer]}", ranks=[peer])
                if self._ctx.has_ended(peer):
                    raise LostPeerError(f"point to point with rank {peer}: its process has ended", ranks=[peer])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GpucollTimeout(f"rank {self._ctx.rank}: rank {peer} did not open its point-to-point "
                                         f"channel within {timeout:g} s (GPUCOLL_INIT_TIMEOUT)")
                self._cond.wait(min(left, 0.25))

    def _build(self, peer):
        """The lower rank's side: build the channel, hand it over, announce it (once)."""
        with self._cond:
            while peer in self._opening and peer not in self._chans:
                self._cond.wait(0.25)
            if peer in self._chans:
                return
            self._opening.add(peer)
        try:
            self._register(peer, *self._channel_to(peer))
            self._announce(peer, OPEN)
        except BaseException as exc:
            with self._cond:
                self._failed[peer] = str(exc)
                self._cond.notify_all()
            raise
        finally:
            with self._cond:
                self._opening.discard(peer)
                self._cond.notify_all()

    def _announce(self, peer, what):
        address = self._ctx.tcp_addresses[peer]
        host, _, port = address.rpartition(":")
        timeout = config.INIT_TIMEOUT.get()
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=handshake.HANDSHAKE_TIMEOUT)
                break
            except OSError as exc:
                if time.monotonic() > deadline or self._ctx.has_ended(peer):
                    raise LostPeerError(f"rank {self._ctx.rank}: cannot reach rank {peer} at {address} for point "
                                        f"to point: {exc}", ranks=[peer]) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            handshake.connect(sock, self._ctx.secret, Claim(Purpose.P2P, self._ctx.rank, peer, what),
                              handshake.HANDSHAKE_TIMEOUT)
        except (HandshakeError, OSError) as exc:
            raise LostPeerError(f"rank {self._ctx.rank}: point-to-point handshake with rank {peer} at {address} "
                                f"failed: {exc}", ranks=[peer]) from None
        finally:
            sock.close()

    def _register(self, peer, chan, how):
        with self._cond:
            self._chans[peer] = chan
            self._engine.set_channel(peer, chan.ptr)
            self._cond.notify_all()
        log.info("P2P", "point to point with rank %d (%s) via %s", peer, self._ctx.hosts[peer], how)

    # --- the side that is told (the listener's thread) ---------------------------------------------
    def _announced(self, conn, claim):
        """A peer proved the secret and says "p2p/open" or "p2p/ask" (on the listener's thread)."""
        conn.close()
        peer = claim.sender
        if peer < 0 or peer == self._ctx.rank:
            raise ValueError(f"a point-to-point announcement from rank {peer} makes no sense")
        if claim.comm_id == OPEN and peer < self._ctx.rank:
            target = self._take
        elif claim.comm_id == ASK and peer > self._ctx.rank:
            target = self._build
        else:
            raise ValueError(f"unknown point-to-point announcement {claim.comm_id!r} from rank {peer}")
        threading.Thread(target=self._quietly, args=(target, peer), daemon=True,
                         name=f"gpucoll-p2p-link-{peer}").start()

    def _quietly(self, fn, peer):
        try:
            if peer >= self._ctx.size or self._ctx.pids[peer] is None:
                self._ctx.look_up(peer)  # spawned after this process joined, and not known here yet
            fn(peer)
        except Exception as exc:  # whoever waits for this channel sees _failed; say it once here too
            with self._cond:
                self._failed.setdefault(peer, str(exc))
                self._cond.notify_all()
            log.warn("P2P", "point-to-point channel with rank %d: %s", peer, exc)

    def _channel_to(self, peer):
        """(channel, how) to peer: shared memory within this host, else the network (net.py)."""
        if self._same_host(peer):
            return self._shm_channels().channel(peer), "SHM"
        return net.channel(self._ctx, peer, COMM_ID, timeout=config.INIT_TIMEOUT.get())

    def _take(self, peer):
        """The higher rank's side of a channel that the lower rank built."""
        if peer in self._chans:
            return
        self._register(peer, *self._channel_to(peer))
        with self._cond:
            self._opening.discard(peer)
            self._cond.notify_all()

    def close_channel(self, peer):
        """Take the channel to `peer` from the engine and close it (the peer sees this process's
        side end; fault tests)."""
        with self._cond:
            chan = self._chans.pop(peer, None)
            self._engine.set_channel(peer, 0)
        if chan is not None:
            chan.close()

    def close(self):
        """At exit: the engine lets go of every channel before they close."""
        with self._cond:
            for peer in list(self._chans):
                self._engine.set_channel(peer, 0)
            self._chans.clear()
        if self._shm is not None:
            self._shm.close()
