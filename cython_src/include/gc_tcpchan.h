/* The TCP channel: a gc_chan over several non-blocking TCP sockets to one peer.
 *
 * Striping. The byte stream is cut into fixed chunks; chunk k travels on socket
 * k % nsocks. Both sides derive every byte's socket from its stream offset alone, so the
 * receiver reassembles the exact order without headers or sequence numbers. Each socket
 * keeps its own cursor (the next stream offset it carries); a socket whose kernel buffer
 * is full does not hold back the others:
 *  - send() writes ahead on every socket within what the caller offered and reports the
 *    prefix that is fully written (the minimum cursor). Bytes offered but not taken must
 *    be offered again unchanged on the next call, as with any byte stream: some of them
 *    may already be on the wire.
 *  - the receive side recv()s each socket straight into its place in a ring buffer, as far
 *    as the ring window [head, head + cap) allows; peek() shows the contiguous run that
 *    every socket has filled. The socket carrying the first missing byte always has room in
 *    the window, so no ordering of arrivals can wedge the ring.
 *  - recv_direct() (point to point's large payloads) instead recv()s each socket's chunks of
 *    the next len bytes straight into the caller's buffer, after copying out what the ring
 *    already holds of them; until that run is complete the ring takes nothing.
 *
 * Polling. `fd` is an epoll descriptor over the sockets. It turns readable exactly when a
 * send() or peek() call can make progress: data waits on a socket whose window has room,
 * or a socket whose last write hit EAGAIN has room again. So an idle executor polls
 * `fd` for POLLIN, whatever direction it waits for (an epoll fd never reports POLLOUT).
 * The interest set is kept in step with the cursors, so the fd does not stay readable
 * for work nobody can do (which would make an idle wait spin).
 *
 * Ownership. gc_tcpchan_create() takes the connected sockets; from then on the channel
 * closes them. One thread drives a channel at a time (gc_chan.h).
 */
#ifndef GC_TCPCHAN_H
#define GC_TCPCHAN_H
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gc_chan.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000   /* Linux's value; <poll.h> shows it only under _GNU_SOURCE */
#endif

#define GC_TCP_MAX_SOCKS 64

typedef struct {
    gc_chan base;                       /* first: a gc_tcpchan* is a gc_chan* */
    int nsocks;
    int fds[GC_TCP_MAX_SOCKS];
    uint32_t ev[GC_TCP_MAX_SOCKS];      /* epoll interest registered for each socket */
    uint64_t chunk;                     /* stripe unit in bytes */
    /* send side, in stream offsets */
    uint64_t sent;                      /* every byte before this is written */
    uint64_t soff[GC_TCP_MAX_SOCKS];    /* next byte socket j writes */
    /* receive side */
    char *ring;
    uint64_t cap;
    uint64_t head;                      /* consumed */
    uint64_t tail;                      /* every byte before this arrived */
    uint64_t roff[GC_TCP_MAX_SOCKS];    /* next byte socket j receives */
    uint64_t eofmask;                   /* sockets that reached end of file */
    uint64_t direct_end;                /* while head < this, a recv_direct run: bytes before it go
                                           to the caller's buffer, none to the ring */
    int gone;                           /* 0, or the status every later call returns */
    int err;                            /* errno behind a GC_ERR_IO */
} gc_tcpchan;

/* Set before connect()/listen() so that the window scale negotiated in the handshake
 * fits the buffers (accepted sockets inherit the listener's). sockbuf <= 0 leaves the
 * kernel's autotuning alone, which on Linux often grows further than an explicit size
 * that net.core.[rw]mem_max caps. Returns 0 or -errno. */
static int gc_tcp_tune(int fd, int sockbuf) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) return -errno;
    if (sockbuf > 0) {
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof sockbuf) < 0) return -errno;
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof sockbuf) < 0) return -errno;
    }
    return 0;
}

/* After a chunk of socket j is done its cursor jumps over the other sockets' chunks. */
static inline uint64_t gc_tcp_advance(const gc_tcpchan *t, uint64_t off, uint64_t n) {
    off += n;
    if (off % t->chunk == 0) off += (uint64_t)(t->nsocks - 1) * t->chunk;
    return off;
}

