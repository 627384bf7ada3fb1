/* The OFI channel: a gc_chan over libfabric, for traffic between hosts on RDMA fabrics
 * (verbs, efa, cxi, psm3) and, where none exists, on libfabric's tcp provider.
 *
 * libfabric is loaded at run time (dlopen): the few functions it exports are looked up once
 * (gc_ofi_load); everything else in its API is an inline call through the objects' own
 * operation tables. So this builds against libfabric's headers and imports on a machine
 * without the library.
 *
 * One domain per process (gc_ofi_dom): fabric, domain, one reliable-datagram endpoint
 * (FI_EP_RDM), one completion queue and one address vector, shared by every channel of the
 * process under one mutex (completions of any channel may be read by whoever drives the
 * queue). A channel (gc_ofichan) is one ordered byte stream each way between this process and
 * one peer process, for one communicator; its messages are tagged:
 *
 *   bits 63-32  the receiving channel's id (drawn at random by the receiver, told to the sender
 *               on the channel's authenticated TCP control socket)
 *   bit  31     RMA: the message describes bytes to read from the sender (see below)
 *   bit  30     control: credits and finished reads, receiver -> sender
 *   bits 29-0   the message's sequence number (data and RMA messages)
 *
 * Eager. The stream is cut into messages of at most slot_bytes; message k lands in receive
 * slot k % nslots, posted for exactly tag k (and from exactly the peer's address), so messages
 * are placed in stream order whatever order the fabric delivers them in. The sender sends
 * message k only once the receiver has posted slot k (credits: the receiver says how far it has
 * posted, every half ring); small messages go by fi_tinject, the others are copied into a
 * registered send slot first. Messages are cut at multiples of slot_bytes from where an offer
 * starts, so an element of the executor (16-byte aligned stream) never straddles two messages.
 *
 * RMA (zero copy). An offer of rma_min bytes or more is not copied: the sender registers the
 * caller's buffer and sends an RMA message naming it (address, key, length) in its place in the
 * stream; it reports the offer taken only once the receiver says it has read every byte (the
 * caller offers the same bytes again meanwhile, as for any gc_chan). The receiver reads the
 * bytes with fi_read straight into the caller's destination when it has one (recv_direct), else
 * through a registered bounce ring, two chunks in flight, shown by peek.
 *
 * Registration honours the provider's mr_mode bits and any asked for on top (the tests ask for
 * the verbs provider's FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY on tcp):
 * descriptors on every local buffer, virtual or offset addresses, provider or random keys,
 * registrations bound to the endpoint. Only a buffer being sent by RMA is open to remote reads,
 * and only until the peer has read it. A caller's buffer is registered for the one transfer and
 * closed after it (never a stale key for memory freed and reused at the same address).
 *
 * Progress. Providers move bytes only when called (manual progress): every channel call reads
 * the completion queue. A rank that waits elsewhere (in Python, for another rank) must still let
 * the bytes it handed over leave and its credits go out, or a peer waiting for them never gets
 * them; so one thread per domain reads the queue and sends due control messages once no channel
 * call has come for GC_OFI_IDLE_US (never while callers drive it: on a core of its own a rank
 * would otherwise share that core with the thread).
 *
 * Liveness. Each channel keeps its TCP control socket: alive() is 0 once the peer's end closed.
 * `fd` is -1 (the executor spins, then naps).
 */
#ifndef GC_OFICHAN_H
#define GC_OFICHAN_H
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "gc_chan.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0x2000
#endif

#define GC_OFI_API FI_VERSION(1, 9)
#define GC_OFI_NAME_MAX 128
#define GC_OFI_SEQ_MASK ((1ull << 30) - 1)
#define GC_OFI_TAG_RMA (1ull << 31)
#define GC_OFI_TAG_CTL (1ull << 30)
#define GC_OFI_NCTL 8                    /* control receives posted per channel */
#define GC_OFI_RD_CHUNK (256u << 10)     /* bounce reads of an RMA message */
#define GC_OFI_RD_NCHUNK 2
#define GC_OFI_IDLE_US 1000              /* the progress thread steps in after this long without a call */
/* the mr_mode bits honoured when the provider asks for them or the caller adds them */
#define GC_OFI_MR_KNOWN (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT)
#define GC_OFI_MR_VERBS (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY)

/* --- the library, loaded at run time ---------------------------------------------------------- */
typedef struct {
    void *handle;
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                   struct fi_info **);
    void (*freeinfo)(struct fi_info *);
    struct fi_info *(*dupinfo)(const struct fi_info *);
    int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
    const char *(*strerror)(int);
    uint32_t (*version)(void);
} gc_ofi_lib_t;

static gc_ofi_lib_t gc_ofi_lib;
static char gc_ofi_why[512];             /* why loading or opening failed, for the caller */

/* Some providers (PSM2's, loaded with libfabric's others) install handlers of their own for
 * SIGINT, SIGTERM, SIGSEGV... when libfabric loads or first lists providers: the program's
 * handlers (Python's KeyboardInterrupt, a rank's ignored SIGTERM) would be gone. Every call that
 * may initialise a provider is wrapped: the handlers are put back as they were. */
static const int gc_ofi_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE,
                                      SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };
#define GC_OFI_NSIG (int)(sizeof gc_ofi_signals / sizeof gc_ofi_signals[0])

static void gc_ofi_signals_save(struct sigaction *saved) {
    for (int i = 0; i < GC_OFI_NSIG; i++) sigaction(gc_ofi_signals[i], NULL, &saved[i]);
}

static void gc_ofi_signals_restore(const struct sigaction *saved) {
    for (int i = 0; i < GC_OFI_NSIG; i++) sigaction(gc_ofi_signals[i], &saved[i], NULL);
}

