/* Point to point: MPI matching and the eager / rendezvous protocols over gc_chan channels.
 *
 * One engine per process. It owns no channel: Python opens one gc_chan per peer process
 * (shared memory within a host, TCP between hosts, both authenticated;
 * gpucoll/transports/links.py) and hands its address to gc_p2p_set_channel. Every message travels as a frame on the sender's channel to the
 * receiver, a fixed 48-byte header (gc_p2p_hdr) and, for some kinds, a payload:
 *
 *   EAGER  comm, tag, nbytes, id, flags + the nbytes of the message     (small messages)
 *   RTS    comm, tag, nbytes, id, addr                                    (large: "ready to send")
 *   CTS    id                  receiver -> sender: "send the bytes of send id now"
 *   DATA   id, nbytes + the bytes of the rendezvous send id
 *   ACK    id, status          receiver -> sender: send id is matched and its bytes are taken
 *   DEST   id, addr            receiver -> sender: the bytes of send id go to addr (a shared copy)
 *   DONE   id, status, addr    sender -> receiver: it wrote status chunks of send id; addr: 0, or
 *                              1 + a chunk it claimed but could not write
 *   PAD    nbytes + nbytes bytes that are read away (striped TCP: see gc_p2p__pad)
 *
 * Matching (MPI's rules). A receive names (communicator key, source or ANY, tag or ANY; ANY_TAG
 * matches tags >= 0 only: negative tags are gpucoll's own). An arriving EAGER or RTS header is
 * matched against the posted receives in the order they were posted; one that matches none joins
 * the unexpected queue in arrival order, and a new receive first looks there. A channel is one
 * ordered byte stream and headers are matched as they are read, so two messages from one sender
 * never overtake each other.
 *
 * Protocols. EAGER sends complete once their bytes are in the channel (a synchronous send, flag
 * SYNC, once the receiver's ACK says it matched). A large send goes as RTS with the address of its
 * bytes; the receiver, once matched, copies them straight from the sender's memory with
 * process_vm_readv (cross-memory attach: one copy; in its next waits, tests or probes, oldest
 * match first) and answers ACK once every byte is in; where that is not possible (another host,
 * no permission) it answers CTS and the sender streams DATA, pipelined through the channel.
 * Answers (CTS, ACK, DEST, DONE) overtake the queued frames not yet started, so a peer's
 * transfer never waits behind this rank's own stream.
 * Messages to oneself are matched at once (a copy).
 *
 * Shared copy (within a host, a message of two chunks or more, GPUCOLL_P2P_SHARED_COPY). The two
 * cores copy one message together. The sender takes a free claims word of the pair's shared
 * memory (gc_chan.pair_words: the shm segment's first page), zeroes it and names it in the RTS
 * (flag SHARE, status = the word). The matched receiver answers DEST with its destination and
 * reads chunks (GC_P2P_SHARE_CHUNK and up, at most about GC_P2P_SHARE_CHUNKS of them), one read
 * per pass, claimed by an atomic add to the word; the sender, in its waits, tests and probes and
 * only when it has no matched receive of its own to read, claims chunks from the same word
 * and writes them with process_vm_writev until none is left, then sends DONE with how many it
 * wrote. Each side publishes in the last word of its half whether it is free to help so: while
 * the sender is, or has claimed a chunk, the receiver claims one chunk at a time; while it is
 * not (both directions at once), as many as one read takes (the cost of a copy alone). A side
 * that is busy elsewhere claims nothing, so the other copies alone (a sender that never waits
 * costs the receiver nothing). The receive completes once its own chunks and
 * the sender's are in, and only then answers ACK: the sender's buffer and its claims word stay
 * until the ACK (or a CTS, after which the receiver claims nothing). A sender that cannot write
 * there (EPERM) says which chunk it claimed in DONE and helps that peer no more: the receiver
 * reads that chunk itself. A receive that falls back to CTS marks every chunk claimed first.
 *
 * Progress. Nothing runs behind the caller's back: every wait, test and probe pushes the queued
 * frames of every peer and reads whatever arrived, under one mutex, without the GIL; a pass
 * moves about GC_P2P_PUSH_MAX out and GC_P2P_PULL_MAX in per peer, so neither direction
 * starves the other. A call that posts (Isend, Irecv) only pushes: its frame leaves at once,
 * and what arrives meanwhile is read by the next wait in one go (a TCP read then takes many
 * small messages, not one per call, and finds every receive of the window posted). Only waits,
 * tests and probes copy rendezvous bytes: a rank that posts a window of Isends and Irecvs
 * announces all its sends before it starts copying its peer's, so both directions copy at
 * once. A wait spins,
 * then yields, then naps; every 100 ms without progress it asks each channel (and each known pid)
 * whether the peer lives. A peer found gone, or one that breaks the format (a bad kind, an EAGER
 * frame above GC_P2P_WIRE_EAGER_MAX, DATA nobody asked for), is "lost": what waits on it fails
 * with GC_ERR_PEER and its channel is no longer read; messages that arrived whole stay receivable.
 *
 * Requests are reference counted: one reference for the caller's handle (gc_p2p_release), one
 * while the engine still needs it. The caller keeps the request's buffer alive until it is done.
 */
#ifndef GC_P2P_H
#define GC_P2P_H
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "gc_proc.h"

#include "gc_chan.h"
#include "gc_proc.h"      /* gc_pid_dead */
#include "gc_shmchan.h"

#define GC_P2P_ANY         (-1)
#define GC_P2P_WAIT_LOSS   (-2)               /* gc_p2p_wait: a receive from any rank has a loss to look at */
#define GC_P2P_HDR_BYTES   48
#define GC_P2P_WIRE_EAGER_MAX (1u << 20)   /* an EAGER frame above this breaks the format */
#define GC_P2P_OFFER_MAX   4096u            /* a GPU offer describes memory: never more */
#define GC_P2P_COALESCE    (64u << 10)      /* header and payload up to this go in one push: copying
                                                them together costs less than a second write (a TCP
                                                segment) or, for a Send, a request */
#define GC_P2P_PUSH_CHUNK  (64u << 10)      /* payload pushed in pieces the receiver copies as they come */
#define GC_P2P_PUSH_MAX    (256u << 10)     /* one progress pass writes about this much to a peer:
                                                with both directions at once between hosts, a
                                                rank that filled its socket before reading again
                                                left the peer's bytes waiting in the kernel (and
                                                the peer's sends blocked); alternating in pieces,
                                                each direction keeps moving */
#define GC_P2P_CMA_CHUNK   (256u << 20)     /* one process_vm_readv moves at most this */
#define GC_P2P_SHARE_CHUNK (128u << 10)     /* a shared rendezvous copy goes in chunks of at least this, */
#define GC_P2P_SHARE_CHUNKS 64u             /* doubled until a message has at most this many */
#define GC_P2P_DIRECT_MIN  (64u << 10)      /* a payload from this size is read straight into its place
                                                where the channel can (TCP: no copy out of its ring) */
#define GC_P2P_PULL_MAX    (256u << 10)     /* one progress pass reads about this much of a peer:
                                                a wait that reads a streaming sender pushes its
                                                own frames in between */

enum { GC_P2P_EAGER = 1, GC_P2P_RTS = 2, GC_P2P_CTS = 3, GC_P2P_DATA = 4, GC_P2P_ACK = 5, GC_P2P_DEST = 6,
       GC_P2P_DONE = 7, GC_P2P_PAD = 8 };
#define GC_P2P_KIND_MASK 0xffu
#define GC_P2P_SYNC  0x100u   /* answer the match with ACK (synchronous send) */
#define GC_P2P_OFFER 0x200u   /* a GPU offer: delivered into its own buffer whatever the receive holds */
#define GC_P2P_SHARE 0x400u   /* RTS: the sender copies chunks too; status: its claims word of the pair */

/* Request errors beyond gc_types.h's */
#define GC_P2P_TRUNCATED  (-20)   /* the message is larger than the receive buffer */
#define GC_P2P_CANCELLED  (-21)   /* the communicator was freed while the receive was pending */
#define GC_P2P_TOOBIG     (-22)   /* an object message larger than this host's memory */

/* Why a peer is lost */
enum { GC_P2P_LIVE = 0, GC_P2P_GONE = 1, GC_P2P_BAD_KIND = 2, GC_P2P_BAD_SIZE = 3, GC_P2P_BAD_ID = 4,
       GC_P2P_CHAN_ERR = 5 };

enum { GC_P2P_SEND = 1, GC_P2P_RECV = 2 };
enum { GC_W_NONE = 0, GC_W_POSTED, GC_W_OUT, GC_W_ACK, GC_W_DATA, GC_W_CLAIM, GC_W_FILL, GC_W_COPY, GC_W_DONE };

typedef struct {
    uint64_t comm;
    int32_t tag;
    uint32_t kind;        /* GC_P2P_* kind | flags */
    uint64_t nbytes;
    uint64_t id;
    uint64_t addr;
    int64_t status;       /* ACK: GC_OK or the receive's error */
} gc_p2p_hdr;

typedef struct gc_p2p_req gc_p2p_req;
struct gc_p2p_req {
    gc_p2p_req *next, *prev;   /* in the posted queue or a peer's ACK / DATA wait list */
    int op, where, refs;
    volatile int done;
    int err;
    uint64_t comm;
    int32_t tag;
    int peer;                  /* send: destination; receive: source or GC_P2P_ANY */
    char *buf;                 /* send: the bytes; receive: where they go */
    uint64_t len;              /* send: nbytes; receive: capacity */
    int alloc;                 /* receive into a buffer of the message's size (objects, matched probes) */
    char *owned;               /* that buffer, or an offer's bytes (freed with the request) */
    uint64_t id;
    uint32_t flags;
    /* what a receive got */
    int src;
    int32_t rtag;
    uint64_t nbytes;
    uint32_t rflags;
    void *self_msg;            /* a synchronous send to oneself: the message that waits for its match */
    /* a matched rendezvous read from the sender's memory (GC_W_COPY); raddr: the other side's
     * address (a send that helps: the receiver's destination) */
    uint64_t raddr, copied;
    /* a shared copy: chunks claimed from the pair's word *claims; chunks_in: chunks known to be
     * in (receive); redo: 1 + a chunk the sender claimed but could not write (receive) */
    uint64_t *claims;
    uint64_t chunk, nchunks, chunks_in, redo;
    int slot;                  /* send: 1 + its claims word (freed at the answer), or 0 */
    gc_p2p_req *hnext;         /* in the engine's help queue (which holds a reference) */
    uint32_t losses_seen;      /* an ANY_SOURCE receive: the engine's losses its owner has looked at */
};

