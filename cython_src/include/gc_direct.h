/* Intra-host "direct" collectives: every rank of a communicator maps ONE shared-memory
 * segment and exchanges data through it, with no channel, no schedule and no Python per round.
 *
 * Segment layout (offsets from the base, all set by gc_direct_format):
 *
 *   0        gc_direct_hdr       magic, version, nranks, slot size, creator pid, attach count,
 *                                first lost rank (so that one rank's discovery reaches all),
 *                                a token derived from the job secret (a file of the right name
 *                                that another job made is refused, see gc_direct_probe), and
 *                                the revoked word (ULFM's revoke reaches every waiter on this host)
 *   128      procs[nranks]       each rank's process id and pid namespace, for liveness checks,
 *                                and where a peer may read a known word of its memory (the
 *                                single-copy probe, gc__cma_probe)
 *   F        flags[nranks]       one 64-byte line per rank, so that a rank's posts never
 *                                invalidate the line another rank polls: its epoch, the count of
 *                                ranks blocked on it, the signatures of its last two calls and,
 *                                after a mismatch, what it found (gc_direct_line)
 *   S        slots[nranks][2]    per-rank staging buffers of slot_bytes, page aligned; nobody
 *                                touches a slot before its owner writes it, so with several
 *                                NUMA nodes its pages land on the owner's node (first touch):
 *                                written once locally, read by the others
 *
 * Synchronisation. Each rank owns one flag and only ever raises it ("post"): the epoch is a
 * counter that is never reset, so there is no reset pass and no ABA problem. Every rank posts the
 * same number of times per collective, so "rank j has posted epoch e" means the same step on
 * every rank, and a reader waits for exactly the writers it reads from (flag[j] >= e, acquire),
 * not for a full barrier.
 *
 * Double buffering. Each rank writes only its own slots. A collective is cut into generations
 * (rounds); generation u writes slot parity u % 2. Every rank posts at least once per
 * generation, and finishes reading generation u-2 before its first post of generation u-1. So
 * before writing generation u a rank only needs every flag >= the first epoch of generation u-1
 * (gc__gen_begin); in the steady state that is already known from the rank's own waits, and
 * consecutive rounds and consecutive collectives need no extra barrier.
 *
 * Call signatures. Mismatched calls (rank 0 reduces 10 floats, rank 1 20) would otherwise read
 * garbage from a slot or drift out of step. Call k of a rank (counting the calls that post)
 * stores a u64 signature (kind, count or bytes, dtype, op, root) in sig[k % 2] of its own line
 * right after the gc__gen_begin of its first generation, before its first post; the post
 * releases it. The first wait of call k that proves a peer posted in call k (a target above
 * the epoch this rank had when call k began) compares the peer's sig[k % 2] with its own,
 * before any data of that peer is read. Rooted calls (bcast, reduce, gather, scatter) make
 * every rank wait for every peer's first post of the call right after its own (gc__agree), so
 * that ranks that disagree on the root all fail in that call, before any data is read, even
 * when each takes itself for the root and nobody receives. A rank that does not wait for a
 * peer in some other call compares at the gc__gen_begin of call k+1, whose wait is for epochs
 * of call k.
 * Two entries suffice: a peer stores call k+2's signature only after the gc__gen_begin of its
 * first generation, which needs this rank's first epoch of the last generation of call k+1,
 * posted after this rank is done with call k (and with its deferred check of call k in the
 * first gen_begin of call k+1). So a reader never sees an entry overwritten early, and a
 * correct program never reports a mismatch. Every call that posts (barrier included) starts
 * with gc__gen_begin for this reason. The cost is one store per call and one load and compare
 * per peer per call, from a line that the wait has just brought into cache. A rank that finds
 * a mismatch records it in the header, so that ranks stuck waiting for it fail at their next
 * periodic check with the same report instead of a timeout.
 *
 * Determinism. Every reduced element is combined in rank order 0..N-1 (one-shot: by every rank
 * the same way; two-shot: by exactly one rank, then copied), so results are bitwise identical on
 * every rank.
 *
 * Waiting spins with a pause instruction, then yields the core (ranks may outnumber cores),
 * then blocks in a futex on the epoch word, which the poster wakes only when someone sleeps
 * there; about every millisecond it checks the deadline and whether the ranks that have not
 * arrived are still alive. All functions run without the GIL and are called by one thread
 * at a time per group.
 */
#ifndef GC_DIRECT_H
#define GC_DIRECT_H
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "gc_proc.h"
#include "gc_types.h"
#include "gc_reduce.h"

#define GC_DIRECT_MAGIC 0x7463657269646367ULL /* "gcdirect" read as little-endian bytes */
#define GC_DIRECT_VERSION 4u
#define GC_DIRECT_LINE 64u
#define GC_DIRECT_HDR_BYTES (2u * GC_DIRECT_LINE)
#define GC_DIRECT_PAGE 4096u
#define GC_DIRECT_LINE_PAD_ (GC_DIRECT_LINE - 48u)

/* Defaults of the tunables kept in gc_direct (the Python layer may change them per group). */
#define GC_DIRECT_ONESHOT_MAX (64u << 10)  /* allreduce/reduce: one-shot up to this many bytes */
/* ... and above 4 ranks up to GC_DIRECT_ONESHOT_TRAFFIC / nranks^2: every one-shot rank reads every
 * rank's whole input, so nranks^2 x bytes cross the shared cache, where two-shot moves about
 * 3 x nranks x bytes for two more synchronizations. On a 16-core host (make calibrate-host, each
 * mode forced): 8 ranks, one-shot 8 KiB 11.7 us against two-shot 16 KiB 12.6 us (limit 4 KiB);
 * 16 ranks, one-shot 2 KiB 11.4 us against two-shot 4 KiB 9.7 us (limit 1 KiB). */
#define GC_DIRECT_ONESHOT_TRAFFIC (256u << 10)
#define GC_DIRECT_ROUND_MAX (1u << 20)     /* two-shot round: fits L2 once split among ranks */
#define GC_DIRECT_SPINS 256                /* pause-spins before yielding the core */
#define GC_DIRECT_SPINS_OVERSUB 16         /* the same when ranks outnumber cores */
#define GC_DIRECT_YIELD_NS 50000           /* then sched_yield for this long, then block */
#define GC_DIRECT_CHECK_NS 1000000         /* deadline / liveness check period, first ... */
#define GC_DIRECT_CHECK_MAX_NS 32000000    /* ... doubling up to this: a blocked rank wakes for
                                            * them, and hundreds of ranks waking every
                                            * millisecond keep the cores busy */
#define GC_DIRECT_CMA_MIN (4u << 20)      /* all-to-all send buffers from this size are read
                                            * straight from the sender (gc__alltoall_cma): below,
                                            * the staged copies stay in cache and cost less than
                                            * pinning the pages (2 ranks, 2-core VM: 1 MiB blocks
                                            * staged 88-112 us, single copy 105-134; 2 MiB blocks
                                            * staged 292-540, single copy 270-677; 16 MiB: 4.8
                                            * ms against 4.2) */
#define GC_DIRECT_LIVE_BATCH 4             /* missing ranks whose liveness one check reads, at
                                            * least; nranks / 16 when more */

typedef struct {
    uint64_t magic;       /* written last by the creator, so a reader never sees half a header */
    uint32_t version;
    uint32_t nranks;
    uint64_t slot_bytes;  /* bytes of one slot; each rank owns two */
    uint64_t total_bytes;
    int32_t creator_pid;  /* lets an attacher tell a stale segment of a crashed job */
    uint32_t attached;    /* ranks that have mapped the segment (atomic) */
    int32_t lost;         /* 1 + the first rank found dead, 0 while none (atomic) */
    int32_t mismatch;     /* 1 + the first rank that found mismatched calls, 0 while none */
    uint64_t creator_pidns;
    uint64_t token;       /* from the job secret and the segment's name (shm_segment.py) */
    int32_t revoked;      /* 1 once a rank revoked the communicator: every wait on it fails */
    int32_t nudged;       /* counts processes of this host seen ended by a watcher thread
                           * (gc_direct_nudge): a wait that sees it change checks every rank now */
} gc_direct_hdr;
typedef char gc__hdr_fits_two_lines[sizeof(gc_direct_hdr) <= GC_DIRECT_HDR_BYTES ? 1 : -1];

