/* Shared-memory channel: a gc_chan between two ranks of one host.
 *
 * One POSIX shared-memory segment per unordered pair of ranks (a, b), a < b. The lower rank
 * ("side 0") creates it, the higher rank ("side 1") attaches. It holds two single-producer
 * single-consumer byte rings, ring 0 carrying side 0 -> side 1 and ring 1 the other way:
 *
 *   [0, 4096)        header: magic, version, capacity, a token derived from the job secret, the
 *                    pid the job expects on side 1, and per side: pid, pid namespace and state
 *   ring r control   head (written by the producer) and tail (written by the consumer), each a
 *                    free-running 64-bit byte counter on its own 128-byte block (two lines:
 *                    the adjacent-line prefetcher would otherwise make them share)
 *   [2048, 4096)      the pair's shared words (gc_chan.pair_words): GC_SHM_PAIR_WORDS 64-bit
 *                    words per side, side 0's first (zero when fresh)
 *   [4096, +cap)     ring 0 data, then ring 1 data (cap is a multiple of 4096, so of GC_CHAN_ALIGN)
 *
 * Ordering: the producer copies bytes in, then publishes head with a release store; the
 * consumer reads head with acquire, reads the bytes, then publishes tail with release so the
 * producer never overwrites bytes still being read. Each side caches the other's counter and
 * rereads it only when the cached value says "empty" / "full", so the hot path touches no
 * line the peer writes.
 *
 * Liveness: each side writes its own pid and state into the header. alive() is false once the
 * peer's state says closed, or its process is dead by gc_proc.h's rule (gone, or a zombie).
 * Before side 1 has attached, side 0 watches the header's `expect_pid` (the pid the bootstrap
 * gave, 0 for a peer outside this pid namespace), so a peer that ended before attaching is
 * noticed instead of waited for until the deadline.
 *
 * Files: gpucoll/transports/shm_segment.py creates the file exclusively (mode 0600) or opens it
 * after checking its owner and mode, and passes the descriptor; the token written by the
 * creator lets the attacher refuse a segment that another job made under the same name.
 *
 *   gc_shmchan *gc_shmchan_create(fd, cap, token, pidns, expect_pid, &err)
 *                      side 0: size the new file, map, init (magic last)
 *   gc_shmchan *gc_shmchan_attach(fd, creator_pid, token, pidns, &err)
 *                      side 1: map the segment; err = GC_SHM_NOT_READY while the creator has
 *                      not finished (retry), or when the segment belongs to another creator
 *                      (a stale name); GC_SHM_FOREIGN when its token is not ours
 *   gc_shmchan_examine(hdr, size, token, pidns)   GC_SEG_* of a segment file's header
 *   gc_shmchan_unlink(name)      remove the name (mappings stay valid)
 *   gc_shmchan_close(ch)         mark our side closed (the peer's alive() turns false), unmap;
 *                                in a forked child only unmap: the channel is the parent's
 *   gc_shmchan_peer_state(ch)    the other side's GC_SHM_STATE_* (NONE: not attached yet)
 *   &ch->chan                    the gc_chan to hand to the executor
 */
#ifndef GC_SHMCHAN_H
#define GC_SHMCHAN_H
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "gc_chan.h"
#include "gc_proc.h"

#define GC_SHM_MAGIC      0x676370756368616eULL   /* "gcpuchan" */
#define GC_SHM_VERSION    2u
#define GC_SHM_HDR_BYTES  4096u
#define GC_SHM_MIN_CAP    4096u
#define GC_SHM_MAX_CAP    (1u << 30)
#define GC_SHM_NOT_READY  1     /* attach: not created (or not initialised) yet; try again */
#define GC_SHM_FOREIGN    2     /* attach: the segment's token is not ours (another job made it) */

enum { GC_SHM_STATE_NONE = 0, GC_SHM_STATE_OPEN = 1, GC_SHM_STATE_CLOSED = 2 };

typedef struct {
    uint64_t magic;          /* written last by the creator (release): the segment is ready */
    uint32_t version;
    int32_t expect_pid;      /* side 1's pid as the job's table says (0: unknown or another pid
                                namespace): leftover checks, and alive() until side 1 attaches */
    uint64_t cap;            /* bytes per ring */
    int32_t pid[2];          /* each side's pid, written by that side */
    uint32_t state[2];       /* GC_SHM_STATE_*, written by that side */
    uint64_t pidns[2];       /* each side's pid namespace (0: unknown), written by that side */
    uint64_t token;          /* from the job secret and the segment's name (shm_segment.py) */
} gc_shm_header;