typedef struct gc_p2p_msg gc_p2p_msg;
struct gc_p2p_msg {            /* an arrived message that no receive has matched yet */
    gc_p2p_msg *next, *prev;
    gc_p2p_hdr h;
    int src;
    char *data;                /* EAGER: its bytes (malloc), RTS: none */
    uint64_t got;
    int complete;
    gc_p2p_req *claim;         /* a receive that matched it while its bytes were still arriving */
    gc_p2p_req *self_send;     /* a synchronous send to oneself waiting for this match */
};

typedef struct gc_p2p_out gc_p2p_out;
struct gc_p2p_out {            /* a frame queued toward one peer */
    gc_p2p_out *next;
    gc_p2p_hdr h;
    const char *payload;
    uint64_t plen, off;        /* off: bytes of header + payload pushed so far */
    gc_p2p_req *req;           /* completes when pushed (EAGER, DATA) */
    char *own;                 /* a copy of the payload this frame owns (freed with it), or NULL */
    int answer;                /* CTS, ACK, DEST or DONE: queued ahead of frames not started */
    uint64_t pad;              /* bytes of a PAD frame written right after this one (gc_p2p__pad) */
    gc_p2p_hdr padh;           /* that PAD frame's header */
};

typedef struct {
    gc_chan *chan;
    pid_t pid;                 /* the peer's pid where this process can watch it (same host and pid ns) */
    int cma;                   /* 1: try process_vm_readv on its memory; 0: not possible */
    int eager_max;
    int lost;                  /* GC_P2P_LIVE or why it is lost */
    uint64_t lost_value;       /* the announced size of a GC_P2P_BAD_SIZE frame, ... */
    gc_p2p_out *out_head, *out_tail;
    gc_p2p_req *acks;          /* sends waiting for ACK or CTS */
    gc_p2p_req *datas;         /* receives waiting for DATA, or for the sender's DONE (GC_W_DONE) */
    uint64_t slots_used[2];    /* claims words of pair_words[0] that sends to this peer hold */
    int help_off;              /* 1 once writing into its memory failed: it copies alone */
    /* reading */
    unsigned char hbuf[GC_P2P_HDR_BYTES];
    size_t hgot;
    int filling;               /* 1 while a payload is being read */
    gc_p2p_hdr cur;
    char *dst;                 /* where the payload goes (NULL: read away) */
    uint64_t left, total;
    gc_p2p_req *fill_req;
    gc_p2p_msg *fill_msg;
    /* a receive cut off in the middle of its message: for the error text */
    uint64_t cut_nbytes;
    int32_t cut_tag;
} gc_p2p_peer;

typedef struct {
    pthread_mutex_t mu;
    int me, n;
    gc_p2p_peer *peers;
    gc_p2p_req *posted_head, *posted_tail;
    gc_p2p_msg *ux_head, *ux_tail;
    gc_p2p_req *copy_head, *copy_tail;   /* matched rendezvous receives whose bytes are still to be read */
    gc_p2p_req *help_head, *help_tail;   /* sends whose receiver told where their bytes go */
    int share;                 /* 1: senders within a host copy chunks too (a shared copy) */
    int free_to_help;          /* as last published in each pair's helping word */
    uint64_t bytes_read, bytes_written;  /* rendezvous bytes this process copied (tests, stats) */
    uint64_t next_id;
    uint64_t max_message;      /* an object message above this cannot be received here */
    char *frame;               /* GC_P2P_COALESCE bytes: a header and its payload pushed together */
    volatile uint64_t progress_count;
    uint64_t *revoked;         /* communicators revoked here (ULFM): their offers are refused */
    int nrevoked;
    uint32_t losses;           /* peers lost so far: a wait on an ANY_SOURCE receive that has not
                                * looked at the latest loss returns for its owner to decide */
    double peers_checked;      /* when gc_p2p_check_peers last asked (a probe's loop) */
    gc_p2p_req sent;           /* the request of every Isend written whole at its start
                                * (gc_p2p_send_now): done, shared, never freed (gc_p2p_sent) */
} gc_p2p;

/* ---- lists ------------------------------------------------------------------------------ */

static void gc_p2p__req_unlink(gc_p2p_req **head, gc_p2p_req **tail, gc_p2p_req *r)
{
    if (r->prev) r->prev->next = r->next; else *head = r->next;
    if (r->next) r->next->prev = r->prev; else if (tail) *tail = r->prev;
    r->next = r->prev = NULL;
}

static void gc_p2p__req_push(gc_p2p_req **head, gc_p2p_req **tail, gc_p2p_req *r)
{
    r->next = NULL;
    if (tail) {
        r->prev = *tail;
        if (*tail) (*tail)->next = r; else *head = r;
        *tail = r;
    } else {                  /* an unordered list: push at the front */
        r->prev = NULL;
        r->next = *head;
        if (*head) (*head)->prev = r;
        *head = r;
    }
}

static void gc_p2p__msg_unlink(gc_p2p *e, gc_p2p_msg *m)
{
    if (m->prev) m->prev->next = m->next; else e->ux_head = m->next;
    if (m->next) m->next->prev = m->prev; else e->ux_tail = m->prev;
    m->next = m->prev = NULL;
}

static void gc_p2p__msg_push(gc_p2p *e, gc_p2p_msg *m)
{
    m->next = NULL;
    m->prev = e->ux_tail;
    if (e->ux_tail) e->ux_tail->next = m; else e->ux_head = m;
    e->ux_tail = m;
}

static void gc_p2p__req_free(gc_p2p_req *r)
{
    free(r->owned);
    free(r);
}

/* Drop one reference; the last one frees the request. */
static void gc_p2p__unref(gc_p2p_req *r)
{
    if (--r->refs == 0)
        gc_p2p__req_free(r);
}

static void gc_p2p__finish(gc_p2p_req *r, int err)
{
    r->err = err;
    r->where = GC_W_NONE;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    gc_p2p__unref(r);          /* the engine's reference */
}

static inline int gc_p2p__matches(const gc_p2p_req *r, uint64_t comm, int src, int32_t tag)
{
    return r->comm == comm && (r->peer == GC_P2P_ANY || r->peer == src)
        && (r->tag == tag || (r->tag == GC_P2P_ANY && tag >= 0));
}

/* ---- sending frames ----------------------------------------------------------------------- */

/* Queue a frame toward peer: at the tail, or (answer) ahead of every frame not started but
 * behind the earlier answers. An answer (CTS, ACK, DEST, DONE) is a header the peer's transfer
 * waits on: behind a window of this rank's own DATA (both directions at once between hosts) a
 * CTS would hold the peer's sends until all of this rank's bytes were out, one direction after
 * the other. Answers match nothing, so the order of the matched frames (EAGER, RTS) is kept. */
static gc_p2p_out *gc_p2p__enqueue(gc_p2p *e, int peer, const gc_p2p_hdr *h, const char *payload,
                                   uint64_t plen, gc_p2p_req *req, int answer)
{
    gc_p2p_out *o = (gc_p2p_out *)calloc(1, sizeof *o);
    if (!o) return NULL;
    o->h = *h;
    o->payload = payload;
    o->plen = plen;
    o->req = req;
    o->answer = answer;
    gc_p2p_peer *p = &e->peers[peer];
    gc_p2p_out **at = answer ? &p->out_head : (p->out_tail ? &p->out_tail->next : &p->out_head);
    if (answer) {
        if (*at && (*at)->off > 0)   /* the frame going out now finishes first */
            at = &(*at)->next;
        while (*at && (*at)->answer)
            at = &(*at)->next;
    }
    o->next = *at;
    *at = o;
    if (!o->next) p->out_tail = o;
    return o;
}

static gc_p2p_out *gc_p2p__queue(gc_p2p *e, int peer, const gc_p2p_hdr *h, const char *payload,
                                 uint64_t plen, gc_p2p_req *req)
{
    return gc_p2p__enqueue(e, peer, h, payload, plen, req, 0);
}

static void gc_p2p__lose(gc_p2p *e, int peer, int why, uint64_t value);
static int gc_p2p__push(gc_p2p *e, int peer);

static void gc_p2p__control_at(gc_p2p *e, int peer, int kind, uint64_t id, int64_t status, uint64_t addr)
{
    gc_p2p_hdr h;
    memset(&h, 0, sizeof h);
    h.kind = (uint32_t)kind;
    h.id = id;
    h.status = status;
    h.addr = addr;
    /* The peer may wait for this answer while this process leaves point to point (for a
     * collective, say): it goes out now, not at the next progress pass. Nowhere to say it
     * (the peer is gone) or no memory: the peer's wait fails on its own. */
    if (!e->peers[peer].lost && gc_p2p__enqueue(e, peer, &h, NULL, 0, NULL, 1) && e->peers[peer].chan)
        gc_p2p__push(e, peer);
}

static void gc_p2p__control(gc_p2p *e, int peer, int kind, uint64_t id, int64_t status)
{
    gc_p2p__control_at(e, peer, kind, id, status, 0);
}

/* Stripe padding. A TCP channel over several sockets cuts its stream into fixed chunks, one
 * socket each in turn: a frame written across a chunk's end arrives as two short TCP segments on
 * two sockets. Short segments among a stream of longer frames cost every later frame of two
 * segments or more an ACK sent from inside the receiver's recv(), after the frame arrived: each
 * such segment lets the receive window's threshold (rcv_ssthresh) grow to the free space it left,
 * which a longer frame's arrival then no longer reaches, so the kernel no longer ACKs at arrival
 * (in the sender's softirq) but when the data is read (tcp_cleanup_rbuf), in the receiver's
 * recv() before the frame is handed over (over veth, with the ACK's whole path). So a frame of up
 * to half GC_P2P_COALESCE that leaves less room in its chunk than it takes itself (plus a header)
 * is followed, in the same write, by a PAD frame up to the chunk's end: a stream of equal frames
 * never crosses a stripe boundary, at the cost of less than one frame per chunk. Returns the PAD
 * frame's size for a frame of `total` bytes written now (no earlier bytes still to be offered),
 * or 0. */