/* Who a rank is, as seen by the others. A pid only means something inside its pid namespace
 * (ranks in different containers may share /dev/shm): peers in another namespace are never
 * declared dead, only waited for until the deadline. */
typedef struct {
    int32_t pid;
    int32_t pad_;
    uint64_t pidns;       /* inode of /proc/self/ns/pid, 0 when unknown */
    uint64_t probe_addr;  /* address, in this rank's own memory, of a word holding probe_value */
    uint64_t probe_value;
} gc_direct_proc;

/* One rank's flag line. Only the rank itself writes it (sleepers: every waiter on it). */
typedef struct {
    uint64_t epoch;        /* raised by every post; its low 32 bits are the futex word */
    uint32_t sleepers;     /* ranks blocked in a futex on epoch */
    int32_t bad_peer;      /* after a mismatch: the peer whose call differed */
    uint64_t sig[2];       /* signature of this rank's call k at sig[k % 2] */
    uint64_t bad_sig[2];   /* after a mismatch: the peer's signature, then this rank's */
    uint8_t pad_[GC_DIRECT_LINE_PAD_];
} gc_direct_line;
typedef char gc__line_is_64_bytes[sizeof(gc_direct_line) == GC_DIRECT_LINE ? 1 : -1];

/* Collective kinds of a call signature: the numbers of KINDS in gpucoll/base/call.py (tests/test_call.py
 * compares the two). */
enum {
    GC_KIND_ALLREDUCE = 1, GC_KIND_BCAST = 2, GC_KIND_REDUCE = 3, GC_KIND_ALLGATHER = 4,
    GC_KIND_REDUCE_SCATTER = 5, GC_KIND_ALLTOALL = 6, GC_KIND_GATHER = 7, GC_KIND_SCATTER = 8,
    GC_KIND_BARRIER = 9, GC_KIND_ALLGATHERV = 10, GC_KIND_ALLTOALLV = 11, GC_KIND_GATHERV = 12,
    GC_KIND_SCATTERV = 13
};
#define GC_DIRECT_DECLINED 1 /* a v-collective too large for the slots: every rank says so */
#define GC_SIG_NONE 15       /* dtype or op field of a call that has none (sizes in bytes) */
#define GC_SIG_SINGLE_COPY 14 /* op field of an all-to-all whose blocks are read from their senders:
                               * a rank that stages them instead (in place, another limit) differs */

/* A call's signature: kind (4 bits) | dtype (4) | op (4) | root (16 bits; -1 for none) |
 * count or bytes (36 bits; larger counts are folded in, so that they still compare). Never 0,
 * so a fresh segment's zero entries match nothing. */
static inline uint64_t gc_direct_sig(int kind, uint64_t count, int dt, int op, int root)
{
    const uint64_t m36 = (1ULL << 36) - 1;
    return (uint64_t)(kind & 15) << 60 | (uint64_t)(dt & 15) << 56 | (uint64_t)(op & 15) << 52 |
           (uint64_t)(root & 0xffff) << 36 | ((count ^ (count >> 36)) & m36);
}

typedef struct {
    /* mapping */
    uint8_t *base;
    size_t size;
    gc_direct_hdr *hdr;
    gc_direct_proc *procs;
    uint64_t pidns;           /* this process's pid namespace */
    uint8_t *flags;
    uint8_t *slots;
    size_t slot_bytes;
    int rank, nranks;
    /* synchronisation state, private to this rank */
    uint64_t epoch;           /* last epoch this rank posted */
    uint64_t gen_prev_first;  /* first epoch posted in the previous generation */
    int parity;               /* slot parity of the current generation */
    uint64_t *seen;           /* highest value seen of each flag: repeated waits cost no load */
    int broken;               /* a wait failed: epochs are out of step, the group is unusable */
    const int32_t *watch;     /* per rank: its pid from the bootstrap (0: unknown), owned by the
                                 caller, watched while the rank has not attached (gc__rank_dead) */
    int live_next;            /* the rank the next liveness check starts from (gc__wait_slow) */
    int32_t nudge_seen;       /* hdr->nudged as of this rank's last liveness check */
    /* single copy between processes (process_vm_readv): 1 this rank can read every peer's
     * memory, -1 it cannot, 0 not probed yet; probe_word is what peers read to find out */
    int cma;
    uint64_t probe_word;
    uint64_t cma_calls;       /* calls that moved their data so (tests and logs read it) */
    /* call signatures (see "Call signatures" above) */
    uint64_t calls;           /* calls that posted, the current one included */
    uint64_t call_base;       /* this rank's epoch when the current call began */
    uint64_t sig;             /* signature of the current call */
    uint64_t *verified;       /* per rank: the last call whose signature was compared */
    /* tunables */
    size_t oneshot_max;
    size_t round_max;
    size_t cma_min;           /* all-to-all send buffers of at least this many bytes go by single
                                 copy (0: never) */
    int spins;
    int64_t yield_ns;
    /* report of the last failure: the ranks that had not arrived, and those found dead */
    int nmissing, ndead;
    int *missing, *dead;
    double waited_s;
    /* report of a mismatch: rank bad_by called bad_sig_by where rank bad_peer called
     * bad_sig_peer; bad_by is another rank when this one learnt it from the header. bad_prev:
     * found at the start of the next call (this rank did not wait for bad_peer in that one). */
    int bad_peer, bad_by, bad_prev;
    uint64_t bad_sig_peer, bad_sig_by;
} gc_direct;

static inline uint64_t gc__pidns(void);
static inline int64_t gc__now_ns(void);

/* ---- layout ------------------------------------------------------------------------------- */

static inline size_t gc__round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static inline size_t gc__procs_off(void) { return GC_DIRECT_HDR_BYTES; }
static inline size_t gc__flags_off(int nranks)
{
    return gc__procs_off() + gc__round_up(sizeof(gc_direct_proc) * (size_t)nranks, GC_DIRECT_LINE);
}
static inline size_t gc__slots_off(int nranks)
{
    return gc__round_up(gc__flags_off(nranks) + (size_t)GC_DIRECT_LINE * nranks, GC_DIRECT_PAGE);
}

/* Slot sizes are whole pages so that every slot starts page (and cache-line) aligned, and
 * hold at least one cache line per rank (the unit of the per-rank pieces of a round). */
static inline size_t gc_direct_slot_size(size_t slot_bytes, int nranks)
{
    size_t least = (size_t)GC_DIRECT_LINE * (size_t)(nranks > 0 ? nranks : 1);
    if (slot_bytes < least)
        slot_bytes = least;
    return gc__round_up(slot_bytes, GC_DIRECT_PAGE);
}

/* Bytes of a segment for nranks ranks with slots of (at least) slot_bytes. */
static inline size_t gc_direct_segment_size(int nranks, size_t slot_bytes)
{
    return gc__slots_off(nranks) + (size_t)nranks * 2 * gc_direct_slot_size(slot_bytes, nranks);
}

/* Creator: lay out a zero-filled segment. */
static inline int gc_direct_format(void *base, size_t size, int nranks, size_t slot_bytes,
                                   int32_t creator_pid, uint64_t token)
{
    gc_direct_hdr *h = (gc_direct_hdr *)base;
    slot_bytes = gc_direct_slot_size(slot_bytes, nranks);
    if (nranks < 1 || size < gc_direct_segment_size(nranks, slot_bytes))
        return GC_ERR_USAGE;
    h->version = GC_DIRECT_VERSION;
    h->nranks = (uint32_t)nranks;
    h->slot_bytes = slot_bytes;
    h->total_bytes = size;
    h->creator_pid = creator_pid;
    h->creator_pidns = gc__pidns();
    h->token = token;
    __atomic_store_n(&h->magic, GC_DIRECT_MAGIC, __ATOMIC_RELEASE);
    return GC_OK;
}