typedef struct {
    uint64_t head;           /* bytes ever written (producer) */
    char pad_h[120];
    uint64_t tail;           /* bytes ever read (consumer) */
    char pad_t[120];
} gc_shm_ring_ctl;

/* control blocks live right after the header fields, inside the first page */
#define GC_SHM_CTL_OFFSET 256u
/* the pair's shared words (gc_chan.pair_words) fill the rest of the first page */
#define GC_SHM_PAIR_OFFSET 2048u
#define GC_SHM_PAIR_WORDS  128u
_Static_assert(GC_SHM_CTL_OFFSET + 2 * sizeof(gc_shm_ring_ctl) <= GC_SHM_PAIR_OFFSET
               && GC_SHM_PAIR_OFFSET + 2 * GC_SHM_PAIR_WORDS * 8 <= GC_SHM_HDR_BYTES,
               "the first page holds the header, the ring controls and the pair's words");

typedef struct gc_shmchan {
    gc_chan chan;            /* first, so &ch->chan and ch convert both ways */
    unsigned char *base;     /* mapping */
    size_t map_bytes;
    uint64_t cap;
    int side;                /* 0 = creator (lower rank), 1 = attacher */
    gc_shm_header *hdr;
    gc_shm_ring_ctl *tx, *rx;
    unsigned char *tx_data, *rx_data;
    uint64_t tx_head, tx_tail_seen;   /* our counter and the last tail we read */
    uint64_t rx_tail, rx_head_seen;
    pid_t owner;             /* the process that opened it: a forked child must not close it */
} gc_shmchan;