static const char gc_p2p__zeros[GC_P2P_COALESCE / 2];

static inline uint64_t gc_p2p__pad(gc_chan *c, uint64_t total)
{
    if (!c->stripe_room)
        return 0;
    uint64_t room = c->stripe_room(c);
    if (room <= total)             /* not striped, ends at the boundary, or crosses it anyway */
        return 0;
    uint64_t rest = room - total;
    if (rest < GC_P2P_HDR_BYTES || rest >= total + GC_P2P_HDR_BYTES || total + rest > GC_P2P_COALESCE)
        return 0;
    return rest;
}

/* A PAD frame of `pad` bytes (a header and zeros) at `at`; its header also in *h. */
static inline void gc_p2p__pad_write(char *at, uint64_t pad, gc_p2p_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->kind = GC_P2P_PAD;
    h->nbytes = pad - GC_P2P_HDR_BYTES;
    memcpy(at, h, GC_P2P_HDR_BYTES);
    memset(at + GC_P2P_HDR_BYTES, 0, (size_t)(pad - GC_P2P_HDR_BYTES));
}

/* Push what the channel takes of peer's queued frames; 1 when something moved. */
static int gc_p2p__push(gc_p2p *e, int peer)
{
    gc_p2p_peer *p = &e->peers[peer];
    gc_chan *c = p->chan;
    int moved = 0;
    uint64_t pushed = 0;
    gc_p2p_out *o;
    while ((o = p->out_head) != NULL) {
        const uint64_t body = GC_P2P_HDR_BYTES + o->plen;
        if (o->off == 0 && body <= GC_P2P_COALESCE / 2)   /* every earlier byte is taken */
            o->pad = gc_p2p__pad(c, body);
        const uint64_t total = body + o->pad;
        while (o->off < total) {
            ssize_t k;
            if (o->off == 0 && total <= GC_P2P_COALESCE) {
                char *frame = e->frame;
                memcpy(frame, &o->h, GC_P2P_HDR_BYTES);
                if (o->plen) memcpy(frame + GC_P2P_HDR_BYTES, o->payload, o->plen);
                if (o->pad) gc_p2p__pad_write(frame + body, o->pad, &o->padh);
                k = c->send(c, frame, (size_t)total);
            } else if (o->off >= body) {   /* the rest of its PAD frame */
                uint64_t at = o->off - body;
                if (at < GC_P2P_HDR_BYTES)
                    k = c->send(c, (const char *)&o->padh + at, GC_P2P_HDR_BYTES - at);
                else
                    k = c->send(c, gc_p2p__zeros, (size_t)(o->pad - at));
            } else if (o->off < GC_P2P_HDR_BYTES) {
                k = c->send(c, (const char *)&o->h + o->off, GC_P2P_HDR_BYTES - o->off);
            } else {
                uint64_t at = o->off - GC_P2P_HDR_BYTES, n = o->plen - at;
                if (n > GC_P2P_PUSH_CHUNK && !(c->whole_from && n >= c->whole_from)) n = GC_P2P_PUSH_CHUNK;
                k = c->send(c, o->payload + at, (size_t)n);
            }
            if (k < 0) {
                gc_p2p__lose(e, peer, GC_P2P_CHAN_ERR, (uint64_t)(-k));
                return 1;
            }
            if (k == 0)
                return moved;
            o->off += (uint64_t)k;
            moved = 1;
            if ((pushed += (uint64_t)k) >= GC_P2P_PUSH_MAX)
                return moved;
        }
        p->out_head = o->next;
        if (!p->out_head) p->out_tail = NULL;
        if (o->req) {
            gc_p2p_req *r = o->req;
            if (r->where == GC_W_OUT)  /* an EAGER send without SYNC, or a rendezvous' DATA */
                gc_p2p__finish(r, GC_OK);
        }
        free(o->own);
        free(o);
    }
    return moved;
}

/* ---- receiving ------------------------------------------------------------------------------ */

static void gc_p2p__status(gc_p2p_req *r, int src, const gc_p2p_hdr *h)
{
    r->src = src;
    r->rtag = h->tag;
    r->nbytes = h->nbytes;
    r->rflags = h->kind & ~GC_P2P_KIND_MASK;
}

/* Where a matched receive takes a message of h->nbytes bytes: sets *dst (NULL: read away) and
 * returns GC_OK or the receive's error. */
static int gc_p2p__target(gc_p2p *e, gc_p2p_req *r, const gc_p2p_hdr *h, char **dst)
{
    *dst = NULL;
    if ((h->kind & GC_P2P_OFFER) || r->alloc) {
        if (h->nbytes > e->max_message)
            return GC_P2P_TOOBIG;
        r->owned = (char *)malloc(h->nbytes ? h->nbytes : 1);
        if (!r->owned)
            return GC_ERR_NOMEM;
        *dst = r->owned;
        return GC_OK;
    }
    if (h->nbytes > r->len)
        return GC_P2P_TRUNCATED;
    *dst = r->buf;
    return GC_OK;
}

static void gc_p2p__ask_data(gc_p2p *e, gc_p2p_req *r, int peer);

/* The last of a side's pair words says whether that side is free to help with its sends now
 * (1: it waits with no matched receive of its own to read); the others are claims words. */
static inline uint64_t *gc_p2p__helping(gc_chan *c, int side)
{
    return &c->pair_words[side][c->pair_nwords - 1];
}

/* The chunks a shared copy of nbytes goes in (both sides compute the same). */
static void gc_p2p__chunking(gc_p2p_req *r, uint64_t nbytes)
{
    uint64_t c = GC_P2P_SHARE_CHUNK;
    while (nbytes / c > GC_P2P_SHARE_CHUNKS)
        c <<= 1;
    r->chunk = c;
    r->nchunks = (nbytes + c - 1) / c;
    r->chunks_in = 0;
    r->redo = 0;
}

/* A claims word: the low 32 bits count the chunks handed out (the next one's index), the high
 * 32 bits the sender's claims among them. */
#define GC_P2P_CLAIM_LOW 0xffffffffull
#define GC_P2P_SENDER_CLAIM ((1ull << 32) + 1)

/* The receiver claims the next chunks of a shared copy: one while the sender is free to help
 * (its word *helping, kept by gc_p2p__advance) or helps already, else as many as one read takes
 * (a sender busy with its own receives claims nothing, and then a message costs one read as when
 * the receiver copies alone). Sets *end past the last claimed; returns the first (>= nchunks:
 * every chunk is taken). */
static uint64_t gc_p2p__claim_read(gc_p2p_req *r, const uint64_t *helping, uint64_t *end)
{
    uint64_t seen = __atomic_load_n(r->claims, __ATOMIC_ACQUIRE), m = 1;
    if ((seen >> 32) == 0 && !__atomic_load_n(helping, __ATOMIC_RELAXED)) {
        m = GC_P2P_CMA_CHUNK / r->chunk;
        if (m == 0) m = 1;
    }
    uint64_t k = __atomic_fetch_add(r->claims, m, __ATOMIC_ACQ_REL) & GC_P2P_CLAIM_LOW;
    *end = k + m < r->nchunks ? k + m : r->nchunks;
    return k;
}

/* The sender claims the next chunk of a shared copy (>= nchunks: every chunk is taken). */
static inline uint64_t gc_p2p__claim_write(gc_p2p_req *r)
{
    return __atomic_fetch_add(r->claims, GC_P2P_SENDER_CLAIM, __ATOMIC_ACQ_REL) & GC_P2P_CLAIM_LOW;
}

/* No chunk of this shared copy is handed out any more (the bytes come another way). */
static inline void gc_p2p__claim_all(gc_p2p_req *r)
{
    if (r->claims)
        __atomic_store_n(r->claims, GC_P2P_CLAIM_LOW >> 1, __ATOMIC_RELEASE);
    r->claims = NULL;
}

/* A receive matched an RTS of peer: take the bytes (cross-memory attach, else ask for DATA). */
static void gc_p2p__rendezvous(gc_p2p *e, gc_p2p_req *r, int peer, const gc_p2p_hdr *h)
{
    gc_p2p_peer *p = &e->peers[peer];
    gc_p2p__status(r, peer, h);
    if (p->lost) {
        gc_p2p__finish(r, GC_ERR_PEER);
        return;
    }
    char *dst;
    int err = gc_p2p__target(e, r, h, &dst);
    if (err != GC_OK) {
        gc_p2p__control(e, peer, GC_P2P_ACK, h->id, err);   /* the sender is done; the error is ours */
        gc_p2p__finish(r, err);
        return;
    }
    r->buf = dst;             /* where the bytes go (the allocation, for object receives) */
    r->len = h->nbytes;
    r->id = h->id;
    if (p->cma && p->pid > 0) {
        /* Read later, by a wait, test or probe: a call that posts or sends (a blocking Send's
         * read of what came) must not copy, or a rank that is busy copying the peer's messages
         * announces its own only afterwards and the two directions take turns. */
        r->raddr = h->addr;
        r->copied = 0;
        r->where = GC_W_COPY;
        gc_chan *c = p->chan;
        if ((h->kind & GC_P2P_SHARE) && c && c->pair_words[1] && h->status >= 0 && (uint64_t)h->status + 1 < c->pair_nwords) {
            /* a shared copy: tell the sender where the bytes go; both claim chunks from now on */
            r->claims = &c->pair_words[1][h->status];
            gc_p2p__chunking(r, h->nbytes);
            gc_p2p__control_at(e, peer, GC_P2P_DEST, h->id, 0, (uint64_t)(uintptr_t)dst);
        }
        gc_p2p__req_push(&e->copy_head, &e->copy_tail, r);
        return;
    }
    gc_p2p__ask_data(e, r, peer);
}