/* The creator is known to be gone: nobody can join the segment any more. A pid only means
 * something in its own pid namespace; a creator in another one is never judged gone. */
static inline int gc__creator_gone(const gc_direct_hdr *h)
{
    return h->creator_pidns == gc__pidns() && gc_pid_dead(h->creator_pid);
}

/* Attacher's verdict on a mapped segment file that passed the owner and mode checks
 * (shm_direct.py). creator_pid > 0 is the pid the job's table gives local rank 0: a segment
 * that another process made is a leftover of an earlier run with the same name (retry: local
 * rank 0 replaces it, or says why it cannot). The token is compared before any other field is
 * trusted. */
enum {
    GC_DIRECT_READY = 0,
    GC_DIRECT_NOT_READY = 1,     /* not formatted yet, or made by another creator: retry */
    GC_DIRECT_FOREIGN = 2,       /* another token: not made by this job */
    GC_DIRECT_CREATOR_GONE = 3,  /* made by creator_pid, which has died since */
    GC_DIRECT_MISMATCH = 4       /* this job's, but for another version or number of ranks */
};
static inline int gc_direct_probe(const void *base, size_t size, int nranks, uint64_t token,
                                  int32_t creator_pid)
{
    const gc_direct_hdr *h = (const gc_direct_hdr *)base;
    if (size < sizeof *h || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GC_DIRECT_MAGIC)
        return GC_DIRECT_NOT_READY;
    if (h->token != token)
        return GC_DIRECT_FOREIGN;
    if (h->version != GC_DIRECT_VERSION || h->nranks != (uint32_t)nranks || h->total_bytes > size)
        return GC_DIRECT_MISMATCH;
    if (creator_pid > 0 && h->creator_pid != creator_pid)
        return GC_DIRECT_NOT_READY;
    return gc__creator_gone(h) ? GC_DIRECT_CREATOR_GONE : GC_DIRECT_READY;
}

/* GC_SEG_* of the first `size` bytes of a segment file (token 0: any token). A segment is a
 * leftover once its creator is gone: ranks that have not attached by then never can. */
static inline int gc_direct_examine(const void *hdr, size_t size, uint64_t token)
{
    const gc_direct_hdr *h = (const gc_direct_hdr *)hdr;
    if (size < sizeof *h || __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GC_DIRECT_MAGIC)
        return GC_SEG_UNKNOWN;
    if (token && h->token != token)
        return GC_SEG_FOREIGN;
    return gc__creator_gone(h) ? GC_SEG_LEFTOVER : GC_SEG_IN_USE;
}

/* Map this rank into a formatted segment. *nattached receives how many ranks have attached,
 * this one included (the last one may unlink the segment's name). */
/* The one-shot limit of a group of nranks (see GC_DIRECT_ONESHOT_TRAFFIC). */
static inline size_t gc_direct_oneshot_default(int nranks)
{
    return nranks <= 4 ? GC_DIRECT_ONESHOT_MAX : GC_DIRECT_ONESHOT_TRAFFIC / ((size_t)nranks * (size_t)nranks);
}

static inline int gc_direct_attach(gc_direct *g, void *base, size_t size, int rank, int nranks,
                                   int *nattached)
{
    memset(g, 0, sizeof *g);
    gc_direct_hdr *h = (gc_direct_hdr *)base;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != GC_DIRECT_MAGIC ||
        h->version != GC_DIRECT_VERSION || h->nranks != (uint32_t)nranks || rank < 0 ||
        rank >= nranks || h->total_bytes > size ||
        size < gc_direct_segment_size(nranks, h->slot_bytes))
        return GC_ERR_USAGE;
    g->seen = (uint64_t *)calloc((size_t)nranks, sizeof(uint64_t));
    g->missing = (int *)calloc((size_t)nranks, sizeof(int));
    g->dead = (int *)calloc((size_t)nranks, sizeof(int));
    g->verified = (uint64_t *)calloc((size_t)nranks, sizeof(uint64_t));
    if (!g->seen || !g->missing || !g->dead || !g->verified) {
        free(g->seen); free(g->missing); free(g->dead); free(g->verified);
        memset(g, 0, sizeof *g);
        return GC_ERR_NOMEM;
    }
    g->base = (uint8_t *)base;
    g->size = size;
    g->hdr = h;
    g->procs = (gc_direct_proc *)(g->base + gc__procs_off());
    g->pidns = gc__pidns();
    g->flags = g->base + gc__flags_off(nranks);
    g->slots = g->base + gc__slots_off(nranks);
    g->slot_bytes = h->slot_bytes;
    g->rank = rank;
    g->nranks = nranks;
    g->oneshot_max = gc_direct_oneshot_default(nranks);
    g->round_max = GC_DIRECT_ROUND_MAX;
    g->cma_min = GC_DIRECT_CMA_MIN;
    /* With more ranks than cores the rank we wait for is often queued behind us on this
     * core: spinning only delays it, so yield almost at once. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    g->spins = ncpu > 0 && nranks > ncpu ? GC_DIRECT_SPINS_OVERSUB : GC_DIRECT_SPINS;
    g->yield_ns = GC_DIRECT_YIELD_NS;
    /* Flags start at zero and only this rank raises its own: resume from its current value
     * (zero in a fresh segment). */
    g->epoch = __atomic_load_n((uint64_t *)(g->flags + (size_t)rank * GC_DIRECT_LINE),
                               __ATOMIC_ACQUIRE);
    g->bad_peer = g->bad_by = -1;
    g->procs[rank].pidns = g->pidns;
    /* Any value peers cannot guess by accident: reading it back proves the read reached us. */
    g->probe_word = (uint64_t)(uintptr_t)g ^ ((uint64_t)getpid() << 32) ^ (uint64_t)gc__now_ns();
    g->procs[rank].probe_addr = (uint64_t)(uintptr_t)&g->probe_word;
    g->procs[rank].probe_value = g->probe_word;
    __atomic_store_n(&g->procs[rank].pid, (int32_t)getpid(), __ATOMIC_RELEASE);
    int n = (int)__atomic_add_fetch(&h->attached, 1, __ATOMIC_ACQ_REL);
    if (nattached)
        *nattached = n;
    return GC_OK;
}

static inline void gc_direct_detach(gc_direct *g)
{
    free(g->seen);
    free(g->missing);
    free(g->dead);
    free(g->verified);
    memset(g, 0, sizeof *g);
}

/* ---- waiting ------------------------------------------------------------------------------ */

static inline gc_direct_line *gc__line(const gc_direct *g, int r)
{
    return (gc_direct_line *)(g->flags + (size_t)r * GC_DIRECT_LINE);
}

static inline uint64_t *gc__flag(const gc_direct *g, int r) { return &gc__line(g, r)->epoch; }

/* Ranks blocked in a futex on rank r's epoch, in the same line (only touched by sleepers). */
static inline uint32_t *gc__sleepers(const gc_direct *g, int r) { return &gc__line(g, r)->sleepers; }

/* The futex word: the low 32 bits of the epoch, which change at every post. */
static inline uint32_t *gc__futex_word(const gc_direct *g, int r)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)gc__flag(g, r) + 1;
#else
    return (uint32_t *)gc__flag(g, r);
#endif
}

/* Block until rank `peer`'s epoch is no longer v (or timeout_ns passes). The sleeper count
 * and the epoch form a Dekker pair with gc__post (both sides seq_cst), so either the poster
 * sees the sleeper and wakes it, or the sleeper sees the new epoch and does not sleep. */
static inline void gc__futex_wait(gc_direct *g, int peer, uint64_t target, int64_t timeout_ns)
{
    uint32_t *sleepers = gc__sleepers(g, peer);
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    uint64_t v = __atomic_load_n(gc__flag(g, peer), __ATOMIC_SEQ_CST);
    if (v < target) {
        struct timespec ts = {(time_t)(timeout_ns / 1000000000), (long)(timeout_ns % 1000000000)};
        syscall(SYS_futex, gc__futex_word(g, peer), FUTEX_WAIT, (uint32_t)v, &ts, NULL, 0);
    }
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
}

