/* The schedule executor: runs one rank's steps of a collective over gc_chan channels.
 *
 * A schedule is an int64 array (nsteps, 9) as in docs/internals.md: flags, send_peer, src_buf,
 * src_off, src_count, recv_peer, dst_buf, dst_off, dst_count. Steps run in order; a step with
 * SEND and RECV progresses both directions in one loop and ends when both are done. COPY is a
 * local memmove (a no-op when source and destination coincide); COPY|REDUCE combines the
 * source into the destination locally.
 *
 * Message framing. Every message a step sends is
 *     16-byte header | payload | zero pad to a multiple of GC_CHAN_ALIGN
 * The header is { uint64 payload bytes; uint32 magic; uint8 dtype; uint8 op; uint16 root }
 * (root: the call's root rank mod 2^16, 0xffff for none). It makes an empty message real (16
 * bytes that the receiver must wait for, so a zero-count step still synchronises the pair) and
 * lets the receiver check that the sender runs the same call: a different root, dtype, op or
 * length (compared in that order) is GC_ERR_MISMATCH naming the peer (e->mismatch says
 * which, e->got / e->want the two values) instead of silent corruption, and a wrong magic
 * means the two ranks disagree about where messages start (they ran different schedules).
 * The op travels as the caller gave it (AVG, which reduces as SUM, is not SUM). Headers are at
 * GC_CHAN_ALIGN-aligned stream offsets and rings are multiples of GC_CHAN_ALIGN, so a header
 * and an element never straddle a ring's wrap.
 * After an error the stream position is undefined: the channel must be closed.
 *
 * Data is moved in slices of at most GC_EXEC_SLICE bytes, alternating between the send and the
 * receive half of a step, so that both peers of a sendrecv pipeline (the peer starts reducing
 * the first slice while we copy the second) and the working set stays in cache.
 *
 * Waiting: spin with a pause instruction, then sched_yield() (ranks may outnumber cores: a
 * spinning rank must hand its core to the peer it waits for), then sleep in poll() on the
 * channels' fds, or nanosleep() when none has one. Every ~1 ms without progress the deadline
 * (CLOCK_MONOTONIC ns) and the liveness of the peers waited on are checked.
 */
#ifndef GC_EXEC_H
#define GC_EXEC_H
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include "gc_chan.h"
#include "gc_reduce.h"

enum { GC_STEP_SEND = 1, GC_STEP_RECV = 2, GC_STEP_REDUCE = 4, GC_STEP_COPY = 8 };
enum { GC_COL_FLAGS, GC_COL_SEND_PEER, GC_COL_SRC_BUF, GC_COL_SRC_OFF, GC_COL_SRC_COUNT,
       GC_COL_RECV_PEER, GC_COL_DST_BUF, GC_COL_DST_OFF, GC_COL_DST_COUNT, GC_STEP_COLS };

#define GC_MSG_MAGIC        0x6763736dU     /* "gcsm" */
#define GC_MSG_HDR_BYTES    16u
/* Tunables; -D overrides them for experiments. */
#ifndef GC_EXEC_SLICE
#define GC_EXEC_SLICE       (256u << 10)    /* bytes moved per turn of a direction */
#endif
#ifndef GC_EXEC_SPINS
#define GC_EXEC_SPINS       256             /* idle turns with a pause before yielding */
#endif
#ifndef GC_EXEC_YIELD_NS
#define GC_EXEC_YIELD_NS    2000000LL       /* idle time spent yielding before sleeping */
#endif
#define GC_EXEC_CHECK_NS    1000000LL       /* deadline / liveness check interval while idle */
#define GC_EXEC_SLEEP_NS    50000L          /* one nap when no channel has an fd */

typedef struct {
    uint64_t nbytes;
    uint32_t magic;
    uint8_t dtype;
    uint8_t op;
    uint16_t root;
} gc_msg_hdr;