/* A rendezvous receive asks its sender to stream the bytes (CTS, then DATA). */
static void gc_p2p__ask_data(gc_p2p *e, gc_p2p_req *r, int peer)
{
    r->where = GC_W_DATA;
    gc_p2p__req_push(&e->peers[peer].datas, NULL, r);
    gc_p2p__control(e, peer, GC_P2P_CTS, r->id, 0);
}

/* A rendezvous receive has every byte: the sender may let go of its buffer. */
static void gc_p2p__copied(gc_p2p *e, gc_p2p_req *r)
{
    gc_p2p__control(e, r->src, GC_P2P_ACK, r->id, GC_OK);
    gc_p2p__finish(r, GC_OK);
}

/* Read the next piece of the oldest matched rendezvous straight from its sender's memory
 * (process_vm_readv: one copy): alone, the next GC_P2P_CMA_CHUNK bytes; in a shared copy, the
 * next chunk nobody claimed (the sender writes the chunks it claims). Every byte in, it is
 * acknowledged; every chunk claimed but some of the sender's not yet said to be in, it waits
 * for the sender's DONE. 1 when there was one. */
static int gc_p2p__copy(gc_p2p *e)
{
    gc_p2p_req *r = e->copy_head;
    if (!r) return 0;
    int peer = r->src;
    gc_p2p_peer *p = &e->peers[peer];
    uint64_t at = r->copied, n = r->len - r->copied, got = 0;   /* got: chunks read */
    if (r->claims) {
        uint64_t k, last = 0;
        if (r->redo) {
            k = r->redo - 1;
            last = k + 1;
        } else {
            k = gc_p2p__claim_read(r, gc_p2p__helping(p->chan, 1), &last);
        }
        r->redo = 0;
        if (k >= r->nchunks) {
            gc_p2p__req_unlink(&e->copy_head, &e->copy_tail, r);
            r->where = GC_W_DONE;
            gc_p2p__req_push(&p->datas, NULL, r);
            return 1;
        }
        at = k * r->chunk;
        n = (last * r->chunk < r->len ? last * r->chunk : r->len) - at;
        got = last - k;
    } else if (n > GC_P2P_CMA_CHUNK) {
        n = GC_P2P_CMA_CHUNK;  /* the next piece at the next pass: frames keep moving meanwhile */
    }
    int err = gc_cma_move(p->pid, r->buf + at, r->raddr + at, n, 0);
    if (err == ESRCH) {
        gc_p2p__lose(e, peer, GC_P2P_GONE, 0);   /* fails r with the peer's other requests */
        return 1;
    }
    if (err) {
        /* EPERM (no ptrace right here), ENOSYS, EFAULT...: the bytes come through the channel */
        gc_p2p__req_unlink(&e->copy_head, &e->copy_tail, r);
        p->cma = 0;
        gc_p2p__claim_all(r);
        gc_p2p__ask_data(e, r, peer);
        return 1;
    }
    e->bytes_read += n;
    if (r->claims ? (r->chunks_in += got) < r->nchunks : (r->copied += n) < r->len)
        return 1;
    gc_p2p__req_unlink(&e->copy_head, &e->copy_tail, r);
    gc_p2p__copied(e, r);
    return 1;
}

/* Help the oldest send whose receiver said where its bytes go: claim its chunks and write them
 * into the receiver's memory (process_vm_writev) until none is left, then say how many (DONE).
 * The receiver claims from the same word meanwhile; a sender that is busy elsewhere claims
 * nothing and the receiver copies alone. 1 when there was one. */
static int gc_p2p__help(gc_p2p *e)
{
    gc_p2p_req *r;
    while ((r = e->help_head) != NULL) {
        e->help_head = r->hnext;
        if (!e->help_head) e->help_tail = NULL;
        if (!r->done && r->where == GC_W_ACK && r->claims)
            break;
        gc_p2p__unref(r);      /* answered or streamed meanwhile */
    }
    if (!r) return 0;
    int peer = r->peer;
    gc_p2p_peer *p = &e->peers[peer];
    uint64_t wrote = 0, failed = 0;
    while (!p->help_off) {
        uint64_t k = gc_p2p__claim_write(r);
        if (k >= r->nchunks)
            break;
        uint64_t at = k * r->chunk, n = r->len - at < r->chunk ? r->len - at : r->chunk;
        int err = gc_cma_move(p->pid, r->buf + at, r->raddr + at, n, 1);
        if (err == ESRCH) {
            gc_p2p__lose(e, peer, GC_P2P_GONE, 0);
            gc_p2p__unref(r);
            return 1;
        }
        if (err) {             /* no right to write there: the receiver reads this chunk too */
            p->help_off = 1;
            failed = k + 1;
            break;
        }
        wrote++;
        e->bytes_written += n;
    }
    if (wrote || failed)
        gc_p2p__control_at(e, peer, GC_P2P_DONE, r->id, (int64_t)wrote, failed);
    gc_p2p__unref(r);
    return 1;
}

/* A send no longer needs its claims word. */
static void gc_p2p__slot_free(gc_p2p_peer *p, gc_p2p_req *s)
{
    if (s->slot) {
        p->slots_used[(s->slot - 1) / 64] &= ~(1ull << ((s->slot - 1) % 64));
        s->slot = 0;
        s->claims = NULL;
    }
}

/* A large send to peer offers a shared copy where the pair shares memory and a claims word is
 * free: takes the word (zeroed) and sets the send's chunking. 1 when it does. */
static int gc_p2p__offer_share(gc_p2p *e, gc_p2p_peer *p, gc_p2p_req *s)
{
    gc_chan *c = p->chan;
    if (!e->share || !p->cma || p->pid <= 0 || p->help_off || !c || !c->pair_words[0] || c->pair_nwords < 2
        || s->len < 2 * (uint64_t)GC_P2P_SHARE_CHUNK)
        return 0;
    unsigned nwords = c->pair_nwords - 1 < 128 ? c->pair_nwords - 1 : 128;   /* the last: helping */
    for (unsigned i = 0; i < nwords; i++) {
        if (p->slots_used[i / 64] & (1ull << (i % 64)))
            continue;
        p->slots_used[i / 64] |= 1ull << (i % 64);
        s->slot = (int)i + 1;
        s->claims = &c->pair_words[0][i];
        __atomic_store_n(s->claims, 0, __ATOMIC_RELEASE);   /* before the RTS that names it */
        gc_p2p__chunking(s, s->len);
        return 1;
    }
    return 0;                  /* every word in use: the receiver copies this one alone */
}

/* Deliver an unexpected message to the receive that matched it (the message is unlinked). */
static void gc_p2p__take(gc_p2p *e, gc_p2p_req *r, gc_p2p_msg *m)
{
    int kind = (int)(m->h.kind & GC_P2P_KIND_MASK);
    if (kind == GC_P2P_RTS) {
        gc_p2p__rendezvous(e, r, m->src, &m->h);
        free(m);
        return;
    }
    if (!m->complete) {        /* its bytes are still arriving: finished when they are in */
        m->claim = r;
        r->where = GC_W_CLAIM;
        return;
    }
    gc_p2p__status(r, m->src, &m->h);
    int err = GC_OK;
    if ((m->h.kind & GC_P2P_OFFER) || r->alloc) {
        r->owned = m->data;    /* hand the bytes over */
        m->data = NULL;
    } else if (m->h.nbytes > r->len) {
        err = GC_P2P_TRUNCATED;
    } else if (m->h.nbytes) {
        memcpy(r->buf, m->data, m->h.nbytes);
    }
    if (m->self_send)
        gc_p2p__finish(m->self_send, GC_OK);
    else if (m->h.kind & GC_P2P_SYNC)
        gc_p2p__control(e, m->src, GC_P2P_ACK, m->h.id, err);
    free(m->data);
    free(m);
    gc_p2p__finish(r, err);
}

static gc_p2p_req *gc_p2p__match_posted(gc_p2p *e, uint64_t comm, int src, int32_t tag)
{
    for (gc_p2p_req *r = e->posted_head; r; r = r->next)
        if (gc_p2p__matches(r, comm, src, tag)) {
            gc_p2p__req_unlink(&e->posted_head, &e->posted_tail, r);
            r->where = GC_W_NONE;
            return r;
        }
    return NULL;
}

/* The request of list (a peer's acks or datas) that a frame from peer names by id; NULL, the peer
 * lost, when it names none. */
static gc_p2p_req *gc_p2p__named(gc_p2p *e, int peer, gc_p2p_req *list, uint64_t id)
{
    for (gc_p2p_req *r = list; r; r = r->next)
        if (r->id == id) return r;
    gc_p2p__lose(e, peer, GC_P2P_BAD_ID, id);
    return NULL;
}

static inline int gc_p2p__is_revoked(const gc_p2p *e, uint64_t comm)
{
    for (int i = 0; i < e->nrevoked; i++)
        if (e->revoked[i] == comm) return 1;
    return 0;
}