/* 0, or -1 with gc_ofi_why set. Idempotent. */
static int gc_ofi_load(const char *path) {
    if (gc_ofi_lib.handle) return 0;
    const char *name = path && *path ? path : "libfabric.so.1";
    struct sigaction saved[GC_OFI_NSIG];
    gc_ofi_signals_save(saved);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    gc_ofi_signals_restore(saved);
    if (!h) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "cannot load %s: %s", name, dlerror());
        return -1;
    }
    gc_ofi_lib_t l = { h };
    *(void **)&l.getinfo = dlsym(h, "fi_getinfo");
    *(void **)&l.freeinfo = dlsym(h, "fi_freeinfo");
    *(void **)&l.dupinfo = dlsym(h, "fi_dupinfo");
    *(void **)&l.fabric = dlsym(h, "fi_fabric");
    *(void **)&l.strerror = dlsym(h, "fi_strerror");
    *(void **)&l.version = dlsym(h, "fi_version");
    if (!l.getinfo || !l.freeinfo || !l.dupinfo || !l.fabric || !l.strerror || !l.version) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "%s lacks libfabric's functions (not libfabric?)", name);
        dlclose(h);
        return -1;
    }
    uint32_t v = l.version();
    if (FI_MAJOR(v) != FI_MAJOR_VERSION || FI_MINOR(v) < FI_MINOR_VERSION) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "%s is libfabric %u.%u; this build needs %d.%d or newer",
                 name, FI_MAJOR(v), FI_MINOR(v), FI_MAJOR_VERSION, FI_MINOR_VERSION);
        dlclose(h);
        return -1;
    }
    gc_ofi_lib = l;
    return 0;
}

static const char *gc_ofi_strerror(int err) {
    return gc_ofi_lib.strerror ? gc_ofi_lib.strerror(err < 0 ? -err : err) : "unknown error";
}

/* The fabric interfaces that match the hints gpucoll needs, or NULL (gc_ofi_why says why).
 * provider: NULL or e.g. "tcp;ofi_rxm", "verbs;ofi_rxm", "efa"; domain: NULL or its name (an
 * interface for tcp, a device for verbs); source: NULL or the local address to bind (an IP
 * for the software providers: it finds the interface even while its link is still coming up);
 * mr_extra: mr_mode bits to honour on top of the provider's. Free with gc_ofi_lib.freeinfo. */
static struct fi_info *gc_ofi_getinfo(const char *provider, const char *domain, const char *source,
                                      uint64_t mr_extra) {
    struct fi_info *hints = gc_ofi_lib.dupinfo(NULL), *info = NULL;
    if (!hints) { snprintf(gc_ofi_why, sizeof gc_ofi_why, "out of memory"); return NULL; }
    hints->caps = FI_TAGGED | FI_RMA | FI_READ | FI_REMOTE_READ | FI_DIRECTED_RECV;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->addr_format = FI_FORMAT_UNSPEC;
    hints->domain_attr->mr_mode = GC_OFI_MR_KNOWN | mr_extra;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    if (provider && *provider) hints->fabric_attr->prov_name = strdup(provider);
    if (domain && *domain) hints->domain_attr->name = strdup(domain);
    struct sigaction saved[GC_OFI_NSIG];
    gc_ofi_signals_save(saved);
    int r = gc_ofi_lib.getinfo(GC_OFI_API, source, NULL, source ? FI_SOURCE : 0, hints, &info);
    gc_ofi_signals_restore(saved);
    gc_ofi_lib.freeinfo(hints);
    if (!r && info && domain && *domain) {
        /* layered providers (tcp;ofi_rxm) list every interface whatever the hint: keep the one named */
        struct fi_info **at = &info;
        while (*at) {
            if (strcmp((*at)->domain_attr->name, domain) == 0) { at = &(*at)->next; continue; }
            struct fi_info *drop = *at;
            *at = drop->next;
            drop->next = NULL;
            gc_ofi_lib.freeinfo(drop);
        }
    }
    if (r || !info) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "no fabric interface%s%s%s%s%s%s with tagged messages and RMA "
                 "reads: %s", provider ? " of provider " : "", provider ? provider : "",
                 domain ? " on " : "", domain ? domain : "", source ? " at " : "", source ? source : "",
                 r ? gc_ofi_strerror(r) : "none listed");
        return NULL;
    }
    return info;
}

/* --- per-operation context ------------------------------------------------------------------ */
enum { GC_OFI_OP_TX = 1, GC_OFI_OP_RX, GC_OFI_OP_CTL, GC_OFI_OP_READ };

struct gc_ofichan;
typedef struct {
    struct fi_context2 fctx;     /* first: the provider's own (FI_CONTEXT / FI_CONTEXT2 modes) */
    struct gc_ofichan *ch;
    int kind;
    int busy;                    /* posted; its completion not read yet */
    int done;                    /* RX, READ: arrived and not used yet */
    size_t len;                  /* RX: bytes that arrived */
    uint64_t tag;                /* RX: the tag they came with */
} gc_ofi_op;

/* --- the process's domain ------------------------------------------------------------------- */
typedef struct {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    pthread_mutex_t lock;
    uint64_t mr_mode;            /* bits honoured: the provider's and the ones asked for */
    uint64_t prov_mr_mode;       /* the provider's own: keys and remote addresses follow these */
    size_t inject_max;
    uint64_t next_key;           /* a key to choose should the random source fail */
    char name[GC_OFI_NAME_MAX];  /* this endpoint's address */
    size_t namelen;
    int naddrs, capaddrs;        /* peers' addresses, each inserted once */
    char (*addr_names)[GC_OFI_NAME_MAX];
    size_t *addr_lens;
    fi_addr_t *addrs;
    int nchans;
    struct gc_ofichan *chans;    /* the open channels (linked through ->next): the progress thread
                                    sends their due control messages */
    pthread_t progress;
    int progress_on;
    volatile int progress_stop;
    volatile uint64_t activity;  /* bumped by every channel call: the progress thread naps short */
    struct gc_ofi_region *regions;  /* memory registered once for its life (gc_ofi_region_add) */
    uint64_t n_regs, n_reg_hits;    /* local registrations made; reads that reused one */
} gc_ofi_dom;

static void gc_ofi__regions_free(gc_ofi_dom *d);

static void gc_ofi_dom_destroy(gc_ofi_dom *d) {
    if (!d) return;
    if (d->progress_on) {
        d->progress_stop = 1;
        pthread_join(d->progress, NULL);
    }
    gc_ofi__regions_free(d);
    if (d->ep) fi_close(&d->ep->fid);
    if (d->av) fi_close(&d->av->fid);
    if (d->cq) fi_close(&d->cq->fid);
    if (d->domain) fi_close(&d->domain->fid);
    if (d->fabric) fi_close(&d->fabric->fid);
    if (d->info) gc_ofi_lib.freeinfo(d->info);
    free(d->addr_names);
    free(d->addr_lens);
    free(d->addrs);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static void *gc_ofi__progress_main(void *arg);

#define GC_OFI_TRY(call, what) do { int r_ = (int)(call); if (r_) { \
    snprintf(gc_ofi_why, sizeof gc_ofi_why, "%s: %s", what, gc_ofi_strerror(r_)); goto fail; } } while (0)

