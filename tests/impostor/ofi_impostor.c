/* An impostor on a gpucoll rank's OFI endpoint (tests/test_ofi_trust.py): a libfabric client of
 * the same provider that never proved the job's secret, sending what a forger would: tagged
 * messages under guessed tags (random ones, and every small channel id with low sequence
 * numbers), and one-sided writes and reads under guessed keys and addresses.
 *
 *   ofi_impostor PROVIDER HEX_ADDRESS [ROUNDS]
 *
 * Prints one line: "sent T writes W reads R errors E" (operations the local provider took, and
 * those that completed with an error). Whatever it prints, the target must stay exact. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

static struct fid_ep *ep;
static struct fid_cq *cq;
static long errors;

static void drain(void) {
    struct fi_cq_tagged_entry e[16];
    for (;;) {
        ssize_t n = fi_cq_read(cq, e, 16);
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err;
            memset(&err, 0, sizeof err);
            fi_cq_readerr(cq, &err, 0);
            errors++;
            continue;
        }
        if (n <= 0) return;
    }
}

/* Post with retries while the provider is still connecting (-FI_EAGAIN); 1 once it took it. */
#define POST(call) ({ int ok_ = 0; for (int t_ = 0; t_ < 2000; t_++) { ssize_t r_ = (call); \
    if (r_ == 0) { ok_ = 1; break; } if (r_ != -FI_EAGAIN) break; drain(); \
    struct timespec ts_ = { 0, 100000 }; nanosleep(&ts_, NULL); } ok_; })

static uint64_t rnd(void) { return ((uint64_t)rand() << 33) ^ ((uint64_t)rand() << 11) ^ (uint64_t)rand(); }

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s PROVIDER HEX_ADDRESS [ROUNDS]\n", argv[0]); return 2; }
    int rounds = argc > 3 ? atoi(argv[3]) : 200;
    unsigned char addr[128];
    size_t alen = strlen(argv[2]) / 2;
    if (alen == 0 || alen > sizeof addr) return 2;
    for (size_t i = 0; i < alen; i++) sscanf(argv[2] + 2 * i, "%2hhx", &addr[i]);
    srand((unsigned)time(NULL));

    struct fi_info *hints = fi_allocinfo(), *info;
    hints->caps = FI_TAGGED | FI_RMA | FI_READ | FI_WRITE;
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(argv[1]);
    if (fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info)) { fprintf(stderr, "no provider\n"); return 1; }
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fi_cq_attr cqa = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE };
    struct fi_av_attr ava = { .type = FI_AV_TABLE };
    if (fi_fabric(info->fabric_attr, &fabric, NULL) || fi_domain(fabric, info, &domain, NULL) ||
        fi_cq_open(domain, &cqa, &cq, NULL) || fi_av_open(domain, &ava, &av, NULL) ||
        fi_endpoint(domain, info, &ep, NULL) || fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) ||
        fi_ep_bind(ep, &av->fid, 0) || fi_enable(ep)) {
        fprintf(stderr, "cannot open an endpoint\n");
        return 1;
    }
    fi_addr_t target;
    if (fi_av_insert(av, addr, 1, &target, 0, NULL) != 1) { fprintf(stderr, "bad address\n"); return 1; }
    static char buf[1 << 16];
    memset(buf, 0xA5, sizeof buf);
    struct fid_mr *mr;
    fi_mr_reg(domain, buf, sizeof buf, FI_SEND | FI_RECV | FI_READ | FI_WRITE, 0, 1, 0, &mr, NULL);
    void *desc = fi_mr_desc(mr);
    static struct fi_context2 ctx[4096];
    long sent = 0, writes = 0, reads = 0;
    size_t inject = info->tx_attr->inject_size < 64 ? info->tx_attr->inject_size : 64;
    for (int r = 0; r < rounds; r++) {
        /* tagged messages: a random tag, and a small channel id with a low sequence number, of
         * the sizes an eager slot, an RMA message (24 bytes) and a control message (16) have */
        uint64_t tags[3] = { rnd(), ((uint64_t)(r % 64) << 32) | (uint64_t)(r % 8),
                             ((uint64_t)rnd() << 32) | (1ull << 30) };
        size_t sizes[3] = { 16, 24, inject };
        for (int k = 0; k < 3; k++) {
            sent += POST(fi_tinject(ep, buf, sizes[k], target, tags[k]));
            drain();
        }
        /* one-sided writes and reads with guessed keys and addresses */
        uint64_t keys[2] = { (uint64_t)r, rnd() };
        uint64_t where[2] = { 0, rnd() & 0x7fffffffffffull };
        for (int k = 0; k < 2; k++) {
            writes += POST(fi_write(ep, buf, 64, desc, target, where[k], keys[k], &ctx[(4 * r + k) % 4096]));
            reads += POST(fi_read(ep, buf + 4096, 64, desc, target, where[k], keys[k], &ctx[(4 * r + 2 + k) % 4096]));
            drain();
        }
    }
    for (int i = 0; i < 2000; i++) {
        drain();
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    printf("sent %ld writes %ld reads %ld errors %ld\n", sent, writes, reads, errors);
    return 0;
}