typedef struct {
    const int64_t *steps;    /* nsteps x GC_STEP_COLS, row-major */
    int64_t nsteps;
    gc_chan *const *chans;   /* indexed by peer rank; NULL where there is no channel */
    int nchans;
    char *bufs[3];           /* send, receive, scratch base addresses */
    int64_t buf_bytes[3];    /* their sizes in bytes, or -1 when unknown (not checked) */
    size_t itemsize;
    gc_dtype dtype;
    gc_op op;                /* AVG reduces as SUM here (the caller divides at the end) */
    int root;                /* the call's root rank, -1 for none: checked, not used */
    int64_t deadline_ns;     /* CLOCK_MONOTONIC; <= 0 means none */
    const volatile int32_t *revoked;  /* non-NULL: the run fails with GC_ERR_REVOKED once it is
                                       * non-zero (ULFM's revoke, set by another thread; looked
                                       * at with the deadline, while idle) */
} gc_exec_args;

/* Which field of a peer's message header differed from what this rank expects. */
enum { GC_MISMATCH_NONE, GC_MISMATCH_MAGIC, GC_MISMATCH_BYTES, GC_MISMATCH_DTYPE, GC_MISMATCH_OP,
       GC_MISMATCH_ROOT };

/* What went wrong, for the error message: the peer (-1 when none), the step (-1 when the
 * arguments as a whole are wrong), a static description, and for a mismatched message the
 * field (mismatch) and the peer's value of it against this rank's (payload bytes, dtype or op
 * code); errno_ for GC_ERR_IO. */
typedef struct {
    int code;
    int peer;
    int64_t step;
    const char *what;
    int64_t got, want;
    int mismatch;
    int errno_;
} gc_exec_err;

static inline int gc__fail(gc_exec_err *e, int code, int peer, const char *what)
{
    e->code = code;
    e->peer = peer;
    e->what = what;
    if (code == GC_ERR_IO)
        e->errno_ = errno;
    return code;
}

static inline int64_t gc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void gc_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline size_t gc_pad16(size_t n) { return (GC_CHAN_ALIGN - n % GC_CHAN_ALIGN) % GC_CHAN_ALIGN; }

/* Check every step before touching any data, so a bad schedule fails whole, not half-done. */
static int gc_exec_check(const gc_exec_args *a, gc_exec_err *e)
{
    size_t isz = a->itemsize;
    e->step = -1;
    if (!(isz == 1 || isz == 2 || isz == 4 || isz == 8 || isz == 16))
        return gc__fail(e, GC_ERR_USAGE, -1, "itemsize must be 1, 2, 4, 8 or 16");
    if ((unsigned)a->dtype >= GC_NUM_DTYPES)
        return gc__fail(e, GC_ERR_USAGE, -1, "unknown dtype code");
    for (int64_t s = 0; s < a->nsteps; s++) {
        const int64_t *st = a->steps + s * GC_STEP_COLS;
        int64_t fl = st[GC_COL_FLAGS];
        e->step = s;
        if (fl & ~(int64_t)(GC_STEP_SEND | GC_STEP_RECV | GC_STEP_REDUCE | GC_STEP_COPY))
            return gc__fail(e, GC_ERR_USAGE, -1, "unknown flag bits");
        if ((fl & GC_STEP_COPY) && (fl & (GC_STEP_SEND | GC_STEP_RECV)))
            return gc__fail(e, GC_ERR_USAGE, -1, "COPY cannot be combined with SEND or RECV");
        if ((fl & GC_STEP_REDUCE) && !gc_op_valid(a->dtype, a->op))
            return gc__fail(e, GC_ERR_USAGE, -1, "the op is not defined for this dtype");
        int uses_src = (fl & (GC_STEP_SEND | GC_STEP_COPY)) != 0;
        int uses_dst = (fl & (GC_STEP_RECV | GC_STEP_COPY)) != 0;
        for (int dir = 0; dir < 2; dir++) {
            int64_t want = dir ? GC_STEP_RECV : GC_STEP_SEND;
            int64_t p = st[dir ? GC_COL_RECV_PEER : GC_COL_SEND_PEER];
            if ((fl & want) && (p < 0 || p >= a->nchans || a->chans[p] == NULL))
                return gc__fail(e, GC_ERR_USAGE, (int)p, "no channel to this peer");
        }
        for (int dir = 0; dir < 2; dir++) {
            if (!(dir ? uses_dst : uses_src))
                continue;
            int64_t b = st[dir ? GC_COL_DST_BUF : GC_COL_SRC_BUF];
            int64_t off = st[dir ? GC_COL_DST_OFF : GC_COL_SRC_OFF];
            int64_t n = st[dir ? GC_COL_DST_COUNT : GC_COL_SRC_COUNT];
            if (b < 0 || b > 2 || off < 0 || n < 0)
                return gc__fail(e, GC_ERR_USAGE, -1, "buffer index, offset or count out of range");
            if (n > 0 && a->bufs[b] == NULL)
                return gc__fail(e, GC_ERR_USAGE, -1, "the step uses a buffer that was not given");
            if (a->buf_bytes[b] >= 0 && (off + n) * (int64_t)isz > a->buf_bytes[b])
                return gc__fail(e, GC_ERR_USAGE, -1, "the step runs past the end of its buffer");
        }
        if ((fl & GC_STEP_COPY) && st[GC_COL_SRC_COUNT] != st[GC_COL_DST_COUNT])
            return gc__fail(e, GC_ERR_USAGE, -1, "COPY with different source and destination counts");
    }
    e->step = -1;
    return GC_OK;
}