/* A whole header arrived from peer: act on it. Returns 0, or -1 once the peer is lost. */
static int gc_p2p__arrive(gc_p2p *e, int peer, const gc_p2p_hdr *h)
{
    gc_p2p_peer *p = &e->peers[peer];
    int kind = (int)(h->kind & GC_P2P_KIND_MASK);
    p->filling = 0;
    p->dst = NULL;
    p->fill_req = NULL;
    p->fill_msg = NULL;
    p->cur = *h;
    if (kind == GC_P2P_PAD) {     /* stripe padding: its bytes are read away */
        if (h->nbytes > GC_P2P_COALESCE) {
            gc_p2p__lose(e, peer, GC_P2P_BAD_SIZE, h->nbytes);
            return -1;
        }
        p->filling = 1;
        p->left = p->total = h->nbytes;
        return 0;
    }
    if (kind == GC_P2P_EAGER) {
        uint64_t limit = (h->kind & GC_P2P_OFFER) ? GC_P2P_OFFER_MAX : GC_P2P_WIRE_EAGER_MAX;
        if (h->nbytes > limit) {
            gc_p2p__lose(e, peer, GC_P2P_BAD_SIZE, h->nbytes);
            return -1;
        }
        gc_p2p_req *r = gc_p2p__match_posted(e, h->comm, peer, h->tag);
        if (r) {
            gc_p2p__status(r, peer, h);
            int err = gc_p2p__target(e, r, h, &p->dst);
            r->err = err;
            r->where = GC_W_FILL;
            p->fill_req = r;
        } else {
            gc_p2p_msg *m = (gc_p2p_msg *)calloc(1, sizeof *m);
            char *data = (char *)malloc(h->nbytes ? h->nbytes : 1);
            if (!m || !data) {
                free(m);
                free(data);
                gc_p2p__lose(e, peer, GC_P2P_BAD_SIZE, h->nbytes);
                return -1;
            }
            m->h = *h;
            m->src = peer;
            m->data = data;
            gc_p2p__msg_push(e, m);
            p->fill_msg = m;
            p->dst = data;
        }
        p->filling = 1;
        p->left = p->total = h->nbytes;
        return 0;
    }
    if (kind == GC_P2P_RTS) {
        if (h->kind & GC_P2P_OFFER) {
            gc_p2p__lose(e, peer, GC_P2P_BAD_KIND, h->kind);
            return -1;
        }
        if (gc_p2p__is_revoked(e, h->comm)) {   /* its sender waits for an answer: it fails too */
            gc_p2p__control(e, peer, GC_P2P_ACK, h->id, GC_ERR_REVOKED);
            return 0;
        }
        gc_p2p_req *r = gc_p2p__match_posted(e, h->comm, peer, h->tag);  /* RTS: matched on arrival */
        if (r) {
            gc_p2p__rendezvous(e, r, peer, h);
        } else {
            gc_p2p_msg *m = (gc_p2p_msg *)calloc(1, sizeof *m);
            if (!m) {
                gc_p2p__lose(e, peer, GC_P2P_BAD_SIZE, h->nbytes);
                return -1;
            }
            m->h = *h;
            m->src = peer;
            m->complete = 1;
            gc_p2p__msg_push(e, m);
        }
        return 0;
    }
    if (kind == GC_P2P_CTS) {
        gc_p2p_req *s = gc_p2p__named(e, peer, p->acks, h->id);
        if (!s)
            return -1;
        gc_p2p__req_unlink(&p->acks, NULL, s);
        gc_p2p__slot_free(p, s);  /* the receiver claims no more chunks: DATA brings them all */
        gc_p2p_hdr d;
        memset(&d, 0, sizeof d);
        d.kind = GC_P2P_DATA;
        d.id = s->id;
        d.nbytes = s->len;
        s->where = GC_W_OUT;
        if (!gc_p2p__queue(e, peer, &d, s->buf, s->len, s))
            gc_p2p__finish(s, GC_ERR_NOMEM);
        return 0;
    }
    if (kind == GC_P2P_DATA) {
        gc_p2p_req *r = gc_p2p__named(e, peer, p->datas, h->id);
        if (!r)
            return -1;
        if (r->where != GC_W_DATA) {
            gc_p2p__lose(e, peer, GC_P2P_BAD_ID, h->id);
            return -1;
        }
        if (h->nbytes != r->len) {
            gc_p2p__lose(e, peer, GC_P2P_BAD_SIZE, h->nbytes);
            return -1;
        }
        gc_p2p__req_unlink(&p->datas, NULL, r);
        r->where = GC_W_FILL;
        r->err = GC_OK;
        p->fill_req = r;
        p->dst = r->buf;
        p->filling = 1;
        p->left = p->total = h->nbytes;
        return 0;
    }
    if (kind == GC_P2P_ACK) {
        gc_p2p_req *s = gc_p2p__named(e, peer, p->acks, h->id);
        if (!s)
            return -1;
        gc_p2p__req_unlink(&p->acks, NULL, s);
        gc_p2p__slot_free(p, s);
        /* a truncated receive raises on its own side; the send is done (unless refused: revoked) */
        gc_p2p__finish(s, h->status == GC_ERR_REVOKED ? GC_ERR_REVOKED : GC_OK);
        return 0;
    }
    if (kind == GC_P2P_DEST) {     /* a shared copy: the receiver's bytes go to h->addr */
        gc_p2p_req *s = gc_p2p__named(e, peer, p->acks, h->id);
        if (!s)
            return -1;
        if (!s->slot) {
            gc_p2p__lose(e, peer, GC_P2P_BAD_ID, h->id);
            return -1;
        }
        s->raddr = h->addr;
        s->refs++;             /* the help queue's */
        s->hnext = NULL;
        if (e->help_tail) e->help_tail->hnext = s; else e->help_head = s;
        e->help_tail = s;
        return 0;
    }
    if (kind == GC_P2P_DONE) {     /* the sender wrote h->status chunks; h->addr: 1 + one it could not */
        gc_p2p_req *r = p->datas;
        while (r && r->id != h->id) r = r->next;
        if (!r)
            for (r = e->copy_head; r && !(r->src == peer && r->id == h->id); r = r->next) {}
        if (r && r->where == GC_W_DATA)
            return 0;          /* it fell back to DATA, which brings every byte */
        if (!r || !r->claims || (uint64_t)h->status > r->nchunks - r->chunks_in || h->addr > r->nchunks) {
            gc_p2p__lose(e, peer, r ? GC_P2P_BAD_SIZE : GC_P2P_BAD_ID, r ? (uint64_t)h->status : h->id);
            return -1;
        }
        r->chunks_in += (uint64_t)h->status;
        if (h->addr) r->redo = h->addr;
        int waiting = r->where == GC_W_DONE;
        if (r->chunks_in == r->nchunks) {
            if (waiting) gc_p2p__req_unlink(&p->datas, NULL, r);
            else gc_p2p__req_unlink(&e->copy_head, &e->copy_tail, r);
            gc_p2p__copied(e, r);
        } else if (waiting && r->redo) {   /* a chunk left to this side after all */
            gc_p2p__req_unlink(&p->datas, NULL, r);
            r->where = GC_W_COPY;
            gc_p2p__req_push(&e->copy_head, &e->copy_tail, r);
        }
        return 0;
    }
    gc_p2p__lose(e, peer, GC_P2P_BAD_KIND, h->kind);
    return -1;
}

/* The payload being read from peer is complete. */
static void gc_p2p__filled(gc_p2p *e, int peer)
{
    gc_p2p_peer *p = &e->peers[peer];
    const gc_p2p_hdr *h = &p->cur;
    p->filling = 0;
    if (p->fill_req) {
        gc_p2p_req *r = p->fill_req;
        p->fill_req = NULL;
        int eager = (int)(h->kind & GC_P2P_KIND_MASK) == GC_P2P_EAGER;
        if (eager && (h->kind & GC_P2P_SYNC))
            gc_p2p__control(e, peer, GC_P2P_ACK, h->id, r->err);
        gc_p2p__finish(r, r->err);
    } else if (p->fill_msg) {
        gc_p2p_msg *m = p->fill_msg;
        p->fill_msg = NULL;
        m->complete = 1;
        if (m->claim) {        /* a receive took it while it arrived */
            gc_p2p_req *r = m->claim;
            m->claim = NULL;
            gc_p2p__take(e, r, m);
        }
    }
}

/* Read what arrived from peer; 1 when something moved. */
static int gc_p2p__pull(gc_p2p *e, int peer)
{
    gc_p2p_peer *p = &e->peers[peer];
    gc_chan *c = p->chan;
    int moved = 0;
    const char *ptr = NULL;
    size_t span = 0;          /* bytes shown by the last peek and not consumed yet: a header and
                               * its payload are taken from one peek (a TCP peek costs a recv per
                               * socket) */
    uint64_t taken = 0;       /* payload bytes this pass read (GC_P2P_PULL_MAX) */
    while (!p->lost) {
        if (p->filling && p->left == 0) {
            gc_p2p__filled(e, peer);
            moved = 1;
            continue;
        }
        if (span == 0 && p->filling && p->dst && p->total >= GC_P2P_DIRECT_MIN && c->recv_direct) {
            ssize_t k = c->recv_direct(c, p->dst + (p->total - p->left), (size_t)p->left);
            if (k < 0) {
                gc_p2p__lose(e, peer, k == GC_ERR_PEER ? GC_P2P_GONE : GC_P2P_CHAN_ERR, (uint64_t)(-k));
                return 1;
            }
            if (k == 0)
                return moved;
            if (p->fill_msg) p->fill_msg->got += (uint64_t)k;
            p->left -= (uint64_t)k;
            moved = 1;
            if ((taken += (uint64_t)k) >= GC_P2P_PULL_MAX)
                return moved;
            continue;
        }
        if (span == 0) {
            if (taken >= GC_P2P_PULL_MAX)
                return moved;
            const void *at;
            ssize_t k = c->peek(c, &at);
            if (k < 0) {
                gc_p2p__lose(e, peer, k == GC_ERR_PEER ? GC_P2P_GONE : GC_P2P_CHAN_ERR, (uint64_t)(-k));
                return 1;
            }
            if (k == 0)
                return moved;
            moved = 1;
            ptr = (const char *)at;
            span = (size_t)k;
        }
        size_t n = span;
        if (!p->filling) {
            size_t want = GC_P2P_HDR_BYTES - p->hgot;
            if (n > want) n = want;
            memcpy(p->hbuf + p->hgot, ptr, n);
            c->consume(c, n);
            ptr += n;
            span -= n;
            p->hgot += n;
            if (p->hgot == GC_P2P_HDR_BYTES) {
                gc_p2p_hdr h;
                memcpy(&h, p->hbuf, sizeof h);
                p->hgot = 0;
                if (gc_p2p__arrive(e, peer, &h) < 0)
                    return 1;
            }
            continue;
        }
        if (n > p->left) n = (size_t)p->left;
        if (p->dst) {
            memcpy(p->dst + (p->total - p->left), ptr, n);
            if (p->fill_msg) p->fill_msg->got += n;
        }
        c->consume(c, n);
        ptr += n;
        span -= n;
        p->left -= n;
        taken += n;
    }
    return moved;
}