static inline uint64_t gc__load_acq(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void gc__store_rel(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

static ssize_t gc_shmchan_send(gc_chan *c, const void *buf, size_t len)
{
    gc_shmchan *ch = (gc_shmchan *)c->impl;
    uint64_t cap = ch->cap, head = ch->tx_head;
    uint64_t space = cap - (head - ch->tx_tail_seen);
    if (space < len) {
        ch->tx_tail_seen = gc__load_acq(&ch->tx->tail);
        space = cap - (head - ch->tx_tail_seen);
    }
    /* Wait for a worthwhile gap rather than trickling a few bytes at a time: every push costs
     * the consumer a cache-line transfer of head. The consumer drains everything, so the gap
     * always reaches cap/8. */
    if (space < len && space < cap / 8)
        return 0;
    size_t n = len < space ? len : (size_t)space;
    if (n == 0)
        return 0;
    size_t at = (size_t)(head % cap), first = cap - at;
    if (first >= n) {
        memcpy(ch->tx_data + at, buf, n);
    } else {
        memcpy(ch->tx_data + at, buf, first);
        memcpy(ch->tx_data, (const unsigned char *)buf + first, n - first);
    }
    ch->tx_head = head + n;
    gc__store_rel(&ch->tx->head, ch->tx_head);
    return (ssize_t)n;
}

static ssize_t gc_shmchan_peek(gc_chan *c, const void **ptr)
{
    gc_shmchan *ch = (gc_shmchan *)c->impl;
    uint64_t tail = ch->rx_tail;
    if (ch->rx_head_seen == tail)
        ch->rx_head_seen = gc__load_acq(&ch->rx->head);
    uint64_t avail = ch->rx_head_seen - tail;
    size_t at = (size_t)(tail % ch->cap), run = (size_t)(ch->cap - at);
    *ptr = ch->rx_data + at;
    return (ssize_t)(avail < run ? avail : run);
}

static void gc_shmchan_consume(gc_chan *c, size_t n)
{
    gc_shmchan *ch = (gc_shmchan *)c->impl;
    ch->rx_tail += n;
    gc__store_rel(&ch->rx->tail, ch->rx_tail);
}

static int gc_shmchan_alive(gc_chan *c)
{
    gc_shmchan *ch = (gc_shmchan *)c->impl;
    int peer = 1 - ch->side;
    if (__atomic_load_n(&ch->hdr->state[peer], __ATOMIC_ACQUIRE) == GC_SHM_STATE_CLOSED)
        return 0;
    int32_t pid = __atomic_load_n(&ch->hdr->pid[peer], __ATOMIC_ACQUIRE);
    if (pid <= 0 && ch->side == 0)
        pid = ch->hdr->expect_pid; /* side 1 has not attached: watch the pid the job expects */
    return !gc_pid_dead(pid);
}

static inline uint64_t gc_shm_round_cap(uint64_t cap)
{
    if (cap < GC_SHM_MIN_CAP) cap = GC_SHM_MIN_CAP;
    if (cap > GC_SHM_MAX_CAP) cap = GC_SHM_MAX_CAP;
    return (cap + 4095u) & ~(uint64_t)4095u;
}

static gc_shmchan *gc__shmchan_wire(unsigned char *base, size_t map_bytes, int side, uint64_t pidns,
                                    int *err)
{
    gc_shmchan *ch = (gc_shmchan *)calloc(1, sizeof *ch);
    if (!ch) {
        munmap(base, map_bytes);
        *err = GC_ERR_NOMEM;
        return NULL;
    }
    ch->base = base;
    ch->map_bytes = map_bytes;
    ch->side = side;
    ch->hdr = (gc_shm_header *)base;
    ch->cap = ch->hdr->cap;
    gc_shm_ring_ctl *ctl = (gc_shm_ring_ctl *)(base + GC_SHM_CTL_OFFSET);
    unsigned char *data = base + GC_SHM_HDR_BYTES;
    ch->tx = &ctl[side];
    ch->rx = &ctl[1 - side];
    ch->tx_data = data + (size_t)side * ch->cap;
    ch->rx_data = data + (size_t)(1 - side) * ch->cap;
    /* counters start at whatever the segment holds (0 when fresh) */
    ch->tx_head = gc__load_acq(&ch->tx->head);
    ch->tx_tail_seen = gc__load_acq(&ch->tx->tail);
    ch->rx_tail = gc__load_acq(&ch->rx->tail);
    ch->rx_head_seen = ch->rx_tail;
    ch->chan.send = gc_shmchan_send;
    ch->chan.peek = gc_shmchan_peek;
    ch->chan.consume = gc_shmchan_consume;
    ch->chan.alive = gc_shmchan_alive;
    ch->chan.fd = -1;
    ch->chan.peer = -1;
    ch->chan.impl = ch;
    uint64_t *words = (uint64_t *)(base + GC_SHM_PAIR_OFFSET);
    ch->chan.pair_words[0] = words + (size_t)side * GC_SHM_PAIR_WORDS;
    ch->chan.pair_words[1] = words + (size_t)(1 - side) * GC_SHM_PAIR_WORDS;
    ch->chan.pair_nwords = GC_SHM_PAIR_WORDS;
    ch->owner = getpid();
    ch->hdr->pidns[side] = pidns;
    __atomic_store_n(&ch->hdr->pid[side], (int32_t)ch->owner, __ATOMIC_RELEASE);
    __atomic_store_n(&ch->hdr->state[side], GC_SHM_STATE_OPEN, __ATOMIC_RELEASE);
    *err = GC_OK;
    return ch;
}

/* Side 0: lay out the new, empty file `fd` (created exclusively by the caller). */
static gc_shmchan *gc_shmchan_create(int fd, uint64_t cap, uint64_t token, uint64_t pidns,
                                     int32_t expect_pid, int *err)
{
    cap = gc_shm_round_cap(cap);
    size_t bytes = GC_SHM_HDR_BYTES + 2 * (size_t)cap;
    if (ftruncate(fd, (off_t)bytes) != 0)
        goto io_error;
    /* MAP_POPULATE: take the page faults now, not in the first timed collective */
    unsigned char *base = (unsigned char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                                MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED)
        goto io_error;
    gc_shm_header *h = (gc_shm_header *)base;
    h->version = GC_SHM_VERSION;
    h->cap = cap;
    h->expect_pid = expect_pid;
    h->token = token;
    h->pid[0] = (int32_t)getpid();
    h->state[0] = GC_SHM_STATE_OPEN;
    gc_shmchan *ch = gc__shmchan_wire(base, bytes, 0, pidns, err);
    if (ch)
        __atomic_store_n(&h->magic, GC_SHM_MAGIC, __ATOMIC_RELEASE);
    return ch;
io_error:
    *err = GC_ERR_IO;
    return NULL;
}

/* Side 1: attach to the segment file `fd`. creator_pid > 0 rejects a segment made by another
 * process (a stale name from a crashed job) as not ready, so that the caller retries until the
 * real creator has replaced it; a segment with another token is refused (GC_SHM_FOREIGN)
 * before anything else in it is believed. */
static gc_shmchan *gc_shmchan_attach(int fd, pid_t creator_pid, uint64_t token, uint64_t pidns,
                                     int *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = GC_ERR_IO;
        return NULL;
    }
    if ((size_t)st.st_size < GC_SHM_HDR_BYTES + 2 * GC_SHM_MIN_CAP) {
        *err = GC_SHM_NOT_READY;       /* created, not yet sized */
        return NULL;
    }
    size_t bytes = (size_t)st.st_size;
    unsigned char *base = (unsigned char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                                MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        *err = GC_ERR_IO;
        return NULL;
    }
    gc_shm_header *h = (gc_shm_header *)base;
    int verdict = GC_OK;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GC_SHM_MAGIC)
        verdict = GC_SHM_NOT_READY;
    else if (h->token != token)
        verdict = GC_SHM_FOREIGN;
    else if (h->version != GC_SHM_VERSION || bytes < GC_SHM_HDR_BYTES + 2 * h->cap)
        verdict = GC_ERR_USAGE;
    else if ((creator_pid > 0 && h->pid[0] != (int32_t)creator_pid)
             || h->state[1] != GC_SHM_STATE_NONE)
        verdict = GC_SHM_NOT_READY;
    if (verdict != GC_OK) {
        munmap(base, bytes);
        *err = verdict;
        return NULL;
    }
    return gc__shmchan_wire(base, bytes, 1, pidns, err);
}