/* The send half of a step: header, then payload, then pad. */
typedef struct {
    gc_chan *c;
    gc_msg_hdr hdr;
    const char *ptr;
    size_t done, total;      /* bytes of the framed message pushed / to push */
    size_t payload;
} gc__tx;

/* The receive half: header check, then payload (copied or reduced), then pad. */
typedef struct {
    gc_chan *c;
    char *dst;
    size_t expect;           /* payload bytes */
    size_t done;             /* payload bytes delivered */
    size_t pad_left;
    int have_hdr;
    int reduce;
} gc__rx;

/* Returns bytes pushed (> 0 is progress), 0, or a GC_ERR_*. */
static inline ssize_t gc__tx_progress(gc__tx *t)
{
    static const char zeros[GC_CHAN_ALIGN] = {0};
    size_t moved = 0;
    while (t->done < t->total && moved < GC_EXEC_SLICE) {
        const char *src;
        size_t len;
        if (t->done < GC_MSG_HDR_BYTES) {
            src = (const char *)&t->hdr + t->done;
            len = GC_MSG_HDR_BYTES - t->done;
        } else if (t->done < GC_MSG_HDR_BYTES + t->payload) {
            size_t o = t->done - GC_MSG_HDR_BYTES;
            src = t->ptr + o;
            len = t->payload - o;
            if (len > GC_EXEC_SLICE - moved)
                len = GC_EXEC_SLICE - moved;
        } else {
            src = zeros;
            len = t->total - t->done;
        }
        ssize_t r = t->c->send(t->c, src, len);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        t->done += (size_t)r;
        moved += (size_t)r;
    }
    return (ssize_t)moved;
}

