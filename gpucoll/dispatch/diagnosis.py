"""What a failed collective means: the one place that turns an engine's error into the error
the caller sees.

Every failure of a call, whichever engine ran it (the general path, a native fast path, a
GPU call's host-side agreement), goes through `Diagnosis.failed`, which names the call, its
sequence number and the communicator, and says what the other ranks know:

- a mismatch found by this rank is told to the others through the store, and the
  communicator is marked unusable (`broken`); a timeout or a lost peer becomes the mismatch
  another rank found, if it found one;
- a timeout of a schedule names the ranks that never reached the call (the ranks blocked in
  the same call say so in the store), or the mismatch that their signatures show;
- a lost peer names the ranks of this host whose process is really gone.
"""
import json
import time

from ..base.call import describe
from ..base.errors import GpucollError, LostPeerError, MismatchError, RevokedError
from ..base.errors import TimeoutError as GpucollTimeout
from ..base.ranks import ranges

_FIELDS = ("operation", "count", "dtype", "op", "root")


class Diagnosis:
    def __init__(self, view, timeout, on_broken=None):
        self.view = view
        self.timeout = timeout
        self.broken = None          # why this communicator cannot run collectives any more
        self._on_broken = on_broken  # closes what a mismatch leaves out of step (the schedules' channels)

    def _store(self):
        return getattr(self.view.ctx.boot, "store", None)

    def check_alive(self):
        """Raise LostPeerError naming the ranks of this communicator whose process is known
        to have ended (of this host: see Context.has_ended): every collective needs every
        rank, so a wait for set-up need not go on."""
        dead = self.view.dead_ranks()
        if dead:
            raise LostPeerError(f"the process of rank(s) {ranges(dead)} has ended", ranks=dead)

    def failed(self, call, algo, exc):
        """Raise what call #call.seq's failure `exc` means (algo: the algorithm that ran it,
        None when it failed before one was chosen)."""
        h = self.view
        err = exc
        if isinstance(exc, RevokedError):
            h.revoked()   # every later call raises it too, before any wait
        if algo not in (None, "hierarchical"):
            err = self._call_failed(exc)
        if isinstance(err, GpucollTimeout) and not getattr(err, "ranks", ()):
            err = self._name_late_ranks(err, call)
        elif isinstance(err, LostPeerError) and algo != "direct":
            # The direct engine names who is gone from its segment; a look at the processes now
            # would add survivors that have ended since their own report.
            self._name_dead_ranks(err)
        err.args = (f"{call.kind} #{call.seq} on communicator {h.name} (rank {h.rank} of {h.size}): "
                    f"{err.args[0] if err.args else err}",) + err.args[1:]
        if err is exc:
            raise err
        raise err from exc

    # --- mismatched calls (without GPUCOLL_DEBUG_CHECKS) ------------------------------------------
    # The direct engine compares call signatures in its segment, the executor the message headers
    # (count, dtype, op, root). A rank that finds a mismatch says so in the store and closes its
    # channels: the ranks waiting for it then fail at once (lost peer), or at their deadline, and
    # report the mismatch it found instead. The communicator is unusable afterwards.
    def _mismatch_key(self):
        return f"gpucoll/mismatch/{self.view.id}/report"

    def _call_failed(self, exc):
        """The error to raise for `exc`: a mismatch is told to the others; a timeout or a lost
        peer becomes the mismatch another rank found, if it found one."""
        if isinstance(exc, MismatchError):
            self.tell_mismatch(exc)
            return exc
        if not isinstance(exc, (GpucollTimeout, LostPeerError)):
            return exc
        store = self._store()
        try:
            if store is None or not store.num_keys(self._mismatch_key()):
                return exc
            told = json.loads(store.get(self._mismatch_key(), timeout=1.0))
        except GpucollError:
            return exc
        err = MismatchError(f"rank {told['by']} found: {told['message']}")
        err.ranks = tuple(told["ranks"])
        self.tell_mismatch(err, store=False)
        return err

    def tell_mismatch(self, exc, store=True):
        """Mark the communicator unusable after mismatch `exc`; tell the other ranks (store)."""
        h = self.view
        message = exc.args[0] if exc.args else str(exc)
        self.broken = f"rank {h.rank} found mismatched calls: {message}"
        st = self._store() if store else None
        if st is not None:
            told = {"by": h.rank, "ranks": list(getattr(exc, "ranks", ())), "message": message}
            try:
                st.compare_set(self._mismatch_key(), None, json.dumps(told).encode())
            except GpucollError:
                pass
        if self._on_broken is not None:
            self._on_broken()

    def _name_dead_ranks(self, exc):
        """A schedule notices a lost peer through the neighbour it talks to, which may only
        have left the call because it saw the failure first. Name the ranks of this host whose
        process is really gone."""
        dead = self.view.dead_ranks()
        if dead and set(dead) != set(getattr(exc, "ranks", ())):
            exc.ranks = tuple(dead)
            exc.args = (f"{exc.args[0] if exc.args else exc}; the process of rank(s) "
                        f"{ranges(dead)} has ended",) + exc.args[1:]

    def _name_late_ranks(self, exc, call):
        """A schedule that times out only knows the peer it waited for, which may itself be
        waiting for someone else. Ranks that time out in call `seq` say so in the store, with
        the signature of their call; the ranks that have not said so within a short grace never
        reached the call (or are stuck before it), and are named in the error and in
        `exc.ranks`. When ranks that did time out called it differently (a bcast whose ranks
        all wait for a different root), the error returned is that MismatchError instead."""
        h = self.view
        store = self._store()
        if store is None or h.size == 1:
            return exc
        prefix = f"gpucoll/late/{h.id}/{call.seq}/"
        # Ranks blocked in the same call time out within the spread of their arrival times.
        began = time.monotonic()
        deadline = began + min(self.timeout, 2.0)
        try:
            store.set(prefix + f"sig/{h.rank}", json.dumps(call.signature()).encode())
            store.add(prefix + str(h.rank), 1)
            while True:
                late = [r for r in range(h.size) if r != h.rank and store.add(prefix + str(r), 0) == 0]
                if not late or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            sigs = {r: tuple(json.loads(store.get(prefix + f"sig/{r}", timeout=1.0)))
                    for r in range(h.size) if r != h.rank and r not in late}
        except GpucollError:  # no store to ask: keep what the schedule knew
            return exc
        mine = call.signature()
        differ = sorted(r for r, sig in sigs.items() if sig != mine)
        if differ:
            err = MismatchError(f"rank {differ[0]} called {describe(sigs[differ[0]])}, this rank "
                                f"{describe(mine)} (found after a timeout); every rank must call "
                                "collectives in the same order with matching counts, dtypes, ops and roots")
            err.ranks = tuple(differ)
            self.tell_mismatch(err)
            return err
        if late:
            # Say how long the extra wait was, so that the time in the message adds up to when
            # the error came.
            exc.ranks = tuple(late)
            exc.args = (f"{exc.args[0] if exc.args else exc}; rank(s) {', '.join(map(str, late))} did not "
                        f"reach this call in {time.monotonic() - began:.1f} s more either (every other rank "
                        "timed out inside it)",) + exc.args[1:]
        return exc


def compare_signatures(rows):
    """GPUCOLL_DEBUG_CHECKS: raise MismatchError naming the ranks that differ, unless every
    row (rank r's Call.signature()) is alike."""
    rows = [tuple(int(v) for v in row) for row in rows]
    if all(row == rows[0] for row in rows):
        return
    groups = {}  # signature -> ranks that called it, so a large job gets a short message
    for r, row in enumerate(rows):
        groups.setdefault(row, []).append(r)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    described = []
    for sig, ranks in ordered:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"
        described.append(f"{who}: {describe(sig)}")
    differing = sorted({_FIELDS[j] for row in rows for j in range(len(row)) if row[j] != rows[0][j]})
    err = MismatchError(f"ranks called different collectives (differing: {', '.join(differing)}); "
                        + "; ".join(described))
    err.ranks = tuple(sorted(r for _, ranks in ordered[1:] for r in ranks))  # all but the largest group
    raise err