/* GC_SEG_* of the first `size` bytes of a channel segment file (token 0: any token), as seen
 * from pid namespace `pidns`. A leftover: its creator is gone, and its peer too (the one that
 * attached, or the one expected while none has). Pids of another namespace are not judged. */
static inline int gc_shmchan_examine(const void *hdr, size_t size, uint64_t token, uint64_t pidns)
{
    const gc_shm_header *h = (const gc_shm_header *)hdr;
    if (size < sizeof *h || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GC_SHM_MAGIC ||
        h->version != GC_SHM_VERSION)
        return GC_SEG_UNKNOWN;
    if (token && h->token != token)
        return GC_SEG_FOREIGN;
    if (!pidns || h->pidns[0] != pidns || !gc_pid_dead(h->pid[0]))
        return GC_SEG_IN_USE;
    uint32_t peer_state = __atomic_load_n(&h->state[1], __ATOMIC_ACQUIRE);
    if (peer_state == GC_SHM_STATE_CLOSED)
        return GC_SEG_LEFTOVER;
    /* side 1 has not attached: the one the job expects may still come (judged in the
     * creator's namespace, where the job's ranks of one host normally all live) */
    int32_t peer = peer_state == GC_SHM_STATE_NONE ? h->expect_pid : h->pid[1];
    if (peer_state != GC_SHM_STATE_NONE && h->pidns[1] != pidns)
        return GC_SEG_IN_USE;
    return peer > 0 && gc_pid_dead(peer) ? GC_SEG_LEFTOVER : GC_SEG_IN_USE;
}

static inline int gc_shmchan_unlink(const char *name)
{
    return shm_unlink(name) == 0 || errno == ENOENT ? GC_OK : GC_ERR_IO;
}

/* GC_SHM_STATE_* of the other side: NONE until it attached, then OPEN, then CLOSED. */
static inline int gc_shmchan_peer_state(const gc_shmchan *ch)
{
    return (int)__atomic_load_n(&ch->hdr->state[1 - ch->side], __ATOMIC_ACQUIRE);
}

static inline void gc_shmchan_close(gc_shmchan *ch)
{
    if (!ch)
        return;
    if (ch->owner == getpid())
        __atomic_store_n(&ch->hdr->state[ch->side], GC_SHM_STATE_CLOSED, __ATOMIC_RELEASE);
    munmap(ch->base, ch->map_bytes);
    free(ch);
}

#endif