static inline ssize_t gc__rx_progress(gc__rx *r, const gc_exec_args *a, gc_exec_err *e)
{
    size_t moved = 0;
    const void *p;
    ssize_t n;
    if (!r->have_hdr) {
        n = r->c->peek(r->c, &p);
        if (n < 0)
            return n;
        if ((size_t)n < GC_MSG_HDR_BYTES)
            return 0;
        gc_msg_hdr h;
        memcpy(&h, p, sizeof h);
        if (h.magic != GC_MSG_MAGIC) {
            e->what = "the peer's byte stream is out of step (the ranks ran different schedules)";
            e->mismatch = GC_MISMATCH_MAGIC;
            return GC_ERR_MISMATCH;
        }
        /* The root first: ranks that disagree on it run different schedules, whose
         * lengths differ too, and the root is what the user must fix. */
        if (h.root != (uint16_t)a->root) {
            e->what = "the peer has a different root than this rank";
            e->mismatch = GC_MISMATCH_ROOT;
            e->got = h.root == 0xffff ? -1 : h.root;
            e->want = a->root;
            return GC_ERR_MISMATCH;
        }
        if (h.dtype != (uint8_t)a->dtype) {
            e->what = "the peer sent a different dtype than this rank expects";
            e->mismatch = GC_MISMATCH_DTYPE;
            e->got = h.dtype;
            e->want = (uint8_t)a->dtype;
            return GC_ERR_MISMATCH;
        }
        if (h.op != (uint8_t)a->op) {
            e->what = "the peer reduces with a different op than this rank";
            e->mismatch = GC_MISMATCH_OP;
            e->got = h.op;
            e->want = (uint8_t)a->op;
            return GC_ERR_MISMATCH;
        }
        if (h.nbytes != r->expect) {
            e->what = "the peer sent a different number of bytes than this rank expects";
            e->mismatch = GC_MISMATCH_BYTES;
            e->got = (int64_t)h.nbytes;
            e->want = (int64_t)r->expect;
            return GC_ERR_MISMATCH;
        }
        r->c->consume(r->c, GC_MSG_HDR_BYTES);
        r->have_hdr = 1;
        moved += GC_MSG_HDR_BYTES;
    }
    while (r->done < r->expect && moved < GC_EXEC_SLICE) {
        n = r->c->peek(r->c, &p);
        if (n < 0)
            return n;
        size_t take = (size_t)n, left = r->expect - r->done;
        if (take > left) take = left;
        if (take > GC_EXEC_SLICE) take = GC_EXEC_SLICE;
        if (r->reduce) {
            /* whole elements only; the rest waits for its missing bytes */
            take -= take % a->itemsize;
            if (take)
                gc_reduce(r->dst + r->done, p, take / a->itemsize, a->dtype, a->op);
        } else if (take) {
            memcpy(r->dst + r->done, p, take);
        }
        if (take == 0)
            break;
        r->c->consume(r->c, take);
        r->done += take;
        moved += take;
    }
    while (r->done == r->expect && r->pad_left) {
        n = r->c->peek(r->c, &p);
        if (n < 0)
            return n;
        if (n == 0)
            break;
        size_t take = (size_t)n < r->pad_left ? (size_t)n : r->pad_left;
        r->c->consume(r->c, take);
        r->pad_left -= take;
        moved += take;
    }
    return (ssize_t)moved;
}