/* One pass over every connected peer; 1 when something moved. Call with the mutex held. */
static int gc_p2p__progress(gc_p2p *e)
{
    int moved = 0;
    for (int i = 0; i < e->n; i++) {
        gc_p2p_peer *p = &e->peers[i];
        if (!p->chan || p->lost) continue;
        if (p->out_head) moved |= gc_p2p__push(e, i);
        if (!p->lost) moved |= gc_p2p__pull(e, i);
    }
    if (moved) e->progress_count++;
    return moved;
}

/* A progress pass, then the next piece of a matched rendezvous, or, with none to read (a posted
 * receive whose message has not come is no work yet), help with a send (waits, tests and
 * probes: the calls that post only push). A rank's own receives come first: when both ranks have theirs (both
 * directions at once), both cores are busy already and helping would only add reads. The
 * pairs' helping words follow this rank's state. 1 when something moved. */
static int gc_p2p__advance(gc_p2p *e)
{
    int moved = gc_p2p__progress(e);
    int free_to_help = e->share && !e->copy_head;
    if (free_to_help != e->free_to_help) {   /* tell the peers whose receivers read: stride or chunk */
        e->free_to_help = free_to_help;
        for (int i = 0; i < e->n; i++) {
            gc_chan *c = e->peers[i].chan;
            if (c && c->pair_words[0] && c->pair_nwords >= 2 && !e->peers[i].lost)
                __atomic_store_n(gc_p2p__helping(c, 0), (uint64_t)free_to_help, __ATOMIC_RELAXED);
        }
    }
    if (gc_p2p__copy(e) || (free_to_help && gc_p2p__help(e))) {
        moved = 1;
        e->progress_count++;
    }
    return moved;
}

/* The peer is gone or broke the format: fail whatever waits on it; stop reading it. */
static void gc_p2p__lose(gc_p2p *e, int peer, int why, uint64_t value)
{
    gc_p2p_peer *p = &e->peers[peer];
    if (p->lost) return;
    p->lost = why;
    p->lost_value = value;
    e->losses++;
    gc_p2p_out *o = p->out_head;
    while (o) {
        gc_p2p_out *next = o->next;
        if (o->req && o->req->where == GC_W_OUT)
            gc_p2p__finish(o->req, GC_ERR_PEER);
        free(o->own);
        free(o);
        o = next;
    }
    p->out_head = p->out_tail = NULL;
    while (p->acks) {
        gc_p2p_req *r = p->acks;
        gc_p2p__req_unlink(&p->acks, NULL, r);
        gc_p2p__finish(r, GC_ERR_PEER);
    }
    while (p->datas) {
        gc_p2p_req *r = p->datas;
        gc_p2p__req_unlink(&p->datas, NULL, r);
        gc_p2p__claim_all(r);  /* a peer that broke the format but lives writes no more chunks */
        gc_p2p__finish(r, GC_ERR_PEER);
    }
    for (gc_p2p_req *r = e->copy_head, *next; r; r = next) {
        next = r->next;
        if (r->src == peer) {
            gc_p2p__req_unlink(&e->copy_head, &e->copy_tail, r);
            gc_p2p__claim_all(r);
            gc_p2p__finish(r, GC_ERR_PEER);
        }
    }
    if (p->filling && p->fill_req) {
        p->cut_nbytes = p->cur.nbytes;
        p->cut_tag = p->cur.tag;
        gc_p2p__finish(p->fill_req, GC_ERR_PEER);
    }
    p->fill_req = NULL;
    p->filling = 0;
    if (p->fill_msg && p->fill_msg->claim) {   /* taken off the queue by a receive: fail that one */
        p->cut_nbytes = p->cur.nbytes;
        p->cut_tag = p->cur.tag;
        gc_p2p__finish(p->fill_msg->claim, GC_ERR_PEER);
        free(p->fill_msg->data);
        free(p->fill_msg);
    }
    p->fill_msg = NULL;       /* unclaimed, it is still queued: freed below */
    /* messages of this peer that will never be whole, or whose bytes can no longer be fetched */
    gc_p2p_msg *m = e->ux_head;
    while (m) {
        gc_p2p_msg *next = m->next;
        if (m->src == peer && (!m->complete || (int)(m->h.kind & GC_P2P_KIND_MASK) == GC_P2P_RTS)) {
            gc_p2p__msg_unlink(e, m);
            free(m->data);
            free(m);
        }
        m = next;
    }
    gc_p2p_req *r = e->posted_head;
    while (r) {
        gc_p2p_req *next = r->next;
        if (r->peer == peer) {
            gc_p2p__req_unlink(&e->posted_head, &e->posted_tail, r);
            gc_p2p__finish(r, GC_ERR_PEER);
        }
        r = next;
    }
}

/* ---- the API (each call takes the mutex; call without the GIL) ---------------------------- */