/* Open the domain on the first interface `info` lists (taken over: freed with the domain).
 * NULL with gc_ofi_why set on failure. */
static gc_ofi_dom *gc_ofi_dom_create(struct fi_info *info, uint64_t mr_extra) {
    gc_ofi_dom *d = calloc(1, sizeof *d);
    if (!d) { gc_ofi_lib.freeinfo(info); return NULL; }
    pthread_mutex_init(&d->lock, NULL);
    /* keep only the first interface: the domain is opened on it */
    if (info->next) { gc_ofi_lib.freeinfo(info->next); info->next = NULL; }
    d->info = info;
    d->prov_mr_mode = info->domain_attr->mr_mode;
    d->mr_mode = (d->prov_mr_mode & GC_OFI_MR_KNOWN) | mr_extra;
    if (info->domain_attr->mr_mode & FI_MR_RAW) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "provider %s needs raw memory keys (FI_MR_RAW), which gpucoll "
                 "does not handle", info->fabric_attr->prov_name);
        goto fail;
    }
    d->inject_max = info->tx_attr->inject_size;
    if (d->inject_max < sizeof(uint64_t) * 3) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "provider %s injects only %zu bytes; gpucoll's control "
                 "messages need 24", info->fabric_attr->prov_name, d->inject_max);
        goto fail;
    }
    d->next_key = 1;
    struct sigaction saved[GC_OFI_NSIG];
    gc_ofi_signals_save(saved);
    int opened = gc_ofi_lib.fabric(info->fabric_attr, &d->fabric, NULL);
    gc_ofi_signals_restore(saved);
    GC_OFI_TRY(opened, "fi_fabric");
    GC_OFI_TRY(fi_domain(d->fabric, info, &d->domain, NULL), "fi_domain");
    struct fi_cq_attr cqa = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE, .size = 0 };
    GC_OFI_TRY(fi_cq_open(d->domain, &cqa, &d->cq, NULL), "fi_cq_open");
    struct fi_av_attr ava = { .type = FI_AV_TABLE };
    GC_OFI_TRY(fi_av_open(d->domain, &ava, &d->av, NULL), "fi_av_open");
    GC_OFI_TRY(fi_endpoint(d->domain, info, &d->ep, NULL), "fi_endpoint");
    GC_OFI_TRY(fi_ep_bind(d->ep, &d->cq->fid, FI_TRANSMIT | FI_RECV), "binding the completion queue");
    GC_OFI_TRY(fi_ep_bind(d->ep, &d->av->fid, 0), "binding the address vector");
    GC_OFI_TRY(fi_enable(d->ep), "fi_enable");
    d->namelen = sizeof d->name;
    GC_OFI_TRY(fi_getname(&d->ep->fid, d->name, &d->namelen), "fi_getname");
    if (pthread_create(&d->progress, NULL, gc_ofi__progress_main, d)) {
        snprintf(gc_ofi_why, sizeof gc_ofi_why, "cannot start the progress thread");
        goto fail;
    }
    d->progress_on = 1;
    return d;
fail:
    gc_ofi_dom_destroy(d);
    return NULL;
}

/* The fi_addr of a peer's endpoint address, inserted on first use. Call with the lock held. */
static int gc_ofi_dom_addr(gc_ofi_dom *d, const void *name, size_t len, fi_addr_t *out) {
    if (len == 0 || len > GC_OFI_NAME_MAX) return -FI_EINVAL;
    for (int i = 0; i < d->naddrs; i++)
        if (d->addr_lens[i] == len && memcmp(d->addr_names[i], name, len) == 0) { *out = d->addrs[i]; return 0; }
    if (d->naddrs == d->capaddrs) {
        int cap = d->capaddrs ? 2 * d->capaddrs : 16;
        void *a = realloc(d->addr_names, (size_t)cap * GC_OFI_NAME_MAX);
        if (!a) return -FI_ENOMEM;
        d->addr_names = a;
        void *b = realloc(d->addr_lens, (size_t)cap * sizeof *d->addr_lens);
        if (!b) return -FI_ENOMEM;
        d->addr_lens = b;
        void *c = realloc(d->addrs, (size_t)cap * sizeof *d->addrs);
        if (!c) return -FI_ENOMEM;
        d->addrs = c;
        d->capaddrs = cap;
    }
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    int n = fi_av_insert(d->av, name, 1, &a, 0, NULL);
    if (n != 1) return n < 0 ? n : -FI_EINVAL;
    memcpy(d->addr_names[d->naddrs], name, len);
    d->addr_lens[d->naddrs] = len;
    d->addrs[d->naddrs++] = a;
    *out = a;
    return 0;
}

/* Register [buf, buf+len) for `access`; *desc gets the local descriptor. 0 or -FI_*. Where the
 * provider lets the caller choose keys they are drawn at random (a key names memory another
 * process may read: not guessable), and drawn again if one is taken. */
static int gc_ofi_reg(gc_ofi_dom *d, const void *buf, size_t len, uint64_t access, struct fid_mr **mr,
                      void **desc) {
    int r = -FI_ENOKEY;
    for (int attempt = 0; attempt < 8 && r == -FI_ENOKEY; attempt++) {
        uint64_t key = 0;
        if (!(d->prov_mr_mode & FI_MR_PROV_KEY)) {
            if (getrandom(&key, sizeof key, 0) != sizeof key) key = d->next_key++;
            size_t bytes = d->info->domain_attr->mr_key_size;
            if (bytes && bytes < sizeof key) key &= (1ull << (8 * bytes)) - 1;
        }
        r = fi_mr_reg(d->domain, buf, len, access, 0, key, 0, mr, NULL);
    }
    if (r) return r;
    if (d->prov_mr_mode & FI_MR_ENDPOINT) {
        if ((r = fi_mr_bind(*mr, &d->ep->fid, 0)) || (r = fi_mr_enable(*mr))) {
            fi_close(&(*mr)->fid);
            *mr = NULL;
            return r;
        }
    }
    *desc = fi_mr_desc(*mr);
    return 0;
}