/* Run the schedule. Returns GC_OK or a GC_ERR_*, and fills *e on failure. */
static int gc_exec_run(const gc_exec_args *a, gc_exec_err *e)
{
    memset(e, 0, sizeof *e);
    e->peer = -1;
    int rc = gc_exec_check(a, e);
    if (rc != GC_OK)
        return rc;
    const size_t isz = a->itemsize;
    for (int64_t s = 0; s < a->nsteps; s++) {
        const int64_t *st = a->steps + s * GC_STEP_COLS;
        int64_t fl = st[GC_COL_FLAGS];
        e->step = s;
        if (fl & GC_STEP_COPY) {
            size_t n = (size_t)st[GC_COL_SRC_COUNT];
            char *src = a->bufs[st[GC_COL_SRC_BUF]] + st[GC_COL_SRC_OFF] * isz;
            char *dst = a->bufs[st[GC_COL_DST_BUF]] + st[GC_COL_DST_OFF] * isz;
            if (n == 0 || src == dst)
                continue;
            if (fl & GC_STEP_REDUCE)
                gc_reduce2(dst, dst, src, n, a->dtype, a->op);
            else
                memmove(dst, src, n * isz);
            continue;
        }
        int sending = (fl & GC_STEP_SEND) != 0, receiving = (fl & GC_STEP_RECV) != 0;
        gc__tx tx;
        gc__rx rx;
        if (sending) {
            memset(&tx, 0, sizeof tx);
            tx.c = a->chans[st[GC_COL_SEND_PEER]];
            tx.payload = (size_t)st[GC_COL_SRC_COUNT] * isz;
            tx.ptr = a->bufs[st[GC_COL_SRC_BUF]] + st[GC_COL_SRC_OFF] * isz;
            tx.hdr.nbytes = tx.payload;
            tx.hdr.magic = GC_MSG_MAGIC;
            tx.hdr.dtype = (uint8_t)a->dtype;
            tx.hdr.op = (uint8_t)a->op;
            tx.hdr.root = (uint16_t)a->root;
            tx.total = GC_MSG_HDR_BYTES + tx.payload + gc_pad16(tx.payload);
        }
        if (receiving) {
            memset(&rx, 0, sizeof rx);
            rx.c = a->chans[st[GC_COL_RECV_PEER]];
            rx.expect = (size_t)st[GC_COL_DST_COUNT] * isz;
            rx.dst = a->bufs[st[GC_COL_DST_BUF]] + st[GC_COL_DST_OFF] * isz;
            rx.pad_left = gc_pad16(rx.expect);
            rx.reduce = (fl & GC_STEP_REDUCE) != 0;
        }
        int idle = 0, gone = 0;  /* gone: 1 the send's peer, 2 the receive's, has ended */
        int64_t idle_since = 0, last_check = 0;
        for (;;) {
            int tx_open = sending && tx.done < tx.total;
            int rx_open = receiving && (!rx.have_hdr || rx.done < rx.expect || rx.pad_left);
            if (!tx_open && !rx_open)
                break;
            ssize_t progress = 0, r;
            if (tx_open) {
                r = gc__tx_progress(&tx);
                if (r < 0)
                    return gc__fail(e, (int)r, (int)st[GC_COL_SEND_PEER], "sending failed");
                progress += r;
            }
            if (rx_open) {
                r = gc__rx_progress(&rx, a, e);
                if (r < 0)
                    return gc__fail(e, (int)r, (int)st[GC_COL_RECV_PEER],
                                    r == GC_ERR_MISMATCH ? e->what : "receiving failed");
                progress += r;
            }
            if (progress) {
                idle = 0;
                continue;
            }
            if (gone)   /* it ended, and one more pass found nothing it left behind */
                return gc__fail(e, GC_ERR_PEER,
                                (int)(gone == 1 ? st[GC_COL_SEND_PEER] : st[GC_COL_RECV_PEER]),
                                gone == 1 ? "sending to" : "receiving from");
            /* idle: back off by stages, and look at the clock only once spinning is over */
            if (++idle <= GC_EXEC_SPINS) {
                gc_cpu_relax();
                continue;
            }
            int64_t now = gc_now_ns();
            if (idle == GC_EXEC_SPINS + 1) {
                idle_since = now;
                last_check = now;
            }
            if (now - last_check >= GC_EXEC_CHECK_NS) {
                last_check = now;
                if (a->revoked && *a->revoked)
                    return gc__fail(e, GC_ERR_REVOKED, -1, "the communicator was revoked while waiting");
                if (a->deadline_ns > 0 && now >= a->deadline_ns) {
                    /* name the peer we are still waiting for: the sender if the receive is
                     * open (nothing to read is the usual reason), else the receiver */
                    return gc__fail(e, GC_ERR_TIMEOUT,
                                    (int)(rx_open ? st[GC_COL_RECV_PEER] : st[GC_COL_SEND_PEER]),
                                    rx_open ? "waiting for data from" : "waiting for room toward");
                }
                /* A peer may write its last bytes and exit between the pass above and this
                 * look: one more pass reads what it left before it is called lost. */
                gone = tx_open && !tx.c->alive(tx.c) ? 1 : rx_open && !rx.c->alive(rx.c) ? 2 : 0;
                if (gone)
                    continue;
            }
            if (now - idle_since < GC_EXEC_YIELD_NS) {
                sched_yield();
                continue;
            }
            struct pollfd pf[2];
            int npf = 0;
            if (tx_open && tx.c->fd >= 0)
                /* POLLIN too: a TCP channel's fd is an epoll set, readable when a send can
                 * progress (epoll descriptors never report POLLOUT). */
                pf[npf++] = (struct pollfd){ .fd = tx.c->fd, .events = POLLIN | POLLOUT };
            if (rx_open && rx.c->fd >= 0) {
                if (npf && pf[0].fd == rx.c->fd)
                    pf[0].events |= POLLIN;
                else
                    pf[npf++] = (struct pollfd){ .fd = rx.c->fd, .events = POLLIN };
            }
            /* a channel without an fd (shared memory) still needs polling by hand: nap only
             * briefly then, and sleep in poll() only when every open channel has an fd */
            int all_fds = (!tx_open || tx.c->fd >= 0) && (!rx_open || rx.c->fd >= 0);
            if (npf && all_fds) {
                poll(pf, (nfds_t)npf, 1);
            } else {
                struct timespec ts = { 0, GC_EXEC_SLEEP_NS };
                nanosleep(&ts, NULL);
            }
        }
    }
    e->step = -1;
    return GC_OK;
}

#endif
