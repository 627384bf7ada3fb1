/* A channel: one direction-pair of byte streams between this rank and one peer.
 * Every transport (shared memory, TCP, later IPC/verbs staging) fills this table; the
 * schedule executor (gc_exec.h) only ever talks to peers through it, never to sockets.
 *
 * All calls are non-blocking and called without the GIL. Streams are ordered and
 * reliable. A channel may be driven by one thread at a time.
 */
#ifndef GC_CHAN_H
#define GC_CHAN_H
#include "gc_types.h"

typedef struct gc_chan gc_chan;
struct gc_chan {
    /* Push up to len bytes of buf toward the peer; returns the number of bytes taken
     * (0 when there is no room yet) or a GC_ERR_* code. */
    ssize_t (*send)(gc_chan *c, const void *buf, size_t len);
    /* Expose bytes that arrived from the peer without copying them: sets *ptr to the
     * first unread byte and returns how many contiguous bytes may be read there
     * (0 when nothing arrived yet) or a GC_ERR_* code. */
    ssize_t (*peek)(gc_chan *c, const void **ptr);
    /* Mark n bytes (n <= what peek returned) as read, freeing their room. */
    void (*consume)(gc_chan *c, size_t n);
    /* 1 while the peer looks alive, 0 once it is known to be gone (cheap; called
     * when a wait makes no progress for a while). */
    int (*alive)(gc_chan *c);
    /* A file descriptor to poll() for readability/writability while idle, or -1
     * (shared memory: the executor spins, then yields). */
    int fd;
    int peer;           /* the peer's rank in the communicator, for error messages */
    void *impl;         /* the transport's own state */
    /* Optional (NULL where the transport has none): take the next len bytes of the stream
     * straight into dst instead of through peek/consume (a large payload whose place is
     * known). Returns how many bytes at the front of dst are complete (consumed), 0 when
     * none yet, or a GC_ERR_* code. Once called, the caller keeps calling it with the rest
     * of the same len bytes (dst and len advanced by what it returned) until they are all
     * in, and calls nothing else that reads meanwhile. */
    ssize_t (*recv_direct)(gc_chan *c, void *dst, size_t len);
    /* Optional (NULL where the transport has none): words both processes of the pair map
     * (shared memory), pair_nwords of them on each side: pair_words[0] belongs to the messages
     * this side sends, pair_words[1] to the peer's. Point to point keeps the chunk claims of
     * its rendezvous copies there (gc_p2p.h). */
    uint64_t *pair_words[2];
    unsigned pair_nwords;
    /* Optional (0 where the transport has none): an offer of at least this many bytes is moved
     * one-sided, with no copy, once the peer reads it (OFI): a caller that would cut a large
     * payload into pieces offers it whole instead. */
    size_t whole_from;
    /* Optional (NULL where the transport has none): how many more bytes the send stream takes
     * before its next stripe boundary, counted from the end of what send took so far; 0 when
     * the stream is not striped (TCP over one socket). Bytes past the boundary go on another
     * socket: a frame written across it reaches the peer as two short TCP segments. */
    uint64_t (*stripe_room)(gc_chan *c);
};

/* Every message a step sends is padded to a multiple of GC_CHAN_ALIGN bytes, and every
 * channel's ring capacity is a multiple of it, so that an element (at most 16 bytes)
 * never straddles the wrap of a ring and peek always shows whole elements once they
 * have fully arrived. */
#define GC_CHAN_ALIGN 16

#endif