/* --- memory registered for its life ----------------------------------------------------------
 * A read's destination must be registered (FI_MR_LOCAL). Memory whose life gpucoll knows
 * (MPI.Alloc_mem's: gpucoll.MPI adds it when allocated, drops it when freed or collected) is
 * registered once, on its first read, and that registration is used again; any other buffer
 * is registered for one read and closed after, since nothing here would learn that it was
 * freed and its address reused by another (whose pages an old registration does not name).
 * Only local access is kept: memory a peer may read is exposed for one transfer only. */
typedef struct gc_ofi_region {
    struct gc_ofi_region *next;
    uintptr_t base;
    size_t len;
    struct fid_mr *mr;           /* NULL until a first read lands in it */
    void *desc;
    int refs;                    /* reads in flight into it */
    int dropped;                 /* freed: closed once refs is 0 */
} gc_ofi_region;

static void gc_ofi__region_unlink(gc_ofi_dom *d, gc_ofi_region *g) {
    for (gc_ofi_region **at = &d->regions; *at; at = &(*at)->next)
        if (*at == g) { *at = g->next; break; }
    if (g->mr) fi_close(&g->mr->fid);
    free(g);
}

static void gc_ofi__regions_free(gc_ofi_dom *d) {
    while (d->regions) gc_ofi__region_unlink(d, d->regions);
}

/* 0, or -FI_ENOMEM. */
static int gc_ofi_region_add(gc_ofi_dom *d, uintptr_t base, size_t len) {
    gc_ofi_region *g = calloc(1, sizeof *g);
    if (!g) return -FI_ENOMEM;
    g->base = base;
    g->len = len;
    pthread_mutex_lock(&d->lock);
    g->next = d->regions;
    d->regions = g;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* The memory at base is being freed: its registration goes (at once, or when its reads end). */
static void gc_ofi_region_drop(gc_ofi_dom *d, uintptr_t base) {
    pthread_mutex_lock(&d->lock);
    for (gc_ofi_region *g = d->regions; g; g = g->next) {
        if (g->base != base || g->dropped) continue;
        g->dropped = 1;
        if (!g->refs) gc_ofi__region_unlink(d, g);
        break;
    }
    pthread_mutex_unlock(&d->lock);
}

/* Register [buf, buf+len) to be read into; *region is where the registration came from (NULL:
 * made for this read alone, *mr to close after). Under the domain's lock. 0 or -FI_*. */
static int gc_ofi__hold_local(gc_ofi_dom *d, void *buf, size_t len, gc_ofi_region **region,
                              struct fid_mr **mr, void **desc) {
    uintptr_t a = (uintptr_t)buf;
    for (gc_ofi_region *g = d->regions; g; g = g->next) {
        if (g->dropped || a < g->base || a + len > g->base + g->len) continue;
        if (!g->mr) {
            int r = gc_ofi_reg(d, (void *)g->base, g->len, FI_READ, &g->mr, &g->desc);
            if (r) return r;
            d->n_regs++;
        } else {
            d->n_reg_hits++;
        }
        g->refs++;
        *region = g;
        *mr = NULL;
        *desc = g->desc;
        return 0;
    }
    *region = NULL;
    int r = gc_ofi_reg(d, buf, len, FI_READ, mr, desc);
    if (!r) d->n_regs++;
    return r;
}

static void gc_ofi__release_local(gc_ofi_dom *d, gc_ofi_region *region, struct fid_mr *mr) {
    if (mr) fi_close(&mr->fid);
    if (region && --region->refs == 0 && region->dropped) gc_ofi__region_unlink(d, region);
}

/* --- the channel ---------------------------------------------------------------------------- */
typedef struct { uint64_t addr, key, len; } gc_ofi_rma_msg;    /* an RMA message's payload */
typedef struct { uint64_t posted, reads; } gc_ofi_ctl_msg;      /* a control message's payload */

typedef struct gc_ofichan {
    gc_chan base;                /* first: a gc_ofichan* is a gc_chan* */
    gc_ofi_dom *d;
    int ctl_fd;                  /* the TCP control socket: liveness */
    uint32_t id, peer_id;        /* tag bases: this side's receives, the peer's */
    fi_addr_t peer_addr;
    int connected;
    size_t slot_bytes;
    uint32_t nslots;
    size_t rma_min;
    /* memory: send slots, receive slots, control buffers, bounce ring */
    char *mem;
    size_t mem_bytes;
    struct fid_mr *mr;
    void *desc;
    char *tx_mem, *rx_mem, *rd_mem;
    gc_ofi_ctl_msg *ctl_rx;
    gc_ofi_op *tx_ops, *rx_ops, ctl_ops[GC_OFI_NCTL], rd_ops[GC_OFI_RD_NCHUNK];
    /* send side */
    uint64_t tx_seq;             /* the next message's sequence number */
    uint64_t tx_credit;          /* the peer has posted receives for every message below this */
    int rma_active;              /* an RMA message of ours waits to be read */
    const char *rma_buf;
    size_t rma_len;
    uint64_t rma_count;          /* RMA messages sent (the one waiting included) */
    uint64_t rma_read;           /* how many of them the peer has finished reading */
    struct fid_mr *rma_mr;
    /* receive side */
    uint64_t rx_seq;             /* the message being read */
    size_t rx_off;               /* bytes of it consumed (eager) */
    uint64_t posted;             /* receives are posted for every message below this */
    uint64_t posted_told;        /* ... as last told to the peer */
    uint64_t reads_done;         /* RMA messages of the peer read completely */
    uint64_t reads_told;
    int ctl_due;                 /* a control message could not leave yet */
    /* reading the current RMA message */
    int rd_active;
    gc_ofi_rma_msg rd;
    uint64_t rd_issued;          /* bytes of it asked for (bounce or direct) */
    uint64_t rd_consumed;        /* bytes of it handed to the caller */
    uint64_t rd_base;            /* where the bounce ring's chunk 0 starts in it */
    int rd_direct;               /* a read straight into the caller's memory is in flight */
    size_t rd_direct_len;
    struct fid_mr *rd_direct_mr;     /* its registration, when made for it alone */
    gc_ofi_region *rd_direct_region; /* ... or the registered memory it lands in */
    gc_ofi_op rd_direct_op;
    int gone;                    /* 0, or the status every later call returns */
    int err;                     /* the provider's error behind it */
    /* what moved how (OfiChannel.stats()) */
    uint64_t n_eager, n_rma;     /* messages sent: eager, RMA */
    uint64_t read_bounce, read_direct; /* bytes read one-sided: through the bounce ring, into place */
    struct gc_ofichan *next;     /* the domain's list */
} gc_ofichan;

static void gc_ofi__fail(gc_ofichan *ch, int status, int err) {
    if (!ch->gone) { ch->gone = status; ch->err = err < 0 ? -err : err; }
}

static uint64_t gc_ofi__tag(uint32_t id, uint64_t low) { return ((uint64_t)id << 32) | low; }

static int gc_ofi__post_rx(gc_ofichan *ch, uint64_t seq) {
    uint32_t s = (uint32_t)(seq % ch->nslots);
    gc_ofi_op *op = &ch->rx_ops[s];
    op->done = 0;
    op->busy = 1;
    int r = (int)fi_trecv(ch->d->ep, ch->rx_mem + (size_t)s * ch->slot_bytes, ch->slot_bytes, ch->desc,
                          ch->peer_addr, gc_ofi__tag(ch->id, seq & GC_OFI_SEQ_MASK), GC_OFI_TAG_RMA, op);
    if (r) op->busy = 0;
    return r;
}

static int gc_ofi__post_ctl(gc_ofichan *ch, int i) {
    gc_ofi_op *op = &ch->ctl_ops[i];
    op->busy = 1;
    int r = (int)fi_trecv(ch->d->ep, &ch->ctl_rx[i], sizeof ch->ctl_rx[i], ch->desc, ch->peer_addr,
                          gc_ofi__tag(ch->id, GC_OFI_TAG_CTL), 0, op);
    if (r) op->busy = 0;
    return r;
}

/* Tell the peer how far receives are posted and how many of its RMA messages are read, when
 * either moved enough (half the ring, or any read). Lock held. */
static void gc_ofi__tell(gc_ofichan *ch) {
    if (!ch->connected || ch->gone) return;
    int due = ch->ctl_due || ch->reads_done != ch->reads_told ||
              ch->posted - ch->posted_told >= (ch->nslots + 1) / 2;
    if (!due) return;
    gc_ofi_ctl_msg m = { ch->posted, ch->reads_done };
    int r = (int)fi_tinject(ch->d->ep, &m, sizeof m, ch->peer_addr, gc_ofi__tag(ch->peer_id, GC_OFI_TAG_CTL));
    if (r == -FI_EAGAIN) { ch->ctl_due = 1; return; }
    if (r) { gc_ofi__fail(ch, GC_ERR_IO, r); return; }
    ch->ctl_due = 0;
    ch->posted_told = m.posted;
    ch->reads_told = m.reads;
}

static void gc_ofi__completed(gc_ofi_op *op, const struct fi_cq_tagged_entry *e) {
    gc_ofichan *ch = op->ch;
    op->busy = 0;
    switch (op->kind) {
    case GC_OFI_OP_RX:
        op->done = 1;
        op->len = e->len;
        op->tag = e->tag;
        break;
    case GC_OFI_OP_READ:
        op->done = 1;
        break;
    case GC_OFI_OP_CTL: {
        int i = (int)(op - ch->ctl_ops);
        gc_ofi_ctl_msg m = ch->ctl_rx[i];
        if (e->len == sizeof m) {
            if (m.posted > ch->tx_credit) ch->tx_credit = m.posted;
            if (m.reads > ch->rma_read) ch->rma_read = m.reads;
        }
        if (!ch->gone) {
            int r = gc_ofi__post_ctl(ch, i);
            if (r) gc_ofi__fail(ch, GC_ERR_IO, r);
        }
        break;
    }
    default:
        break;
    }
}

/* Read every completion waiting (any channel's). Lock held. */
static void gc_ofi__progress(gc_ofi_dom *d) {
    struct fi_cq_tagged_entry e[16];
    for (;;) {
        ssize_t n = fi_cq_read(d->cq, e, 16);
        if (n == -FI_EAGAIN) return;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err;
            memset(&err, 0, sizeof err);
            if (fi_cq_readerr(d->cq, &err, 0) != 1) return;
            gc_ofi_op *op = err.op_context;
            if (op) {
                op->busy = 0;
                if (err.err != FI_ECANCELED) gc_ofi__fail(op->ch, GC_ERR_PEER, err.err);
            }
            continue;
        }
        if (n < 0) return;
        for (ssize_t i = 0; i < n; i++)
            if (e[i].op_context) gc_ofi__completed(e[i].op_context, &e[i]);
    }
}