static inline void gc_tcp_want(gc_tcpchan *t, int j, uint32_t ev) {
    if (t->ev[j] == ev) return;
    struct epoll_event e;
    memset(&e, 0, sizeof e);
    e.events = ev;
    e.data.u32 = (uint32_t)j;
    /* A failure only costs a wakeup (the executor's poll has a timeout); ignore it. */
    if (epoll_ctl(t->base.fd, EPOLL_CTL_MOD, t->fds[j], &e) == 0) t->ev[j] = ev;
}

/* Receive interest for socket j: wanted while its next byte fits in the ring window. */
static inline uint32_t gc_tcp_in_wanted(const gc_tcpchan *t, int j) {
    if (t->eofmask & (1ull << j)) return 0;
    return t->roff[j] < t->head + t->cap ? EPOLLIN : 0;
}

static inline int gc_tcp_fail(gc_tcpchan *t, int err) {
    if (!t->gone) {
        if (err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ETIMEDOUT ||
            err == EHOSTUNREACH || err == ENETUNREACH) {
            t->gone = GC_ERR_PEER;
        } else {
            t->gone = GC_ERR_IO;
        }
        t->err = err;
    }
    return t->gone;
}

/* One recv() on socket j of its stream bytes [o, stop) into `to`: 1 when it may be called again
 * (it filled the run, or EINTR), 0 when the socket has nothing more now (a short read: the kernel
 * gave what it held), closed or failed. */
static int gc_tcp_recv_run(gc_tcpchan *t, int j, char *to, uint64_t o, uint64_t stop) {
    ssize_t r = recv(t->fds[j], to, (size_t)(stop - o), MSG_DONTWAIT);
    if (r > 0) {
        t->roff[j] = gc_tcp_advance(t, o, (uint64_t)r);
        return (uint64_t)r == stop - o;
    }
    if (r == 0) {
        /* The peer closed (or died: the kernel closes for it). Bytes still in
         * flight on the other sockets may yet arrive (each FIN follows its own
         * socket's data), so only a missing byte owned by this socket is lost. */
        t->eofmask |= 1ull << j;
        return 0;
    }
    if (errno == EINTR) return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    gc_tcp_fail(t, errno);
    t->eofmask |= 1ull << j;
    return 0;
}

/* The sockets with bytes to read, an end or an error to report, as a bit mask. Asked of the
 * epoll set, which, unlike a recv(), takes no socket lock: polling every socket with recv() in
 * a tight loop cost a message of two TCP segments between two hosts about 2 us more one way
 * (docs/benchmarks.md, "The second segment"). All of them when the set cannot be asked. */