static gc_p2p *gc_p2p_create(int me, int n, uint64_t max_message)
{
    gc_p2p *e = (gc_p2p *)calloc(1, sizeof *e);
    if (!e) return NULL;
    e->peers = (gc_p2p_peer *)calloc((size_t)n, sizeof *e->peers);
    e->frame = (char *)malloc(GC_P2P_COALESCE);
    if (!e->peers || !e->frame) {
        free(e->peers);
        free(e->frame);
        free(e);
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    e->me = me;
    e->n = n;
    e->next_id = 1;
    e->max_message = max_message;
    e->share = 1;
    e->sent.op = GC_P2P_SEND;
    e->sent.refs = 1;
    e->sent.peer = e->sent.src = e->sent.tag = e->sent.rtag = GC_P2P_ANY;
    e->sent.done = 1;          /* err GC_OK (0), where GC_W_NONE (0) */
    return e;
}

/* The request an Isend stands for when gc_p2p_send_now wrote it whole: done without an error;
 * shared by every such send (gc_p2p_release leaves it alone). */
static gc_p2p_req *gc_p2p_sent(gc_p2p *e)
{
    return &e->sent;
}

/* Room for peers up to world rank n - 1 (processes started later: MPI's Spawn). Every access to
 * e->peers holds the mutex, so moving the array under it is safe. 0 when out of memory. */
static int gc_p2p_grow(gc_p2p *e, int n)
{
    int ok = 1;
    pthread_mutex_lock(&e->mu);
    if (n > e->n) {
        gc_p2p_peer *peers = (gc_p2p_peer *)realloc(e->peers, (size_t)n * sizeof *peers);
        if (peers) {
            memset(peers + e->n, 0, (size_t)(n - e->n) * sizeof *peers);
            e->peers = peers;
            e->n = n;
        } else {
            ok = 0;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return ok;
}

/* pid: the peer's pid where it can be watched (0: not), cma: may its memory be read directly. */
static void gc_p2p_set_peer(gc_p2p *e, int peer, pid_t pid, int cma, int eager_max)
{
    pthread_mutex_lock(&e->mu);
    e->peers[peer].pid = pid;
    e->peers[peer].cma = cma;
    e->peers[peer].eager_max = eager_max;
    pthread_mutex_unlock(&e->mu);
}

/* on: large messages within a host are copied by both sides (a shared copy); off: by the receiver. */
static void gc_p2p_set_share(gc_p2p *e, int on)
{
    pthread_mutex_lock(&e->mu);
    e->share = on;
    pthread_mutex_unlock(&e->mu);
}

/* Rendezvous bytes this process read from its senders' memory and wrote into its receivers'. */
static void gc_p2p_copied(gc_p2p *e, uint64_t *read, uint64_t *written)
{
    pthread_mutex_lock(&e->mu);
    *read = e->bytes_read;
    *written = e->bytes_written;
    pthread_mutex_unlock(&e->mu);
}

static void gc_p2p_set_channel(gc_p2p *e, int peer, gc_chan *chan)
{
    pthread_mutex_lock(&e->mu);
    e->peers[peer].chan = chan;
    pthread_mutex_unlock(&e->mu);
}

static int gc_p2p_has_channel(gc_p2p *e, int peer)
{
    pthread_mutex_lock(&e->mu);
    int has = e->peers[peer].chan != NULL;
    pthread_mutex_unlock(&e->mu);
    return has;
}

static gc_p2p_req *gc_p2p__new(int op, uint64_t comm, int peer, int32_t tag, char *buf, uint64_t len)
{
    gc_p2p_req *r = (gc_p2p_req *)calloc(1, sizeof *r);
    if (!r) return NULL;
    r->op = op;
    r->refs = 2;              /* the caller's handle and the engine */
    r->comm = comm;
    r->peer = peer;
    r->tag = tag;
    r->buf = buf;
    r->len = len;
    r->src = GC_P2P_ANY;
    r->rtag = GC_P2P_ANY;
    return r;
}

/* Start sending len bytes at buf to world rank dest; flags: GC_P2P_SYNC, GC_P2P_OFFER.
 * NULL when out of memory. */
static gc_p2p_req *gc_p2p_isend(gc_p2p *e, uint64_t comm, int dest, int32_t tag, const char *buf,
                                uint64_t len, uint32_t flags)
{
    gc_p2p_req *r = gc_p2p__new(GC_P2P_SEND, comm, dest, tag, (char *)buf, len);
    if (!r) return NULL;
    r->flags = flags;
    pthread_mutex_lock(&e->mu);
    r->id = e->next_id++;
    gc_p2p_hdr h;
    memset(&h, 0, sizeof h);
    h.comm = comm;
    h.tag = tag;
    h.nbytes = len;
    h.id = r->id;
    if (dest == e->me) {      /* to oneself: matched here and now */
        h.kind = GC_P2P_EAGER | flags;
        gc_p2p_msg *m = (gc_p2p_msg *)calloc(1, sizeof *m);
        char *data = (char *)malloc(len ? len : 1);
        if (!m || !data) {
            free(m);
            free(data);
            gc_p2p__finish(r, GC_ERR_NOMEM);
        } else {
            if (len) memcpy(data, buf, len);
            m->h = h;
            m->src = dest;
            m->data = data;
            m->complete = 1;
            gc_p2p_req *rr = gc_p2p__match_posted(e, comm, dest, tag);
            if (flags & GC_P2P_SYNC) {
                m->self_send = r;
                r->where = GC_W_ACK;
            }
            if (rr) {
                gc_p2p__take(e, rr, m);
            } else {
                gc_p2p__msg_push(e, m);
            }
            if (!(flags & GC_P2P_SYNC))
                gc_p2p__finish(r, GC_OK);
        }
        pthread_mutex_unlock(&e->mu);
        return r;
    }
    gc_p2p_peer *p = &e->peers[dest];
    if (p->lost) {
        gc_p2p__finish(r, GC_ERR_PEER);
    } else if (len <= (uint64_t)p->eager_max || (flags & GC_P2P_OFFER)) {
        h.kind = GC_P2P_EAGER | flags;
        if (flags & GC_P2P_SYNC) {
            r->where = GC_W_ACK;
            gc_p2p__req_push(&p->acks, NULL, r);
            if (!gc_p2p__queue(e, dest, &h, buf, len, NULL)) {
                gc_p2p__req_unlink(&p->acks, NULL, r);
                gc_p2p__finish(r, GC_ERR_NOMEM);
            }
        } else {
            r->where = GC_W_OUT;
            if (!gc_p2p__queue(e, dest, &h, buf, len, r))
                gc_p2p__finish(r, GC_ERR_NOMEM);
        }
    } else {
        h.kind = GC_P2P_RTS | (flags & GC_P2P_SYNC);
        h.addr = (uint64_t)(uintptr_t)buf;
        if (gc_p2p__offer_share(e, p, r)) {
            h.kind |= GC_P2P_SHARE;
            h.status = r->slot - 1;
        }
        r->where = GC_W_ACK;
        gc_p2p__req_push(&p->acks, NULL, r);
        if (!gc_p2p__queue(e, dest, &h, NULL, 0, NULL)) {
            gc_p2p__req_unlink(&p->acks, NULL, r);
            gc_p2p__slot_free(p, r);
            gc_p2p__finish(r, GC_ERR_NOMEM);
        }
    }
    if (p->chan && !p->lost)
        gc_p2p__push(e, dest);  /* a small message leaves now */
    pthread_mutex_unlock(&e->mu);
    return r;
}

/* A small send to a connected peer that the channel takes whole at once: 1 (done, no request
 * made), else 0 (nothing was written: use gc_p2p_isend). */
static int gc_p2p_send_now(gc_p2p *e, uint64_t comm, int dest, int32_t tag, const char *buf, uint64_t len)
{
    if (dest == e->me || len + GC_P2P_HDR_BYTES > GC_P2P_COALESCE)
        return 0;
    int sent = 0;
    pthread_mutex_lock(&e->mu);
    gc_p2p_peer *p = &e->peers[dest];
    if (p->chan && !p->lost && !p->out_head && len <= (uint64_t)p->eager_max) {
        char *frame = e->frame;
        gc_p2p_hdr *h = (gc_p2p_hdr *)frame;
        memset(h, 0, sizeof *h);
        h->comm = comm;
        h->tag = tag;
        h->kind = GC_P2P_EAGER;
        h->nbytes = len;
        h->id = e->next_id++;
        if (len) memcpy(frame + GC_P2P_HDR_BYTES, buf, len);
        const uint64_t body = GC_P2P_HDR_BYTES + len;
        gc_p2p_hdr padh;
        const uint64_t pad = body <= GC_P2P_COALESCE / 2 ? gc_p2p__pad(p->chan, body) : 0;
        if (pad) gc_p2p__pad_write(frame + body, pad, &padh);
        /* A shared-memory ring takes all or nothing below cap/8; a TCP channel may take a part,
         * which must then be offered again unchanged: queue the rest. */
        ssize_t k = p->chan->send(p->chan, frame, (size_t)(body + pad));
        if (k == (ssize_t)(body + pad)) {
            sent = 1;
        } else if (k > 0) {   /* the rest goes at the next progress pass, from a copy */
            char *own = (char *)malloc(len ? len : 1);
            gc_p2p_out *o = own ? gc_p2p__queue(e, dest, h, own, len, NULL) : NULL;
            if (o) {
                if (len) memcpy(own, buf, len);
                o->own = own;
                o->off = (uint64_t)k;
                o->pad = pad;
                if (pad) o->padh = padh;
                sent = 1;
            } else {          /* half a frame in the stream and no memory: the stream is broken */
                free(own);
                gc_p2p__lose(e, dest, GC_P2P_CHAN_ERR, (uint64_t)(-GC_ERR_NOMEM));
            }
        } else if (k < 0) {
            gc_p2p__lose(e, dest, GC_P2P_CHAN_ERR, (uint64_t)(-k));
        }
        if (sent) gc_p2p__pull(e, dest);  /* whatever came meanwhile */
    }
    pthread_mutex_unlock(&e->mu);
    return sent;
}

/* Post a receive from world rank source (or GC_P2P_ANY) with tag (or GC_P2P_ANY) into cap bytes
 * at buf; alloc: into a buffer of the message's own size (buf ignored). NULL when out of memory. */
static gc_p2p_req *gc_p2p_irecv(gc_p2p *e, uint64_t comm, int source, int32_t tag, char *buf,
                                uint64_t cap, int alloc)
{
    gc_p2p_req *r = gc_p2p__new(GC_P2P_RECV, comm, source, tag, buf, cap);
    if (!r) return NULL;
    r->alloc = alloc;
    pthread_mutex_lock(&e->mu);
    gc_p2p_msg *m = e->ux_head;
    for (; m; m = m->next)
        if (gc_p2p__matches(r, m->h.comm, m->src, m->h.tag))
            break;
    if (m) {
        gc_p2p__msg_unlink(e, m);
        gc_p2p__take(e, r, m);
    } else if (source != GC_P2P_ANY && source != e->me && e->peers[source].lost) {
        gc_p2p__finish(r, GC_ERR_PEER);
    } else {
        r->where = GC_W_POSTED;
        gc_p2p__req_push(&e->posted_head, &e->posted_tail, r);
    }
    /* No progress pass: the next wait, test or probe reads what came, matched against this
     * receive and the others posted meanwhile (read before them, a window's messages would be
     * queued unexpected and copied twice; MPI's order holds: what was read before is in the
     * queue above, and a channel is read in order). */
    pthread_mutex_unlock(&e->mu);
    return r;
}

/* The first arrived message that (comm, source, tag) matches, in arrival order, or NULL. */
static gc_p2p_msg *gc_p2p__first_unexpected(gc_p2p *e, uint64_t comm, int source, int32_t tag)
{
    gc_p2p_req probe;
    memset(&probe, 0, sizeof probe);
    probe.comm = comm;
    probe.peer = source;
    probe.tag = tag;
    gc_p2p_msg *m = e->ux_head;
    while (m && !gc_p2p__matches(&probe, m->h.comm, m->src, m->h.tag))
        m = m->next;
    return m;
}

/* The first arrived message of comm matching (source, tag), without taking it: 1 and its
 * source, tag, size and flags, or 0. take: a matched probe, the message is received into a
 * buffer of its own through the returned request (*out). */
static int gc_p2p_iprobe(gc_p2p *e, uint64_t comm, int source, int32_t tag, int *src, int32_t *rtag,
                         uint64_t *nbytes, uint32_t *flags, int take, gc_p2p_req **out)
{
    pthread_mutex_lock(&e->mu);
    gc_p2p__advance(e);       /* a polling probe moves matched rendezvous bytes too (MPI's progress) */
    gc_p2p_msg *m = gc_p2p__first_unexpected(e, comm, source, tag);
    int found = m != NULL;
    if (m) {
        *src = m->src;
        *rtag = m->h.tag;
        *nbytes = m->h.nbytes;
        *flags = m->h.kind & ~GC_P2P_KIND_MASK;
        if (take) {
            gc_p2p_req *r = gc_p2p__new(GC_P2P_RECV, comm, m->src, m->h.tag, NULL, 0);
            if (r) {
                r->alloc = 1;
                gc_p2p__msg_unlink(e, m);
                gc_p2p__take(e, r, m);
            }
            *out = r;
            found = r ? 1 : -1;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return found;
}

/* The bytes of the first arrived message matching (comm, source, tag), copied into out (at most
 * cap) and left in the queue: their count, or -1 when there is none, it is a rendezvous, or its
 * bytes are still arriving. A probe reads a GPU message's envelope (OFFER) this way to report the
 * size of the message it announces. */
static int64_t gc_p2p_peek(gc_p2p *e, uint64_t comm, int source, int32_t tag, char *out, uint64_t cap)
{
    int64_t n = -1;
    pthread_mutex_lock(&e->mu);
    gc_p2p_msg *m = gc_p2p__first_unexpected(e, comm, source, tag);
    if (m && m->complete && (m->h.kind & GC_P2P_KIND_MASK) == GC_P2P_EAGER && m->h.nbytes <= cap) {
        if (m->h.nbytes)
            memcpy(out, m->data, m->h.nbytes);
        n = (int64_t)m->h.nbytes;
    }
    pthread_mutex_unlock(&e->mu);
    return n;
}

/* Withdraw a receive that nothing has matched yet: 1 (it is finished with err), or 0. */
static int gc_p2p_withdraw(gc_p2p *e, gc_p2p_req *r, int err)
{
    pthread_mutex_lock(&e->mu);
    int was = r->where == GC_W_POSTED;
    if (was) {
        gc_p2p__req_unlink(&e->posted_head, &e->posted_tail, r);
        gc_p2p__finish(r, err);
    }
    pthread_mutex_unlock(&e->mu);
    return was;
}

/* A communicator is freed: its pending unmatched receives fail, its unread messages go. */
static void gc_p2p_forget(gc_p2p *e, uint64_t comm)
{
    pthread_mutex_lock(&e->mu);
    gc_p2p_req *r = e->posted_head;
    while (r) {
        gc_p2p_req *next = r->next;
        if (r->comm == comm) {
            gc_p2p__req_unlink(&e->posted_head, &e->posted_tail, r);
            gc_p2p__finish(r, GC_P2P_CANCELLED);
        }
        r = next;
    }
    gc_p2p_msg *m = e->ux_head;
    while (m) {
        gc_p2p_msg *next = m->next;
        if (m->h.comm == comm && m->complete && !m->self_send
            && (int)(m->h.kind & GC_P2P_KIND_MASK) == GC_P2P_EAGER) {
            gc_p2p__msg_unlink(e, m);
            if (m->h.kind & GC_P2P_SYNC)   /* its sender waits for the match: let it go */
                gc_p2p__control(e, m->src, GC_P2P_ACK, m->h.id, GC_P2P_CANCELLED);
            free(m->data);
            free(m);
        }
        m = next;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Revoke comm (ULFM): its unmatched receives fail with GC_ERR_REVOKED, and each sender waiting
 * for a match of comm (a rendezvous offer or a synchronous send queued here, or one arriving
 * later) is answered so that its send fails the same way. Transfers already matched between
 * live peers complete. Returns GC_ERR_NOMEM when the revoked list cannot grow. */
static int gc_p2p_revoke(gc_p2p *e, uint64_t comm)
{
    int st = GC_OK;
    pthread_mutex_lock(&e->mu);
    gc_p2p__advance(e);         /* what has arrived is answered now, not at the next wait */
    if (!gc_p2p__is_revoked(e, comm)) {
        uint64_t *grown = (uint64_t *)realloc(e->revoked, (size_t)(e->nrevoked + 1) * sizeof *grown);
        if (grown) {
            e->revoked = grown;
            e->revoked[e->nrevoked++] = comm;
        } else {
            st = GC_ERR_NOMEM;
        }
    }
    for (gc_p2p_req *r = e->posted_head, *next; r; r = next) {
        next = r->next;
        if (r->comm == comm) {
            gc_p2p__req_unlink(&e->posted_head, &e->posted_tail, r);
            gc_p2p__finish(r, GC_ERR_REVOKED);
        }
    }
    for (gc_p2p_msg *m = e->ux_head, *next; m; m = next) {
        next = m->next;
        int kind = (int)(m->h.kind & GC_P2P_KIND_MASK);
        if (m->h.comm != comm || !m->complete || m->self_send || (kind != GC_P2P_RTS && kind != GC_P2P_EAGER))
            continue;
        gc_p2p__msg_unlink(e, m);
        if (kind == GC_P2P_RTS || (m->h.kind & GC_P2P_SYNC))
            gc_p2p__control(e, m->src, GC_P2P_ACK, m->h.id, GC_ERR_REVOKED);
        free(m->data);
        free(m);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

/* How many unread messages of comm are queued (tests). */
static int gc_p2p_unexpected(gc_p2p *e, uint64_t comm)
{
    int n = 0;
    pthread_mutex_lock(&e->mu);
    for (gc_p2p_msg *m = e->ux_head; m; m = m->next)
        n += m->h.comm == comm;
    pthread_mutex_unlock(&e->mu);
    return n;
}

/* How many receives are posted and messages unexpected, over every communicator (tests). */
static void gc_p2p_counts(gc_p2p *e, int *posted, int *unexpected)
{
    int p = 0, u = 0;
    pthread_mutex_lock(&e->mu);
    for (gc_p2p_req *r = e->posted_head; r; r = r->next) p++;
    for (gc_p2p_msg *m = e->ux_head; m; m = m->next) u++;
    pthread_mutex_unlock(&e->mu);
    *posted = p;
    *unexpected = u;
}

/* Liveness of the peers this process may wait on (every 100 ms of waiting without progress). */
static void gc_p2p__check_peers(gc_p2p *e)
{
    for (int i = 0; i < e->n; i++) {
        gc_p2p_peer *p = &e->peers[i];
        if (p->lost || i == e->me) continue;
        int alive = p->chan ? p->chan->alive(p->chan) : !gc_pid_dead(p->pid);
        if (!alive) {
            if (p->chan) gc_p2p__pull(e, i);   /* what it wrote before it went is still ours */
            gc_p2p__lose(e, i, GC_P2P_GONE, 0);
        }
    }
}

static inline double gc_p2p__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The liveness of the peers, for a caller that waits outside gc_p2p_wait (a blocking probe's
 * loop), at most every 100 ms as a wait does; returns the engine's count of lost peers. */
static uint32_t gc_p2p_check_peers(gc_p2p *e)
{
    pthread_mutex_lock(&e->mu);
    double now = gc_p2p__now();
    if (now - e->peers_checked > 0.1) {
        e->peers_checked = now;
        gc_p2p__check_peers(e);
    }
    uint32_t losses = e->losses;
    pthread_mutex_unlock(&e->mu);
    return losses;
}

/* The first of reqs[0..n) that is a receive from any rank still unmatched and has not looked at the
 * engine's latest lost peer (gc_p2p_saw_losses), or -1. */
static int gc_p2p__unseen_loss(gc_p2p *e, gc_p2p_req **reqs, int n)
{
    for (int i = 0; i < n; i++) {
        gc_p2p_req *r = reqs[i];
        if (r->where == GC_W_POSTED && r->peer == GC_P2P_ANY && r->losses_seen != e->losses)
            return i;
    }
    return -1;
}

/* 1 when r is a receive from any rank, unmatched, with a lost peer it has not looked at. */
static int gc_p2p_loss_unseen(gc_p2p *e, gc_p2p_req *r)
{
    pthread_mutex_lock(&e->mu);
    int unseen = gc_p2p__unseen_loss(e, &r, 1) == 0;
    pthread_mutex_unlock(&e->mu);
    return unseen;
}

/* A receive from any rank has looked at every peer lost so far: its waits go on. */
static void gc_p2p_saw_losses(gc_p2p *e, gc_p2p_req *r)
{
    pthread_mutex_lock(&e->mu);
    r->losses_seen = e->losses;
    pthread_mutex_unlock(&e->mu);
}

/* Wait until one of reqs[0..n) is done (n = 1: that one; all = 1: every one), or timeout
 * seconds pass (< 0: no limit). Returns the index of a done request (all: 0), -1 on timeout,
 * or GC_P2P_WAIT_LOSS - i when reqs[i] is a pending receive from any rank and a peer was lost
 * since it last looked (its owner decides whether that fails it, then calls gc_p2p_saw_losses). */
static int gc_p2p_wait(gc_p2p *e, gc_p2p_req **reqs, int n, int all, double timeout)
{
    double start = -1, last_check = 0, idle_since = 0;
    unsigned spins = 0;
    for (;;) {
        int moved = 0;
        pthread_mutex_lock(&e->mu);
        moved = gc_p2p__advance(e);
        int first = -1, ndone = 0;
        for (int i = 0; i < n; i++)
            if (__atomic_load_n(&reqs[i]->done, __ATOMIC_ACQUIRE)) {
                ndone++;
                if (first < 0) first = i;
            }
        if (all ? ndone == n : ndone > 0) {
            pthread_mutex_unlock(&e->mu);
            return all ? 0 : first;
        }
        if (e->losses) {   /* ULFM: a receive from any rank may no longer be satisfiable */
            int i = gc_p2p__unseen_loss(e, reqs, n);
            if (i >= 0) {
                pthread_mutex_unlock(&e->mu);
                return GC_P2P_WAIT_LOSS - i;
            }
        }
        if (moved) {
            spins = 0;
            idle_since = 0;
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        double now = 0;
        if (++spins % 64 == 0) {
            now = gc_p2p__now();
            if (start < 0) start = last_check = now;
            if (idle_since == 0) idle_since = now;
            if (now - last_check > 0.1) {
                last_check = now;
                gc_p2p__check_peers(e);   /* every 100 ms of a wait without progress */
            }
        }
        pthread_mutex_unlock(&e->mu);
        if (now > 0 && timeout >= 0 && now - start > timeout)
            return -1;
        if (spins < 128) {   /* a short spin, then give the core away: ranks may share cores */
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else if (now > 0 && now - idle_since > 0.05) {
            struct timespec nap = {0, 50000};   /* a long wait: let the others run */
            nanosleep(&nap, NULL);
        } else {
            sched_yield();
        }
    }
}

/* One progress pass; the done flag of r. */
static int gc_p2p_test(gc_p2p *e, gc_p2p_req *r)
{
    if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return 1;
    pthread_mutex_lock(&e->mu);
    gc_p2p__advance(e);
    pthread_mutex_unlock(&e->mu);
    return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
}

/* The caller lets go of its handle. */
static void gc_p2p_release(gc_p2p *e, gc_p2p_req *r)
{
    if (r == &e->sent)         /* shared by every send written at its start */
        return;
    pthread_mutex_lock(&e->mu);
    gc_p2p__unref(r);
    pthread_mutex_unlock(&e->mu);
}

/* Why peer is lost (GC_P2P_LIVE while it is not), and the value that goes with it. */
static int gc_p2p_lost(gc_p2p *e, int peer, uint64_t *value, uint64_t *cut_nbytes, int32_t *cut_tag)
{
    pthread_mutex_lock(&e->mu);
    gc_p2p_peer *p = &e->peers[peer];
    int why = p->lost;
    *value = p->lost_value;
    *cut_nbytes = p->cut_nbytes;
    *cut_tag = p->cut_tag;
    pthread_mutex_unlock(&e->mu);
    return why;
}

/* Bytes written straight onto peer's channel, bypassing the protocol (fault tests only). */
static int gc_p2p_raw(gc_p2p *e, int peer, const char *buf, uint64_t len)
{
    pthread_mutex_lock(&e->mu);
    gc_p2p_hdr h;
    memset(&h, 0, sizeof h);
    gc_p2p_out *o = gc_p2p__queue(e, peer, &h, NULL, 0, NULL);
    if (o) {                  /* a frame whose "header" is the caller's bytes */
        o->payload = buf;
        o->plen = len;
        o->off = GC_P2P_HDR_BYTES;
        while (e->peers[peer].out_head && !e->peers[peer].lost && e->peers[peer].chan)
            gc_p2p__push(e, peer);
    }
    pthread_mutex_unlock(&e->mu);
    return o ? 0 : GC_ERR_NOMEM;
}

#endif