static void *gc_ofi__progress_main(void *arg) {
    gc_ofi_dom *d = arg;
    uint64_t seen = d->activity;
    while (!d->progress_stop) {
        usleep(GC_OFI_IDLE_US);
        uint64_t now = d->activity;
        if (now != seen) {          /* the channels' callers drive the queue: stay out of their way */
            seen = now;
            continue;
        }
        if (pthread_mutex_trylock(&d->lock) == 0) {
            gc_ofi__progress(d);
            for (struct gc_ofichan *ch = d->chans; ch; ch = ch->next) gc_ofi__tell(ch);
            pthread_mutex_unlock(&d->lock);
        }
    }
    return NULL;
}

/* --- send ------------------------------------------------------------------------------------ */
static ssize_t gc_ofi__send_locked(gc_ofichan *ch, const char *buf, size_t len) {
    gc_ofi_dom *d = ch->d;
    if (ch->rma_active) {
        /* taken once the peer has read it all; the caller offers the same bytes meanwhile */
        if (ch->rma_read < ch->rma_count) return 0;
        size_t taken = ch->rma_len < len ? ch->rma_len : len;
        fi_close(&ch->rma_mr->fid);
        ch->rma_mr = NULL;
        ch->rma_active = 0;
        return (ssize_t)taken;
    }
    if (len >= ch->rma_min && ch->tx_seq < ch->tx_credit) {
        void *unused;
        int r = gc_ofi_reg(d, buf, len, FI_REMOTE_READ, &ch->rma_mr, &unused);
        if (r) { gc_ofi__fail(ch, GC_ERR_IO, r); return ch->gone; }
        gc_ofi_rma_msg m = { (d->prov_mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0,
                             fi_mr_key(ch->rma_mr), len };
        r = (int)fi_tinject(d->ep, &m, sizeof m, ch->peer_addr,
                            gc_ofi__tag(ch->peer_id, GC_OFI_TAG_RMA | (ch->tx_seq & GC_OFI_SEQ_MASK)));
        if (r) {
            fi_close(&ch->rma_mr->fid);
            ch->rma_mr = NULL;
            if (r != -FI_EAGAIN) { gc_ofi__fail(ch, GC_ERR_IO, r); return ch->gone; }
            return 0;
        }
        ch->tx_seq++;
        ch->n_rma++;
        ch->rma_active = 1;
        ch->rma_buf = buf;
        ch->rma_len = len;
        ch->rma_count++;
        return 0;
    }
    size_t taken = 0;
    while (taken < len && ch->tx_seq < ch->tx_credit) {
        size_t n = len - taken < ch->slot_bytes ? len - taken : ch->slot_bytes;
        uint64_t tag = gc_ofi__tag(ch->peer_id, ch->tx_seq & GC_OFI_SEQ_MASK);
        int r;
        if (n <= d->inject_max) {
            r = (int)fi_tinject(d->ep, buf + taken, n, ch->peer_addr, tag);
        } else {
            uint32_t s = (uint32_t)(ch->tx_seq % ch->nslots);
            gc_ofi_op *op = &ch->tx_ops[s];
            if (op->busy) break;
            char *slot = ch->tx_mem + (size_t)s * ch->slot_bytes;
            memcpy(slot, buf + taken, n);
            op->busy = 1;
            r = (int)fi_tsend(d->ep, slot, n, ch->desc, ch->peer_addr, tag, op);
            if (r) op->busy = 0;
        }
        if (r == -FI_EAGAIN) break;
        if (r) { gc_ofi__fail(ch, GC_ERR_IO, r); return taken ? (ssize_t)taken : ch->gone; }
        ch->tx_seq++;
        ch->n_eager++;
        taken += n;
    }
    return (ssize_t)taken;
}

static ssize_t gc_ofi_send(gc_chan *c, const void *buf, size_t len) {
    gc_ofichan *ch = (gc_ofichan *)c;
    pthread_mutex_lock(&ch->d->lock);
    ch->d->activity++;
    gc_ofi__progress(ch->d);
    ssize_t k = ch->gone ? ch->gone : gc_ofi__send_locked(ch, buf, len);
    gc_ofi__tell(ch);
    pthread_mutex_unlock(&ch->d->lock);
    return k;
}

/* --- receive --------------------------------------------------------------------------------- */
static int gc_ofi__issue_reads(gc_ofichan *ch) {
    /* bounce chunk k holds the bytes from rd_base + k * CHUNK; at most GC_OFI_RD_NCHUNK of them
     * are read ahead of the one being consumed */
    for (;;) {
        uint64_t issued = ch->rd_issued - ch->rd_base, consumed = ch->rd_consumed - ch->rd_base;
        if (ch->rd_issued >= ch->rd.len ||
            issued >= consumed - consumed % GC_OFI_RD_CHUNK + (uint64_t)GC_OFI_RD_NCHUNK * GC_OFI_RD_CHUNK)
            return 0;
        uint64_t k = issued / GC_OFI_RD_CHUNK;
        gc_ofi_op *op = &ch->rd_ops[k % GC_OFI_RD_NCHUNK];
        if (op->busy || op->done) return 0;
        size_t n = ch->rd.len - ch->rd_issued < GC_OFI_RD_CHUNK ? (size_t)(ch->rd.len - ch->rd_issued)
                                                                 : GC_OFI_RD_CHUNK;
        op->busy = 1;
        int r = (int)fi_read(ch->d->ep, ch->rd_mem + (k % GC_OFI_RD_NCHUNK) * GC_OFI_RD_CHUNK, n, ch->desc,
                             ch->peer_addr, ch->rd.addr + ch->rd_issued, ch->rd.key, op);
        if (r) {
            op->busy = 0;
            if (r == -FI_EAGAIN) return 0;
            gc_ofi__fail(ch, GC_ERR_IO, r);
            return r;
        }
        ch->rd_issued += n;
        ch->read_bounce += n;
    }
}

/* The current message, if it has arrived: 1 (and the RMA state set up), or 0. Lock held. */
static int gc_ofi__current(gc_ofichan *ch, gc_ofi_op **opp) {
    gc_ofi_op *op = &ch->rx_ops[ch->rx_seq % ch->nslots];
    if (!op->done) return 0;
    *opp = op;
    if ((op->tag & GC_OFI_TAG_RMA) && !ch->rd_active) {
        if (op->len != sizeof ch->rd) { gc_ofi__fail(ch, GC_ERR_IO, FI_EINVAL); return 0; }
        memcpy(&ch->rd, ch->rx_mem + (ch->rx_seq % ch->nslots) * ch->slot_bytes, sizeof ch->rd);
        ch->rd_active = 1;
        ch->rd_issued = ch->rd_consumed = ch->rd_base = 0;
    }
    return 1;
}

/* The current message is used up: post its slot again for the message nslots on. Lock held. */
static void gc_ofi__next(gc_ofichan *ch) {
    if (ch->rd_active) {
        ch->rd_active = 0;
        ch->reads_done++;
    }
    ch->rx_off = 0;
    ch->rx_seq++;
    int r = gc_ofi__post_rx(ch, ch->posted);
    if (r) { gc_ofi__fail(ch, GC_ERR_IO, r); return; }
    ch->posted++;
}

static ssize_t gc_ofi__peek_locked(gc_ofichan *ch, const void **ptr) {
    gc_ofi_op *op;
    if (!gc_ofi__current(ch, &op)) return 0;
    if (!ch->rd_active) {
        *ptr = ch->rx_mem + (ch->rx_seq % ch->nslots) * ch->slot_bytes + ch->rx_off;
        return (ssize_t)(op->len - ch->rx_off);
    }
    if (ch->rd.len == 0) { gc_ofi__next(ch); return 0; }
    if (gc_ofi__issue_reads(ch)) return ch->gone;
    uint64_t rel = ch->rd_consumed - ch->rd_base, k = rel / GC_OFI_RD_CHUNK;
    gc_ofi_op *rd = &ch->rd_ops[k % GC_OFI_RD_NCHUNK];
    if (!rd->done) return 0;
    uint64_t end = ch->rd_base + (k + 1) * GC_OFI_RD_CHUNK;
    if (end > ch->rd.len) end = ch->rd.len;
    *ptr = ch->rd_mem + (k % GC_OFI_RD_NCHUNK) * GC_OFI_RD_CHUNK + rel % GC_OFI_RD_CHUNK;
    return (ssize_t)(end - ch->rd_consumed);
}

static ssize_t gc_ofi_peek(gc_chan *c, const void **ptr) {
    gc_ofichan *ch = (gc_ofichan *)c;
    pthread_mutex_lock(&ch->d->lock);
    ch->d->activity++;
    gc_ofi__progress(ch->d);
    ssize_t k = gc_ofi__peek_locked(ch, ptr);
    if (k == 0 && ch->gone) k = ch->gone;
    gc_ofi__tell(ch);
    pthread_mutex_unlock(&ch->d->lock);
    return k;
}

static void gc_ofi_consume(gc_chan *c, size_t n) {
    gc_ofichan *ch = (gc_ofichan *)c;
    pthread_mutex_lock(&ch->d->lock);
    if (ch->rd_active) {
        uint64_t before = (ch->rd_consumed - ch->rd_base) / GC_OFI_RD_CHUNK;
        ch->rd_consumed += n;
        if ((ch->rd_consumed - ch->rd_base) / GC_OFI_RD_CHUNK != before || ch->rd_consumed == ch->rd.len)
            ch->rd_ops[before % GC_OFI_RD_NCHUNK].done = 0;      /* that bounce chunk is free */
        if (ch->rd_consumed == ch->rd.len) gc_ofi__next(ch);
        else gc_ofi__issue_reads(ch);
    } else {
        gc_ofi_op *op = &ch->rx_ops[ch->rx_seq % ch->nslots];
        ch->rx_off += n;
        if (ch->rx_off >= op->len) gc_ofi__next(ch);
    }
    gc_ofi__tell(ch);
    pthread_mutex_unlock(&ch->d->lock);
}

/* The next len bytes straight into dst: an RMA message is read there with no copy on either
 * side; eager bytes are copied out of their slot. */
static ssize_t gc_ofi_recv_direct(gc_chan *c, void *dst, size_t len) {
    gc_ofichan *ch = (gc_ofichan *)c;
    gc_ofi_dom *d = ch->d;
    ssize_t k = 0;
    pthread_mutex_lock(&d->lock);
    gc_ofi__progress(d);
    if (ch->rd_direct) {
        if (ch->rd_direct_op.done) {
            ch->rd_direct_op.done = 0;
            ch->rd_direct = 0;
            gc_ofi__release_local(d, ch->rd_direct_region, ch->rd_direct_mr);
            ch->rd_direct_mr = NULL;
            ch->rd_direct_region = NULL;
            k = (ssize_t)ch->rd_direct_len;
            ch->rd_consumed += ch->rd_direct_len;
            ch->rd_base = ch->rd_consumed;      /* bounce chunks count from here on */
            if (ch->rd_consumed == ch->rd.len) gc_ofi__next(ch);
        } else if (ch->gone) {
            k = ch->gone;
        }
        goto out;
    }
    gc_ofi_op *op;
    if (!gc_ofi__current(ch, &op)) { k = ch->gone; goto out; }
    if (ch->rd_active && ch->rd_issued == ch->rd_consumed && ch->rd.len > 0) {
        size_t n = ch->rd.len - ch->rd_consumed < len ? (size_t)(ch->rd.len - ch->rd_consumed) : len;
        size_t max = d->info->ep_attr->max_msg_size;
        if (max && n > max) n = max;
        void *desc;
        int r = gc_ofi__hold_local(d, dst, n, &ch->rd_direct_region, &ch->rd_direct_mr, &desc);
        if (r) { gc_ofi__fail(ch, GC_ERR_IO, r); k = ch->gone; goto out; }
        ch->rd_direct_op = (gc_ofi_op){ .ch = ch, .kind = GC_OFI_OP_READ, .busy = 1 };
        r = (int)fi_read(d->ep, dst, n, desc, ch->peer_addr, ch->rd.addr + ch->rd_consumed, ch->rd.key,
                         &ch->rd_direct_op);
        if (r) {
            ch->rd_direct_op.busy = 0;
            gc_ofi__release_local(d, ch->rd_direct_region, ch->rd_direct_mr);
            ch->rd_direct_mr = NULL;
            ch->rd_direct_region = NULL;
            if (r != -FI_EAGAIN) { gc_ofi__fail(ch, GC_ERR_IO, r); k = ch->gone; }
            goto out;
        }
        ch->rd_direct = 1;
        ch->rd_direct_len = n;
        ch->rd_issued += n;
        ch->read_direct += n;
        goto out;
    }
    /* eager bytes, or an RMA message already being read through the bounce ring */
    const void *p;
    ssize_t m = gc_ofi__peek_locked(ch, &p);
    if (m > 0) {
        size_t n = (size_t)m < len ? (size_t)m : len;
        memcpy(dst, p, n);
        pthread_mutex_unlock(&d->lock);
        gc_ofi_consume(c, n);
        return (ssize_t)n;
    }
    k = m;
out:
    gc_ofi__tell(ch);
    pthread_mutex_unlock(&d->lock);
    return k;
}

static int gc_ofi_alive(gc_chan *c) {
    gc_ofichan *ch = (gc_ofichan *)c;
    if (ch->gone == GC_ERR_PEER) return 0;
    struct pollfd p = { ch->ctl_fd, POLLIN | POLLRDHUP, 0 };
    if (poll(&p, 1, 0) <= 0) return 1;
    if (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) return 0;
    char b;
    ssize_t r = recv(ch->ctl_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return !(r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR));
}

/* --- life cycle ------------------------------------------------------------------------------ */
/* A channel with its receives not posted yet: its id and sizes go to the peer, then
 * gc_ofichan_connect. The domain must outlive it. 0, or -FI_* / GC_ERR_NOMEM. */
static int gc_ofichan_create(gc_ofi_dom *d, int ctl_fd, int peer, size_t slot_bytes, uint32_t nslots,
                             size_t rma_min, gc_ofichan **out) {
    if (nslots < 2 || slot_bytes < 64 || slot_bytes % GC_CHAN_ALIGN) return -FI_EINVAL;
    gc_ofichan *ch = calloc(1, sizeof *ch);
    if (!ch) return GC_ERR_NOMEM;
    ch->d = d;
    ch->ctl_fd = ctl_fd;
    ch->slot_bytes = slot_bytes;
    ch->nslots = nslots;
    ch->rma_min = rma_min ? rma_min : (size_t)-1;
    ch->base.send = gc_ofi_send;
    ch->base.peek = gc_ofi_peek;
    ch->base.consume = gc_ofi_consume;
    ch->base.alive = gc_ofi_alive;
    ch->base.recv_direct = gc_ofi_recv_direct;
    ch->base.fd = -1;
    ch->base.peer = peer;
    ch->base.whole_from = ch->rma_min;
    size_t ring = (size_t)nslots * slot_bytes;
    ch->mem_bytes = 2 * ring + (size_t)GC_OFI_RD_NCHUNK * GC_OFI_RD_CHUNK + GC_OFI_NCTL * sizeof(gc_ofi_ctl_msg);
    ch->tx_ops = calloc(nslots, sizeof *ch->tx_ops);
    ch->rx_ops = calloc(nslots, sizeof *ch->rx_ops);
    if (!ch->tx_ops || !ch->rx_ops || posix_memalign((void **)&ch->mem, 4096, ch->mem_bytes)) {
        free(ch->tx_ops); free(ch->rx_ops); free(ch);
        return GC_ERR_NOMEM;
    }
    ch->tx_mem = ch->mem;
    ch->rx_mem = ch->mem + ring;
    ch->rd_mem = ch->mem + 2 * ring;
    ch->ctl_rx = (gc_ofi_ctl_msg *)(ch->rd_mem + (size_t)GC_OFI_RD_NCHUNK * GC_OFI_RD_CHUNK);
    for (uint32_t i = 0; i < nslots; i++) {
        ch->tx_ops[i] = (gc_ofi_op){ .ch = ch, .kind = GC_OFI_OP_TX };
        ch->rx_ops[i] = (gc_ofi_op){ .ch = ch, .kind = GC_OFI_OP_RX };
    }
    for (int i = 0; i < GC_OFI_NCTL; i++) ch->ctl_ops[i] = (gc_ofi_op){ .ch = ch, .kind = GC_OFI_OP_CTL };
    for (int i = 0; i < GC_OFI_RD_NCHUNK; i++) ch->rd_ops[i] = (gc_ofi_op){ .ch = ch, .kind = GC_OFI_OP_READ };
    uint32_t id = 0;
    while (id == 0 && getrandom(&id, sizeof id, 0) == sizeof id) {}
    ch->id = id ? id : (uint32_t)(uintptr_t)ch;
    pthread_mutex_lock(&d->lock);
    int r = gc_ofi_reg(d, ch->mem, ch->mem_bytes, FI_SEND | FI_RECV | FI_READ, &ch->mr, &ch->desc);
    if (!r) {
        d->nchans++;
        ch->next = d->chans;
        d->chans = ch;
    }
    pthread_mutex_unlock(&d->lock);
    if (r) {
        free(ch->mem); free(ch->tx_ops); free(ch->rx_ops); free(ch);
        return r;
    }
    *out = ch;
    return 0;
}

/* The peer's address, id and slot size are known: post the receives. Afterwards (once the peer
 * has posted its own, which the control socket says) the channel may carry bytes. */
static int gc_ofichan_connect(gc_ofichan *ch, const void *peer_name, size_t namelen, uint32_t peer_id,
                              size_t peer_slot_bytes, uint32_t peer_nslots) {
    gc_ofi_dom *d = ch->d;
    if (peer_slot_bytes != ch->slot_bytes || peer_nslots != ch->nslots) return -FI_EINVAL;
    int r;
    pthread_mutex_lock(&d->lock);
    r = gc_ofi_dom_addr(d, peer_name, namelen, &ch->peer_addr);
    if (!r) {
        ch->peer_id = peer_id;
        for (uint64_t s = 0; s < ch->nslots && !r; s++)
            if (!(r = gc_ofi__post_rx(ch, s))) ch->posted++;
        for (int i = 0; i < GC_OFI_NCTL && !r; i++) r = gc_ofi__post_ctl(ch, i);
        ch->posted_told = ch->posted;
        ch->tx_credit = peer_nslots;      /* the peer posts as many before saying it is ready */
        ch->connected = !r;
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

/* Cancel what is posted and wait (bounded) for the provider to let go of it. Returns 1 when
 * everything came back (the memory may be freed), 0 when something is still held. */
static int gc_ofi__quiesce(gc_ofichan *ch) {
    gc_ofi_dom *d = ch->d;
    for (uint32_t i = 0; i < ch->nslots; i++)
        if (ch->rx_ops[i].busy) fi_cancel(&d->ep->fid, &ch->rx_ops[i]);
    for (int i = 0; i < GC_OFI_NCTL; i++)
        if (ch->ctl_ops[i].busy) fi_cancel(&d->ep->fid, &ch->ctl_ops[i]);
    for (int spin = 0; spin < 20000; spin++) {
        int busy = ch->rd_direct_op.busy;
        for (uint32_t i = 0; i < ch->nslots; i++) busy |= ch->rx_ops[i].busy | ch->tx_ops[i].busy;
        for (int i = 0; i < GC_OFI_NCTL; i++) busy |= ch->ctl_ops[i].busy;
        for (int i = 0; i < GC_OFI_RD_NCHUNK; i++) busy |= ch->rd_ops[i].busy;
        if (!busy) return 1;
        gc_ofi__progress(d);
        if (spin > 100) {
            pthread_mutex_unlock(&d->lock);
            usleep(100);
            pthread_mutex_lock(&d->lock);
        }
    }
    return 0;
}

static void gc_ofichan_destroy(gc_ofichan *ch) {
    if (!ch) return;
    gc_ofi_dom *d = ch->d;
    pthread_mutex_lock(&d->lock);
    ch->gone = GC_ERR_USAGE;
    int quiet = gc_ofi__quiesce(ch);
    if (ch->rma_mr) fi_close(&ch->rma_mr->fid);
    if (quiet) gc_ofi__release_local(d, ch->rd_direct_region, ch->rd_direct_mr);
    if (ch->mr) fi_close(&ch->mr->fid);
    d->nchans--;
    for (gc_ofichan **at = &d->chans; *at; at = &(*at)->next)
        if (*at == ch) { *at = ch->next; break; }
    pthread_mutex_unlock(&d->lock);
    if (ch->ctl_fd >= 0) close(ch->ctl_fd);
    if (quiet) {          /* else the provider may still write there: leave it allocated */
        free(ch->mem);
        free(ch->tx_ops);
        free(ch->rx_ops);
        free(ch);
    }
}

#endif