/* Revoke the communicator (ULFM): every rank of this host waiting in one of its collectives,
 * or entering one later, fails with GC_ERR_REVOKED; sleepers are woken to see it at once. */
static inline void gc__wake_all(gc_direct *g)
{
    for (int r = 0; r < g->nranks; r++)
        if (__atomic_load_n(gc__sleepers(g, r), __ATOMIC_SEQ_CST))
            syscall(SYS_futex, gc__futex_word(g, r), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void gc_direct_revoke(gc_direct *g)
{
    __atomic_store_n(&g->hdr->revoked, 1, __ATOMIC_SEQ_CST);
    gc__wake_all(g);
}

/* A process of this host ended (a watcher thread saw its pidfd): every waiter, asleep or not,
 * checks the liveness of every rank it still waits for now, not at its next periodic check
 * (which may be 32 ms away). Any thread may call it. */
static inline void gc_direct_nudge(gc_direct *g)
{
    __atomic_add_fetch(&g->hdr->nudged, 1, __ATOMIC_SEQ_CST);
    gc__wake_all(g);
}

static inline uint8_t *gc__slot(const gc_direct *g, int r)
{
    return g->slots + ((size_t)r * 2 + (size_t)g->parity) * g->slot_bytes;
}

static inline void gc__pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline int64_t gc__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Deadline of a call: -1 for none (timeout_s negative, infinite or NaN). */
static inline int64_t gc__deadline(double timeout_s)
{
    if (!(timeout_s >= 0) || isinf(timeout_s))
        return -1;
    return gc__now_ns() + (int64_t)(timeout_s * 1e9);
}

static inline uint64_t gc__pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static inline int gc__rank_dead(const gc_direct *g, int r)
{
    int32_t pid = __atomic_load_n(&g->procs[r].pid, __ATOMIC_ACQUIRE);
    if (pid > 0)
        return g->procs[r].pidns == g->pidns && gc_pid_dead(pid);
    /* Not attached yet: a rank that ended before its first collective never will. */
    return g->watch && g->watch[r] > 0 && gc_pid_dead(g->watch[r]);
}

/* Fill the failure report: who had not posted `target`, and who of them is gone. */
static inline void gc__report(gc_direct *g, uint64_t target, int64_t started_ns)
{
    g->nmissing = g->ndead = 0;
    for (int r = 0; r < g->nranks; r++) {
        if (__atomic_load_n(gc__flag(g, r), __ATOMIC_ACQUIRE) >= target)
            continue;
        g->missing[g->nmissing++] = r;
        if (gc__rank_dead(g, r))
            g->dead[g->ndead++] = r;
    }
    int lost = __atomic_load_n(&g->hdr->lost, __ATOMIC_ACQUIRE);
    if (g->ndead == 0 && lost > 0)
        g->dead[g->ndead++] = lost - 1;
    g->waited_s = (double)(gc__now_ns() - started_ns) * 1e-9;
    g->broken = 1;
}

static inline int gc__verify(gc_direct *g, int peer);

/* Another rank found mismatched calls (hdr->mismatch): take over its report, so that a rank
 * stuck waiting for it fails with the same cause instead of a timeout; but first compare the
 * peers that have posted in this call, so that a rank names what it can see itself. */
static int gc__mismatch_relayed(gc_direct *g, int by)
{
    for (int r = 0; r < g->nranks; r++)
        if (g->verified[r] < g->calls &&
            __atomic_load_n(gc__flag(g, r), __ATOMIC_ACQUIRE) > g->call_base && gc__verify(g, r))
            return GC_ERR_MISMATCH;
    const gc_direct_line *l = gc__line(g, by);
    g->bad_by = by;
    g->bad_peer = __atomic_load_n(&l->bad_peer, __ATOMIC_ACQUIRE);
    g->bad_sig_peer = __atomic_load_n(&l->bad_sig[0], __ATOMIC_RELAXED);
    g->bad_sig_by = __atomic_load_n(&l->bad_sig[1], __ATOMIC_RELAXED);
    g->bad_prev = 0;
    g->broken = 1;
    return GC_ERR_MISMATCH;
}

/* The slow part of a wait, out of line so that the fast path stays a load and a compare. */
static int gc__wait_slow(gc_direct *g, int peer, uint64_t target, int64_t deadline)
{
    const uint64_t *f = gc__flag(g, peer);
    uint64_t v;
    for (int i = 0; i < g->spins; i++) {
        gc__pause();
        if ((v = __atomic_load_n(f, __ATOMIC_ACQUIRE)) >= target)
            goto arrived;
    }
    int64_t start = gc__now_ns(), period = GC_DIRECT_CHECK_NS, next_check = start + period;
    /* The periods grow, the deadline does not move: the check that follows it comes on time,
     * before peers that went on after their own timeout can end and read as lost. */
    if (deadline >= 0 && next_check > deadline)
        next_check = deadline;
    const int batch = g->nranks / 16 > GC_DIRECT_LIVE_BATCH ? g->nranks / 16 : GC_DIRECT_LIVE_BATCH;
    for (;;) {
        if ((v = __atomic_load_n(f, __ATOMIC_ACQUIRE)) >= target)
            goto arrived;
        int64_t now = gc__now_ns();
        if (now - start < g->yield_ns) {
            /* Ranks may outnumber cores: give the core to the rank we wait for. */
            sched_yield();
        } else {
            /* A long wait: block, so that the core goes idle and the scheduler moves a
             * runnable rank onto it; the poster wakes us. Wake up for the periodic checks. */
            int64_t left = next_check - now;
            gc__futex_wait(g, peer, target, left > 1000 ? left : 1000);
        }
        if (__atomic_load_n(&g->hdr->revoked, __ATOMIC_ACQUIRE)) {
            g->broken = 1;
            return GC_ERR_REVOKED;
        }
        int32_t nudged = __atomic_load_n(&g->hdr->nudged, __ATOMIC_ACQUIRE);
        if (now < next_check && (__atomic_load_n(&g->hdr->lost, __ATOMIC_ACQUIRE) > 0 ||
                                 nudged != g->nudge_seen))
            next_check = now;   /* another rank found one dead, or a process ended: check now */
        if (now >= next_check) {
            /* The post may have come while this rank slept or yielded: a wait that is
             * satisfied never fails (a mismatch found meanwhile belongs to a later call). */
            if ((v = __atomic_load_n(f, __ATOMIC_ACQUIRE)) >= target)
                goto arrived;
            period = period * 2 < GC_DIRECT_CHECK_MAX_NS ? period * 2 : GC_DIRECT_CHECK_MAX_NS;
            next_check = now + period;
            if (deadline >= 0 && next_check > deadline && now < deadline)
                next_check = deadline;
            int failed = __atomic_load_n(&g->hdr->lost, __ATOMIC_ACQUIRE) > 0;
            int look = nudged != g->nudge_seen ? g->nranks : batch;   /* nudged: every rank */
            g->nudge_seen = nudged;
            /* A few missing ranks per check, round robin: a liveness check reads /proc (a few
             * microseconds a rank), and hundreds of ranks waiting for each other would spend
             * their cores on it. A dead rank is still found within 16 checks (at most 0.5 s
             * once the period has grown), or nranks / GC_DIRECT_LIVE_BATCH in small groups. */
            for (int k = 0, looked = 0; k < g->nranks && looked < look && !failed; k++) {
                int r = (g->live_next + k) % g->nranks;
                if (__atomic_load_n(gc__flag(g, r), __ATOMIC_ACQUIRE) >= target)
                    continue;
                looked++;
                g->live_next = (r + 1) % g->nranks;
                /* The flag is read again once the rank is seen dead: it may have posted and
                 * exited between the first read and the check. Death is final, so a post not
                 * seen after it never comes. */
                if (gc__rank_dead(g, r) &&
                    __atomic_load_n(gc__flag(g, r), __ATOMIC_ACQUIRE) < target) {
                    int32_t none = 0;
                    /* Tell every other rank, so they name the dead one, not the ranks that
                     * stopped posting because they noticed it first; those asleep learn it now,
                     * not at their next check (survivors that go on need it soon). */
                    if (__atomic_compare_exchange_n(&g->hdr->lost, &none, r + 1, 0,
                                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                        gc__wake_all(g);
                    failed = 1;
                }
            }
            if (failed) {
                gc__report(g, target, start);
                return GC_ERR_PEER;
            }
            int bad = __atomic_load_n(&g->hdr->mismatch, __ATOMIC_ACQUIRE);
            if (bad > 0 && bad - 1 != g->rank)
                return gc__mismatch_relayed(g, bad - 1);
            if (deadline >= 0 && now >= deadline) {
                gc__report(g, target, start);
                return GC_ERR_TIMEOUT;
            }
        }
    }
arrived:
    g->seen[peer] = v;
    return GC_OK;
}

/* The peer's signature of the current call differs from ours: record who and what (in this
 * rank's line and the header too, for the ranks that wait for this one), and break the group. */
static int gc__mismatch(gc_direct *g, int peer, uint64_t theirs)
{
    gc_direct_line *l = gc__line(g, g->rank);
    g->bad_peer = peer;
    g->bad_by = g->rank;
    g->bad_sig_peer = theirs;
    g->bad_sig_by = g->sig;
    g->broken = 1;
    __atomic_store_n(&l->bad_sig[0], theirs, __ATOMIC_RELAXED);
    __atomic_store_n(&l->bad_sig[1], g->sig, __ATOMIC_RELAXED);
    __atomic_store_n(&l->bad_peer, peer, __ATOMIC_RELEASE);
    int32_t none = 0;
    __atomic_compare_exchange_n(&g->hdr->mismatch, &none, g->rank + 1, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    return GC_ERR_MISMATCH;
}

/* Compare `peer`'s signature of the current call with ours; the caller has seen (acquire) an
 * epoch that the peer posted after storing it. */
static inline int gc__verify(gc_direct *g, int peer)
{
    uint64_t theirs = __atomic_load_n(&gc__line(g, peer)->sig[g->calls & 1], __ATOMIC_RELAXED);
    g->verified[peer] = g->calls;
    return theirs == g->sig ? GC_OK : gc__mismatch(g, peer, theirs);
}

static inline int gc__wait(gc_direct *g, int peer, uint64_t target, int64_t deadline)
{
    if (g->seen[peer] < target) {
        uint64_t v = __atomic_load_n(gc__flag(g, peer), __ATOMIC_ACQUIRE);
        if (v >= target) {
            g->seen[peer] = v;
        } else {
            int st = gc__wait_slow(g, peer, target, deadline);
            if (st)
                return st;
        }
    }
    /* The first wait of this call that proves the peer posted in this call. */
    if (g->verified[peer] < g->calls && target > g->call_base)
        return gc__verify(g, peer);
    return GC_OK;
}

static inline int gc__wait_all(gc_direct *g, uint64_t target, int64_t deadline)
{
    /* Start after ourselves so that ranks do not all poll rank 0 first. */
    for (int k = 1; k < g->nranks; k++) {
        int st = gc__wait(g, (g->rank + k) % g->nranks, target, deadline);
        if (st)
            return st;
    }
    return GC_OK;
}

/* Release: everything this rank wrote to its slot, and every read it made of other slots,
 * happens before a peer sees the new epoch. */
static inline uint64_t gc__post(gc_direct *g)
{
    uint64_t e = ++g->epoch;
    __atomic_store_n(gc__flag(g, g->rank), e, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(gc__sleepers(g, g->rank), __ATOMIC_SEQ_CST))
        syscall(SYS_futex, gc__futex_word(g, g->rank), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    g->seen[g->rank] = e;
    return e;
}

/* Start a generation: flip the slot parity, and make sure every rank is done reading the
 * generation before the previous one (which used the same parity). sig != 0 starts a call:
 * these waits are for epochs of the previous call, so they compare the signatures of the
 * peers this rank did not wait for in it; then this call's signature is published. */
static inline int gc__gen_begin(gc_direct *g, uint64_t sig, int64_t deadline)
{
    uint64_t need = g->gen_prev_first;
    g->gen_prev_first = g->epoch + 1;
    g->parity ^= 1;
    if (need) {
        int st = gc__wait_all(g, need, deadline);
        if (st) {
            g->bad_prev = st == GC_ERR_MISMATCH && sig && g->bad_by == g->rank;
            return st;
        }
    }
    if (sig) {
        uint64_t k = ++g->calls;
        g->sig = sig;
        g->call_base = g->epoch;
        g->verified[g->rank] = k;
        /* the first post of the call releases it */
        __atomic_store_n(&gc__line(g, g->rank)->sig[k & 1], sig, __ATOMIC_RELAXED);
    }
    return GC_OK;
}

static inline int gc__enter(gc_direct *g)
{
    return g->broken || !g->base ? GC_ERR_USAGE : GC_OK;
}

/* Rooted calls: after this rank's first post of the call, wait until every peer has made its
 * own first post of the call too, comparing each one's signature (gc__wait does). It is an
 * arrival check, not a completion wait: every rank posts first thing in a call, so in a loop
 * the peers are usually there already. It makes every rank of a rooted call see every other
 * rank's root in that call: ranks that disagree (each its own root, or roots {0, 0, 1})
 * all fail in it, before any data is read, instead of returning their own data and leaving
 * the mismatch to the next call. */
static inline int gc__agree(gc_direct *g, int64_t deadline)
{
    return gc__wait_all(g, g->call_base + 1, deadline);
}

static inline void gc__copy(void *dst, const void *src, size_t n)
{
    if (dst != src && n)
        memcpy(dst, src, n);
}

#define GC__TRY(x)              \
    do {                        \
        int st_ = (x);          \
        if (st_)                \
            return st_;         \
    } while (0)

/* dst = x_0 OP x_1 OP ... OP x_{N-1}, left to right, where x_r is rank r's slot at slot_off,
 * or `own` for this rank when own != NULL (its data is then not staged). Each rank's term is
 * combined as soon as that rank has posted epoch e. */
static inline int gc__reduce_ranks(gc_direct *g, void *dst, const void *own, size_t slot_off,
                                   size_t n, gc_dtype dt, gc_op op, uint64_t e, int64_t dl)
{
#define GC__SRC(r) ((r) == g->rank && own ? own : (const void *)(gc__slot(g, (r)) + slot_off))
    GC__TRY(gc__wait(g, 0, e, dl));
    GC__TRY(gc__wait(g, 1, e, dl));
    gc_reduce2(dst, GC__SRC(0), GC__SRC(1), n, dt, op);
    for (int r = 2; r < g->nranks; r++) {
        GC__TRY(gc__wait(g, r, e, dl));
        gc_reduce(dst, GC__SRC(r), n, dt, op);
    }
#undef GC__SRC
    return GC_OK;
}

/* Split `c` elements into nranks parts aligned to cache lines: part j is [lo, lo + len). */
static inline void gc__part(size_t c, int nranks, size_t isz, int j, size_t *lo, size_t *len)
{
    size_t align = isz >= GC_DIRECT_LINE ? 1 : GC_DIRECT_LINE / isz;
    size_t q = gc__round_up((c + (size_t)nranks - 1) / (size_t)nranks, align);
    size_t a = q * (size_t)j;
    *lo = a < c ? a : c;
    *len = (a + q < c ? a + q : c) - *lo;
}

/* Elements per piece when a round stages one piece per rank in a slot. */
static inline size_t gc__piece_elems(const gc_direct *g, size_t isz)
{
    size_t per = g->slot_bytes / (size_t)g->nranks;
    per -= per % GC_DIRECT_LINE;
    return per / isz;
}

static inline int gc__check_reduce(gc_direct *g, gc_dtype dt, gc_op op, size_t *isz)
{
    GC__TRY(gc__enter(g));
    if (!gc_op_valid(dt, op) || (*isz = gc_dtype_size(dt)) == 0)
        return GC_ERR_USAGE;
    return GC_OK;
}

/* ---- reductions ----------------------------------------------------------------------------- */

/* Allreduce (root < 0) or reduce to root. send == recv is in place. recv may be NULL on the
 * non-root ranks of a reduce. */
static int gc__allreduce_impl(gc_direct *g, const void *send, void *recv, size_t count,
                              gc_dtype dt, gc_op op, int root, double timeout_s)
{
    size_t isz;
    GC__TRY(gc__check_reduce(g, dt, op, &isz));
    if (root >= g->nranks)
        return GC_ERR_USAGE;
    const int N = g->nranks, me = g->rank;
    const gc_op rop = op == GC_AVG ? GC_SUM : op;
    const int mine = root < 0 || root == me; /* this rank receives the result */
    const uint8_t *in = (const uint8_t *)send;
    uint8_t *out = (uint8_t *)recv;
    if (count == 0)
        return GC_OK;
    if (N == 1) {
        gc__copy(out, in, count * isz); /* AVG over one rank is the identity */
        return GC_OK;
    }
    int64_t dl = gc__deadline(timeout_s);
    size_t bytes = count * isz;
    const uint64_t sig = gc_direct_sig(root < 0 ? GC_KIND_ALLREDUCE : GC_KIND_REDUCE, count, dt, op,
                                       root);

    if (bytes <= g->oneshot_max && bytes <= g->slot_bytes) {
        /* One-shot: one post, then every receiving rank combines all slots itself. */
        GC__TRY(gc__gen_begin(g, sig, dl));
        memcpy(gc__slot(g, me), in, bytes);
        uint64_t e = gc__post(g);
        if (root >= 0)
            GC__TRY(gc__agree(g, dl));
        if (mine) {
            GC__TRY(gc__reduce_ranks(g, out, NULL, 0, count, dt, rop, e, dl));
            if (op == GC_AVG)
                gc_scale_avg(out, count, dt, N);
        }
        return GC_OK;
    }

    /* Two-shot, pipelined in rounds: rank i combines part i of every rank's chunk into its own
     * slot (its own term read from its input, not staged), then every receiver copies all
     * combined parts out. */
    size_t round = g->round_max < g->slot_bytes ? g->round_max : g->slot_bytes;
    size_t per_round = round / isz;
    if (per_round < (size_t)N)
        per_round = g->slot_bytes / isz;
    for (size_t off = 0; off < count; off += per_round) {
        size_t c = count - off < per_round ? count - off : per_round;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        uint8_t *mys = gc__slot(g, me);
        size_t lo, len;
        for (int j = 0; j < N; j++) {
            if (j == me)
                continue;
            gc__part(c, N, isz, j, &lo, &len);
            if (len)
                memcpy(mys + lo * isz, in + (off + lo) * isz, len * isz);
        }
        uint64_t ea = gc__post(g);
        if (root >= 0 && off == 0)
            GC__TRY(gc__agree(g, dl));
        gc__part(c, N, isz, me, &lo, &len);
        if (len) {
            GC__TRY(gc__reduce_ranks(g, mys + lo * isz, in + (off + lo) * isz, lo * isz, len, dt,
                                     rop, ea, dl));
            if (op == GC_AVG)
                gc_scale_avg(mys + lo * isz, len, dt, N);
        }
        uint64_t eb = gc__post(g);
        if (!mine)
            continue;
        for (int k = 0; k < N; k++) {
            int j = (me + k) % N;
            gc__part(c, N, isz, j, &lo, &len);
            if (!len)
                continue;
            GC__TRY(gc__wait(g, j, eb, dl));
            memcpy(out + (off + lo) * isz, gc__slot(g, j) + lo * isz, len * isz);
        }
    }
    return GC_OK;
}

static inline int gc_direct_allreduce(gc_direct *g, const void *send, void *recv, size_t count,
                                      gc_dtype dt, gc_op op, double timeout_s)
{
    return gc__allreduce_impl(g, send, recv, count, dt, op, -1, timeout_s);
}

static inline int gc_direct_reduce(gc_direct *g, const void *send, void *recv, size_t count,
                                   gc_dtype dt, gc_op op, int root, double timeout_s)
{
    if (root < 0)
        return GC_ERR_USAGE;
    return gc__allreduce_impl(g, send, recv, count, dt, op, root, timeout_s);
}

/* Rank i receives block i of the element-wise reduction of every rank's N blocks of `count`.
 * send == recv is in place: the input is the whole buffer, the result its first block. */
static int gc_direct_reduce_scatter_block(gc_direct *g, const void *send, void *recv,
                                          size_t count, gc_dtype dt, gc_op op, double timeout_s)
{
    size_t isz;
    GC__TRY(gc__check_reduce(g, dt, op, &isz));
    const int N = g->nranks, me = g->rank;
    const gc_op rop = op == GC_AVG ? GC_SUM : op;
    const uint8_t *in = (const uint8_t *)send;
    uint8_t *out = (uint8_t *)recv;
    if (count == 0)
        return GC_OK;
    if (N == 1) {
        gc__copy(out, in, count * isz);
        return GC_OK;
    }
    int64_t dl = gc__deadline(timeout_s);
    const uint64_t sig = gc_direct_sig(GC_KIND_REDUCE_SCATTER, count, dt, op, -1);
    size_t piece = gc__piece_elems(g, isz);
    for (size_t off = 0; off < count; off += piece) {
        size_t c = count - off < piece ? count - off : piece;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        uint8_t *mys = gc__slot(g, me);
        for (int j = 0; j < N; j++)
            if (j != me)
                memcpy(mys + (size_t)j * piece * isz, in + ((size_t)j * count + off) * isz,
                       c * isz);
        uint64_t e = gc__post(g);
        uint8_t *dst = out + off * isz;
        GC__TRY(gc__reduce_ranks(g, dst, in + ((size_t)me * count + off) * isz,
                                 (size_t)me * piece * isz, c, dt, rop, e, dl));
        if (op == GC_AVG)
            gc_scale_avg(dst, c, dt, N);
    }
    return GC_OK;
}

/* ---- data movement (sizes in bytes) --------------------------------------------------------- */

static int gc_direct_bcast(gc_direct *g, void *buf, size_t bytes, int root, double timeout_s)
{
    GC__TRY(gc__enter(g));
    if (root < 0 || root >= g->nranks)
        return GC_ERR_USAGE;
    if (bytes == 0 || g->nranks == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    const uint64_t sig = gc_direct_sig(GC_KIND_BCAST, bytes, GC_SIG_NONE, GC_SIG_NONE, root);
    uint8_t *p = (uint8_t *)buf;
    for (size_t off = 0; off < bytes; off += g->slot_bytes) {
        size_t c = bytes - off < g->slot_bytes ? bytes - off : g->slot_bytes;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        if (g->rank == root)
            memcpy(gc__slot(g, root), p + off, c);
        uint64_t e = gc__post(g);
        if (off == 0)
            GC__TRY(gc__agree(g, dl));
        if (g->rank != root) {
            GC__TRY(gc__wait(g, root, e, dl));
            memcpy(p + off, gc__slot(g, root), c);
        }
    }
    return GC_OK;
}

/* recv holds N blocks of `bytes`; send == recv means this rank's block is already in place
 * at recv + rank * bytes. */
static int gc_direct_allgather(gc_direct *g, const void *send, void *recv, size_t bytes,
                               double timeout_s)
{
    GC__TRY(gc__enter(g));
    const int N = g->nranks, me = g->rank;
    uint8_t *out = (uint8_t *)recv;
    const uint8_t *own = send == recv ? out + (size_t)me * bytes : (const uint8_t *)send;
    if (bytes == 0)
        return GC_OK;
    gc__copy(out + (size_t)me * bytes, own, bytes);
    if (N == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    const uint64_t sig = gc_direct_sig(GC_KIND_ALLGATHER, bytes, GC_SIG_NONE, GC_SIG_NONE, -1);
    for (size_t off = 0; off < bytes; off += g->slot_bytes) {
        size_t c = bytes - off < g->slot_bytes ? bytes - off : g->slot_bytes;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        memcpy(gc__slot(g, me), own + off, c);
        uint64_t e = gc__post(g);
        for (int k = 1; k < N; k++) {
            int j = (me + k) % N;
            GC__TRY(gc__wait(g, j, e, dl));
            memcpy(out + (size_t)j * bytes + off, gc__slot(g, j), c);
        }
    }
    return GC_OK;
}

/* Root's recv holds N blocks; send == recv at the root means its block is already in place. */
static int gc_direct_gather(gc_direct *g, const void *send, void *recv, size_t bytes, int root,
                            double timeout_s)
{
    GC__TRY(gc__enter(g));
    const int N = g->nranks, me = g->rank;
    if (root < 0 || root >= N)
        return GC_ERR_USAGE;
    uint8_t *out = (uint8_t *)recv;
    if (bytes == 0)
        return GC_OK;
    if (me == root && send != recv)
        gc__copy(out + (size_t)me * bytes, send, bytes);
    if (N == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    const uint64_t sig = gc_direct_sig(GC_KIND_GATHER, bytes, GC_SIG_NONE, GC_SIG_NONE, root);
    const uint8_t *in = (const uint8_t *)send;
    for (size_t off = 0; off < bytes; off += g->slot_bytes) {
        size_t c = bytes - off < g->slot_bytes ? bytes - off : g->slot_bytes;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        if (me != root)
            memcpy(gc__slot(g, me), in + off, c);
        uint64_t e = gc__post(g);
        if (off == 0)
            GC__TRY(gc__agree(g, dl));
        if (me != root)
            continue;
        for (int k = 1; k < N; k++) {
            int j = (me + k) % N;
            GC__TRY(gc__wait(g, j, e, dl));
            memcpy(out + (size_t)j * bytes + off, gc__slot(g, j), c);
        }
    }
    return GC_OK;
}

/* Root's send holds N blocks; send == recv at the root leaves its block where it is. */
static int gc_direct_scatter(gc_direct *g, const void *send, void *recv, size_t bytes, int root,
                             double timeout_s)
{
    GC__TRY(gc__enter(g));
    const int N = g->nranks, me = g->rank;
    if (root < 0 || root >= N)
        return GC_ERR_USAGE;
    const uint8_t *in = (const uint8_t *)send;
    uint8_t *out = (uint8_t *)recv;
    if (bytes == 0)
        return GC_OK;
    if (me == root && send != recv)
        gc__copy(out, in + (size_t)me * bytes, bytes);
    if (N == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    const uint64_t sig = gc_direct_sig(GC_KIND_SCATTER, bytes, GC_SIG_NONE, GC_SIG_NONE, root);
    size_t piece = gc__piece_elems(g, 1);
    for (size_t off = 0; off < bytes; off += piece) {
        size_t c = bytes - off < piece ? bytes - off : piece;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        if (me == root)
            for (int j = 0; j < N; j++)
                if (j != root)
                    memcpy(gc__slot(g, root) + (size_t)j * piece, in + (size_t)j * bytes + off,
                           c);
        uint64_t e = gc__post(g);
        if (off == 0)
            GC__TRY(gc__agree(g, dl));
        if (me != root) {
            GC__TRY(gc__wait(g, root, e, dl));
            memcpy(out + off, gc__slot(g, root) + (size_t)me * piece, c);
        }
    }
    return GC_OK;
}

/* Can this rank read every peer's memory with process_vm_readv (same pid namespace, ptrace
 * permission)? Each peer's probe word is read back and compared, once per group. */
static int gc__cma_probe(gc_direct *g)
{
    if (g->cma)
        return g->cma > 0;
    int verdict = 1;
    for (int r = 0; r < g->nranks && verdict > 0; r++) {
        const gc_direct_proc *p = &g->procs[r];
        int32_t pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        uint64_t word = 0;
        if (r == g->rank)
            continue;
        if (pid <= 0)
            return 0;  /* not attached yet (a communicator's first call): ask again next time */
        if (p->pidns != g->pidns || gc_cma_move((pid_t)pid, (char *)&word, p->probe_addr, sizeof word, 0) ||
            word != p->probe_value)
            verdict = -1;
    }
    g->cma = verdict;
    return verdict > 0;
}

/* A peer's buffer could not be read: when it ended, name it to every rank, as a wait that finds
 * it dead does; when it lives (its memory went away under the call), post as the call would,
 * so that no other rank waits for this one in it. Either way this rank's group is broken. */
static int gc__cma_failed(gc_direct *g, int peer, int64_t started_ns)
{
    int32_t none = 0;
    if (gc__rank_dead(g, peer))
        __atomic_compare_exchange_n(&g->hdr->lost, &none, peer + 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    else
        gc__post(g);
    g->nmissing = g->ndead = 0;
    g->missing[g->nmissing++] = peer;
    g->dead[g->ndead++] = peer;
    g->waited_s = (double)(gc__now_ns() - started_ns) * 1e-9;
    g->broken = 1;
    return GC_ERR_PEER;
}

/* Large all-to-all in one copy: every rank publishes where its send buffer is and whether it
 * can read every peer; when all can, each reads its block of every peer's buffer straight into
 * its own (process_vm_readv), and waits until every peer is done reading its buffer before it
 * returns. Two synchronisations, and each byte crosses memory once instead of twice through
 * the slots. Returns 1 when some rank cannot (the caller then stages, in the same call: every
 * rank sees the same answers, so all take the same way). */
static int gc__alltoall_cma(gc_direct *g, const uint8_t *in, uint8_t *out, size_t bytes,
                            uint64_t sig, int64_t dl)
{
    const int N = g->nranks, me = g->rank;
    GC__TRY(gc__gen_begin(g, sig, dl));
    uint64_t *mine = (uint64_t *)gc__slot(g, me);
    mine[0] = (uint64_t)(uintptr_t)in;
    mine[1] = (uint64_t)gc__cma_probe(g);
    uint64_t e = gc__post(g);
    GC__TRY(gc__wait_all(g, e, dl));
    for (int r = 0; r < N; r++)
        if (!((const uint64_t *)gc__slot(g, r))[1])
            return 1;
    int64_t started = gc__now_ns();
    for (int k = 1; k < N; k++) {
        int j = (me + k) % N;
        const gc_direct_proc *p = &g->procs[j];
        uint64_t from = ((const uint64_t *)gc__slot(g, j))[0] + (uint64_t)me * bytes;
        if (gc_cma_move((pid_t)p->pid, (char *)out + (size_t)j * bytes, from, bytes, 0))
            return gc__cma_failed(g, j, started);
    }
    g->cma_calls++;
    e = gc__post(g);
    return gc__wait_all(g, e, dl);
}

/* send and recv hold N blocks of `bytes`; block j of send goes to rank j. send == recv is in
 * place. */
static int gc_direct_alltoall(gc_direct *g, const void *send, void *recv, size_t bytes,
                              double timeout_s)
{
    GC__TRY(gc__enter(g));
    const int N = g->nranks, me = g->rank;
    const uint8_t *in = (const uint8_t *)send;
    uint8_t *out = (uint8_t *)recv;
    if (bytes == 0)
        return GC_OK;
    gc__copy(out + (size_t)me * bytes, in + (size_t)me * bytes, bytes);
    if (N == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    uint64_t sig = gc_direct_sig(GC_KIND_ALLTOALL, bytes, GC_SIG_NONE, GC_SIG_NONE, -1);
    /* In place, a peer's block could be overwritten before this rank has read it. */
    if (g->cma_min && bytes * (size_t)N >= g->cma_min && send != recv) {
        sig = gc_direct_sig(GC_KIND_ALLTOALL, bytes, GC_SIG_NONE, GC_SIG_SINGLE_COPY, -1);
        int st = gc__alltoall_cma(g, in, out, bytes, sig, dl);
        if (st <= 0)
            return st;
        sig = 0; /* published by the attempt: stage in the same call */
    }
    size_t piece = gc__piece_elems(g, 1);
    for (size_t off = 0; off < bytes; off += piece) {
        size_t c = bytes - off < piece ? bytes - off : piece;
        GC__TRY(gc__gen_begin(g, off ? 0 : sig, dl));
        uint8_t *mys = gc__slot(g, me);
        for (int j = 0; j < N; j++)
            if (j != me)
                memcpy(mys + (size_t)j * piece, in + (size_t)j * bytes + off, c);
        uint64_t e = gc__post(g);
        for (int k = 1; k < N; k++) {
            int j = (me + k) % N;
            GC__TRY(gc__wait(g, j, e, dl));
            memcpy(out + (size_t)j * bytes + off, gc__slot(g, j) + (size_t)me * piece, c);
        }
    }
    return GC_OK;
}

/* The v-collectives (blocks of any size per rank and pair, at any addresses). One generation:
 * each rank's slot holds a table, then its data when it fits:
 *
 *   u64 [0]        1: this rank's data is in the slot (or it has none to stage)
 *   u64 [1 + j]    bytes this rank sends to rank j; one block for every receiver: [1] only
 *   H              per receiver j: its block at H + j x piece; one block for all: at H
 *
 * Every rank reads every table after one post (which also compares the call signatures, the
 * root included): each receiver checks that what a peer sends it is what it expects (else a
 * mismatch naming the peer, before any data is read), and the data is copied out only when
 * every rank's data is in its slot; otherwise every rank returns GC_DIRECT_DECLINED, having
 * read the same tables, and the caller moves the data another way.
 *
 *   kind                  sends                          receives from
 *   GC_KIND_ALLGATHERV    one block, to every rank       every rank
 *   GC_KIND_ALLTOALLV     block j to rank j (nsend = N)  every rank
 *   GC_KIND_GATHERV       one block, to root             root: every rank; others: none
 *   GC_KIND_SCATTERV      root: block j to rank j        root (others); root: itself only
 */
static inline size_t gc__vtable_bytes(int entries)
{
    return gc__round_up((size_t)(entries + 1) * sizeof(uint64_t), GC_DIRECT_LINE);
}

/* A peer sends this rank `theirs` bytes where it expects `ours`: a mismatch of the call. */
static int gc__vmismatch(gc_direct *g, int kind, int root, int peer, uint64_t theirs, uint64_t ours)
{
    g->sig = gc_direct_sig(kind, ours, GC_SIG_NONE, GC_SIG_NONE, root);
    return gc__mismatch(g, peer, gc_direct_sig(kind, theirs, GC_SIG_NONE, GC_SIG_NONE, root));
}

/* This rank's part of a v-collective (see the table above; root -1 for the unrooted kinds):
 * saddr[j], sbytes[j] for j < nsend (nsend 1: one block, 0: nothing to send); this rank
 * receives rbytes[j] at raddr[j] from each rank j it receives from (raddr, rbytes: N entries).
 * Addresses are absolute. Its own block is copied when rbytes[me] is not 0 (the caller has
 * checked that the sizes agree). */
static int gc_direct_vexchange(gc_direct *g, int kind, int root, const uint64_t *saddr,
                               const uint64_t *sbytes, int nsend, const uint64_t *raddr,
                               const uint64_t *rbytes, double timeout_s)
{
    GC__TRY(gc__enter(g));
    const int N = g->nranks, me = g->rank;
    const int rooted = kind == GC_KIND_GATHERV || kind == GC_KIND_SCATTERV;
    if ((rooted && (root < 0 || root >= N)) || (!rooted && root != -1) || nsend < 0 || nsend > N ||
        (nsend > 1 && nsend != N))
        return GC_ERR_USAGE;
    const int one = nsend == 1;  /* one block for every receiver */
    const void *own = nsend == 0 ? NULL : (const void *)(uintptr_t)saddr[one ? 0 : me];
    if (rbytes[me])
        gc__copy((void *)(uintptr_t)raddr[me], own, rbytes[me]);
    if (N == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    const size_t head = gc__vtable_bytes(one ? 1 : N);
    const size_t room = g->slot_bytes - head;
    const size_t piece = one ? room : room / (size_t)N / GC_DIRECT_LINE * GC_DIRECT_LINE;
    GC__TRY(gc__gen_begin(g, gc_direct_sig(kind, 0, GC_SIG_NONE, GC_SIG_NONE, root), dl));
    uint64_t *table = (uint64_t *)gc__slot(g, me);
    uint8_t *data = (uint8_t *)table + head;
    /* gather's root keeps its own block: nobody reads it from the slot */
    const int stage = !(kind == GC_KIND_GATHERV && me == root);
    int fits = 1;
    for (int j = 0; j < nsend; j++) {
        table[1 + j] = sbytes[j];
        if (stage && (one || j != me))
            fits &= sbytes[j] <= piece;
    }
    if (fits && stage) {
        if (one)
            memcpy(data, own, sbytes[0]);
        else
            for (int j = 0; j < nsend; j++)
                if (j != me)
                    memcpy(data + (size_t)j * piece, (const void *)(uintptr_t)saddr[j], sbytes[j]);
    }
    table[0] = (uint64_t)fits;
    uint64_t e = gc__post(g);
    GC__TRY(gc__wait_all(g, e, dl));
    int staged = fits;
    for (int j = 0; j < N; j++)
        staged &= ((const uint64_t *)gc__slot(g, j))[0] != 0;
    /* The peers this rank receives from, each checked before any copy. */
    const int all = !rooted || (kind == GC_KIND_GATHERV && me == root);
    for (int k = 1; k < N; k++) {
        int j = (me + k) % N;
        if (!all && !(kind == GC_KIND_SCATTERV && j == root))
            continue;
        const uint64_t *theirs = (const uint64_t *)gc__slot(g, j);
        int their_one = kind == GC_KIND_ALLGATHERV || kind == GC_KIND_GATHERV;
        uint64_t sent = theirs[1 + (their_one ? 0 : me)];
        if (sent != rbytes[j])
            return gc__vmismatch(g, kind, root, j, sent, rbytes[j]);
    }
    if (!staged)
        return GC_DIRECT_DECLINED;
    for (int k = 1; k < N; k++) {
        int j = (me + k) % N;
        if (!all && !(kind == GC_KIND_SCATTERV && j == root))
            continue;
        int their_one = kind == GC_KIND_ALLGATHERV || kind == GC_KIND_GATHERV;
        size_t their_head = gc__vtable_bytes(their_one ? 1 : N);
        size_t their_piece = their_one ? 0 : (g->slot_bytes - their_head) / (size_t)N / GC_DIRECT_LINE *
                                                 GC_DIRECT_LINE;
        const uint8_t *from = gc__slot(g, j) + their_head + (size_t)me * their_piece;
        memcpy((void *)(uintptr_t)raddr[j], from, rbytes[j]);
    }
    return GC_OK;
}

/* A barrier that carries the signature of a call (kind, count, dtype, op, root as in
 * gc_direct_sig): every rank compares every other rank's, so calls made elsewhere (a GPU
 * collective, whose kernels carry no signature) can be checked here before they start. */
static int gc_direct_announce(gc_direct *g, int kind, uint64_t count, int dt, int op, int root,
                              double timeout_s)
{
    GC__TRY(gc__enter(g));
    if (g->nranks == 1)
        return GC_OK;
    int64_t dl = gc__deadline(timeout_s);
    GC__TRY(gc__gen_begin(g, gc_direct_sig(kind, count, dt, op, root), dl));
    uint64_t e = gc__post(g);
    return gc__wait_all(g, e, dl);
}

static int gc_direct_barrier(gc_direct *g, double timeout_s)
{
    return gc_direct_announce(g, GC_KIND_BARRIER, 0, GC_SIG_NONE, GC_SIG_NONE, -1, timeout_s);
}

#undef GC__TRY
#endif