static uint64_t gc_tcp_readable(gc_tcpchan *t) {
    struct epoll_event ev[GC_TCP_MAX_SOCKS];
    int k = epoll_wait(t->base.fd, ev, t->nsocks, 0);
    if (k < 0) return ~0ull;
    uint64_t mask = 0;
    for (int i = 0; i < k; i++)
        if (ev[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) mask |= 1ull << ev[i].data.u32;
    return mask;
}

/* Move whatever the kernel holds into the ring window; failures land in t->gone and
 * t->eofmask, which peek and send report. */
static void gc_tcp_pull(gc_tcpchan *t) {
    if (t->head < t->direct_end) return;   /* a direct run owns the sockets */
    const int n = t->nsocks;
    const int first = (int)((t->tail / t->chunk) % (uint64_t)n);
    const uint64_t readable = gc_tcp_readable(t);
    for (int i = 0; i < n; i++) {
        const int j = (first + i) % n;
        /* a socket the set does not watch for input (its window was full) is asked itself */
        const int ask = (readable & (1ull << j)) || !(t->ev[j] & EPOLLIN);
        while (ask && !(t->eofmask & (1ull << j))) {
            const uint64_t o = t->roff[j];
            const uint64_t lim = t->head + t->cap;
            if (o >= lim) break;
            uint64_t stop = (o / t->chunk + 1) * t->chunk;
            if (stop > lim) stop = lim;
            const uint64_t pos = o % t->cap;
            if (stop - o > t->cap - pos) stop = o + (t->cap - pos);   /* never cross the wrap */
            if (!gc_tcp_recv_run(t, j, t->ring + pos, o, stop)) break;
        }
        gc_tcp_want(t, j, gc_tcp_in_wanted(t, j) | (t->ev[j] & EPOLLOUT));
    }
    uint64_t tail = UINT64_MAX;
    for (int j = 0; j < n; j++)
        if (t->roff[j] < tail) tail = t->roff[j];
    if (tail > t->head + t->cap) tail = t->head + t->cap;
    t->tail = tail;
}

static ssize_t gc_tcp_send(gc_chan *c, const void *buf, size_t len) {
    gc_tcpchan *t = (gc_tcpchan *)c;
    if (t->gone) return t->gone;
    if (t->eofmask) return GC_ERR_PEER;   /* the peer closed: nobody will read this */
    if (len == 0) return 0;
    const int n = t->nsocks;
    const uint64_t base = t->sent, end = base + len;
    const int first = (int)((base / t->chunk) % (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const int j = (first + i) % n;
        uint32_t out = 0;
        for (;;) {
            const uint64_t o = t->soff[j];
            if (o >= end) break;
            /* one socket: its stream is contiguous, so a send is not cut at chunk boundaries */
            uint64_t stop = n > 1 ? (o / t->chunk + 1) * t->chunk : end;
            if (stop > end) stop = end;
            ssize_t r = send(t->fds[j], (const char *)buf + (o - base), (size_t)(stop - o),
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (r > 0) {
                t->soff[j] = gc_tcp_advance(t, o, (uint64_t)r);
                continue;
            }
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                out = EPOLLOUT;   /* wake the executor when this socket drains */
                break;
            }
            return gc_tcp_fail(t, r < 0 ? errno : EPIPE);
        }
        gc_tcp_want(t, j, (t->ev[j] & EPOLLIN) | out);
    }
    uint64_t sent = UINT64_MAX;
    for (int j = 0; j < n; j++)
        if (t->soff[j] < sent) sent = t->soff[j];
    if (sent > end) sent = end;
    t->sent = sent;
    if (sent == base) {
        /* About to go idle: pull waiting data into the ring, so that the fd does not
         * stay readable for bytes nobody peeks at during a send-only wait. */
        gc_tcp_pull(t);
    }
    return (ssize_t)(sent - base);
}

/* gc_chan.stripe_room: bytes of the current chunk not written yet (0 for one socket). */
static uint64_t gc_tcp_stripe_room(gc_chan *c) {
    gc_tcpchan *t = (gc_tcpchan *)c;
    return t->nsocks > 1 ? t->chunk - t->sent % t->chunk : 0;
}

static ssize_t gc_tcp_peek(gc_chan *c, const void **ptr) {
    gc_tcpchan *t = (gc_tcpchan *)c;
    if (!t->gone) gc_tcp_pull(t);
    const uint64_t avail = t->tail - t->head;
    if (avail == 0) {
        *ptr = NULL;
        if (t->gone) return t->gone;
        /* The next byte's socket reached end of file: it will never come. */
        if (t->eofmask & (1ull << ((t->tail / t->chunk) % (uint64_t)t->nsocks))) return GC_ERR_PEER;
        return 0;   /* nothing yet */
    }
    const uint64_t pos = t->head % t->cap;
    *ptr = t->ring + pos;
    return (ssize_t)(avail < t->cap - pos ? avail : t->cap - pos);
}

/* Copy ring bytes of stream offsets [head, end) to dst (offset head at dst[0]): what each socket
 * received of them before a direct run began (socket j holds its chunks' bytes below roff[j]). */
static void gc_tcp_ring_to(const gc_tcpchan *t, char *dst, uint64_t end) {
    const int n = t->nsocks;
    for (uint64_t o = t->head; o < end;) {
        const uint64_t stop = (o / t->chunk + 1) * t->chunk < end ? (o / t->chunk + 1) * t->chunk : end;
        const uint64_t have = t->roff[(o / t->chunk) % (uint64_t)n];
        for (uint64_t at = o; at < (have < stop ? have : stop);) {
            const uint64_t pos = at % t->cap, upto = have < stop ? have : stop;
            const uint64_t run = upto - at < t->cap - pos ? upto - at : t->cap - pos;
            memcpy(dst + (at - t->head), t->ring + pos, (size_t)run);
            at += run;
        }
        o = stop;
    }
}

/* gc_chan.recv_direct: each socket recv()s its chunks of [head, head + len) straight into dst. */
static ssize_t gc_tcp_recv_direct(gc_chan *c, void *dst, size_t len) {
    gc_tcpchan *t = (gc_tcpchan *)c;
    const uint64_t head = t->head, end = head + len;
    const int n = t->nsocks;
    if (len == 0) return 0;
    if (t->direct_end <= head) {        /* a new run: the bytes of it the ring holds go first */
        gc_tcp_ring_to(t, (char *)dst, end);
        t->direct_end = end;
    } else if (t->direct_end != end) {
        return GC_ERR_USAGE;            /* not the rest of the run in progress */
    }
    for (int j = 0; j < n && !t->gone; j++) {
        while (!(t->eofmask & (1ull << j))) {
            const uint64_t o = t->roff[j];
            if (o >= end) break;
            uint64_t stop = (o / t->chunk + 1) * t->chunk;
            if (stop > end) stop = end;
            if (!gc_tcp_recv_run(t, j, (char *)dst + (o - head), o, stop)) break;
        }
    }
    uint64_t done = UINT64_MAX;
    for (int j = 0; j < n; j++)
        if (t->roff[j] < done) done = t->roff[j];
    if (done > end) done = end;
    if (done == head) {
        if (t->gone) return t->gone;
        if (t->eofmask & (1ull << ((head / t->chunk) % (uint64_t)n))) return GC_ERR_PEER;
        return 0;
    }
    t->head = t->tail = done;
    if (done == end) {                  /* the run is over: the ring's read-ahead shows again */
        uint64_t tail = UINT64_MAX;
        for (int j = 0; j < n; j++)
            if (t->roff[j] < tail) tail = t->roff[j];
        t->tail = tail > t->head + t->cap ? t->head + t->cap : tail;
        for (int j = 0; j < n; j++)
            gc_tcp_want(t, j, gc_tcp_in_wanted(t, j) | (t->ev[j] & EPOLLOUT));
    }
    return (ssize_t)(done - head);
}

static void gc_tcp_consume(gc_chan *c, size_t nbytes) {
    gc_tcpchan *t = (gc_tcpchan *)c;
    t->head += nbytes;
    /* Sockets that stopped at the window's end may read again. */
    for (int j = 0; j < t->nsocks; j++)
        if (!(t->ev[j] & EPOLLIN) && gc_tcp_in_wanted(t, j))
            gc_tcp_want(t, j, t->ev[j] | EPOLLIN);
}

static int gc_tcp_alive(gc_chan *c) {
    gc_tcpchan *t = (gc_tcpchan *)c;
    if (t->gone) return 0;
    /* A reset or error on any socket means the peer is gone. A FIN alone may still have
     * data of other sockets behind it, but a peer whose process ended has closed them all,
     * and once every socket shows its FIN nothing more can arrive. */
    struct pollfd p[GC_TCP_MAX_SOCKS];
    for (int j = 0; j < t->nsocks; j++) {
        p[j].fd = t->fds[j];
        p[j].events = POLLRDHUP;
        p[j].revents = 0;
    }
    if (poll(p, (nfds_t)t->nsocks, 0) <= 0) return 1;
    int closed = 0;
    for (int j = 0; j < t->nsocks; j++) {
        if (p[j].revents & (POLLERR | POLLHUP)) return 0;
        if ((p[j].revents & POLLRDHUP) || (t->eofmask & (1ull << j))) closed++;
    }
    return closed < t->nsocks;
}

/* Builds a channel over nsocks connected sockets (index order = stripe order, the same on
 * both sides). ring_bytes is a multiple of GC_CHAN_ALIGN. On success the channel owns the
 * sockets; on failure the caller still does. Returns 0 or a GC_ERR_* code (errno kept). */
static int gc_tcpchan_create(const int *fds, int nsocks, size_t ring_bytes, size_t chunk_bytes,
                             int peer, gc_tcpchan **out) {
    *out = NULL;
    if (nsocks < 1 || nsocks > GC_TCP_MAX_SOCKS || chunk_bytes == 0 || ring_bytes == 0 ||
        ring_bytes % GC_CHAN_ALIGN != 0)
        return GC_ERR_USAGE;
    gc_tcpchan *t = (gc_tcpchan *)calloc(1, sizeof *t);
    if (!t) return GC_ERR_NOMEM;
    if (posix_memalign((void **)&t->ring, 4096, ring_bytes) != 0) {
        free(t);
        return GC_ERR_NOMEM;
    }
    t->nsocks = nsocks;
    t->chunk = chunk_bytes;
    t->cap = ring_bytes;
    t->base.fd = epoll_create1(EPOLL_CLOEXEC);
    if (t->base.fd < 0) goto io_error;
    for (int j = 0; j < nsocks; j++) {
        t->fds[j] = fds[j];
        t->soff[j] = t->roff[j] = (uint64_t)j * chunk_bytes;
        int flags = fcntl(fds[j], F_GETFL);
        if (flags < 0 || fcntl(fds[j], F_SETFL, flags | O_NONBLOCK) < 0) goto io_error;
        if (gc_tcp_tune(fds[j], 0) < 0) goto io_error;
        struct epoll_event e;
        memset(&e, 0, sizeof e);
        e.events = gc_tcp_in_wanted(t, j);
        e.data.u32 = (uint32_t)j;
        if (epoll_ctl(t->base.fd, EPOLL_CTL_ADD, fds[j], &e) < 0) goto io_error;
        t->ev[j] = e.events;
    }
    t->base.send = gc_tcp_send;
    t->base.peek = gc_tcp_peek;
    t->base.consume = gc_tcp_consume;
    t->base.recv_direct = gc_tcp_recv_direct;
    t->base.alive = gc_tcp_alive;
    t->base.stripe_room = gc_tcp_stripe_room;
    t->base.peer = peer;
    t->base.impl = t;
    *out = t;
    return GC_OK;
io_error: {
        int e = errno;
        if (t->base.fd >= 0) close(t->base.fd);
        free(t->ring);
        free(t);
        errno = e;
        return GC_ERR_IO;
    }
}

static void gc_tcpchan_destroy(gc_tcpchan *t) {
    if (!t) return;
    for (int j = 0; j < t->nsocks; j++) close(t->fds[j]);
    close(t->base.fd);
    free(t->ring);
    free(t);
}

/* ---- blocking helpers over any gc_chan (tests, and small object messages) ---------- */

static inline double gc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sends slen bytes of sbuf and receives rlen bytes into rbuf at the same time (one thread
 * drives both directions, as the executor's sendrecv steps do), until both are done or
 * timeout seconds pass. *sdone and *rdone report progress for error messages. Returns
 * GC_OK, GC_ERR_TIMEOUT, GC_ERR_PEER (the peer is gone) or GC_ERR_IO. */
static int gc_chan_xfer(gc_chan *c, const void *sbuf, size_t slen, void *rbuf, size_t rlen,
                        double timeout, size_t *sdone, size_t *rdone) {
    size_t s = 0, r = 0;
    int status = GC_OK, gone = 0;
    const double start = gc_now();
    double last_check = start;
    while (s < slen || r < rlen) {
        int progress = 0;
        if (s < slen) {
            ssize_t k = c->send(c, (const char *)sbuf + s, slen - s);
            if (k < 0) { status = (int)k; break; }
            s += (size_t)k;
            progress |= k > 0;
        }
        if (r < rlen) {
            const void *p;
            ssize_t k = c->peek(c, &p);
            if (k < 0) { status = (int)k; break; }
            if (k > 0) {
                size_t take = (size_t)k < rlen - r ? (size_t)k : rlen - r;
                memcpy((char *)rbuf + r, p, take);
                c->consume(c, take);
                r += take;
                progress = 1;
            }
        }
        if (progress) continue;
        if (gone) { status = GC_ERR_PEER; break; }   /* nothing left behind by the peer */
        const double now = gc_now();
        if (now - start > timeout) { status = GC_ERR_TIMEOUT; break; }
        if (now - last_check > 0.1) {
            last_check = now;
            /* it may have written its last bytes and exited since the pass above: one more */
            if (!c->alive(c)) { gone = 1; continue; }
        }
        if (c->fd >= 0) {
            struct pollfd p = {c->fd, POLLIN | (s < slen ? POLLOUT : 0), 0};
            poll(&p, 1, 10);
        } else {
            sched_yield();
        }
    }
    *sdone = s;
    *rdone = r;
    return status;
}

#endif
