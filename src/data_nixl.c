/*
 * data_nixl — the `nixl` data path: ecx as a peer of vLLM's
 * ECCPUConnector on NIXL's data plane (docs/NIXL.md), with our own UCX and
 * no NIXL library (src/nixl_agent.c).
 *
 * Producer: one NIXL agent whose metadata offers the whole region
 * as one DRAM range; every OK ack carries that metadata as
 * agent_metadata and vLLM's mem_descriptor (one (addr, len, 0) per block)
 * as the descriptor, the same for every grant (ecxi_data_shared_descriptor).
 * A consumer (vLLM's connector, or any NIXL agent) READs the granted blocks
 * one-sidedly and sends the NIXL notification "{session_id}:{mm_hash}",
 * which this path hands to the session as a completion without a token
 * (ecxi_data_tokenless): the grant is released.
 *
 * Consumer: an ack's agent_metadata is NIXL's (parsed and bounded by
 * nixl_format.c: ECX_EDATA_META) and its mem_descriptor vLLM's list
 * (ecxi_data_ack_desc: uniform, our block size, else ECX_EDATA_DESC /
 * ECX_EDATA_MISMATCH); both end as BAD_ACK in the session. The peer is a
 * NIXL remote agent (nixl_agent.c: an endpoint from its worker address,
 * its rkeys), whose ranges must cover the whole list. A READ is one
 * ucp_get per run of consecutive blocks, a flush, then the notification
 * "{session_id}:{mm_hash}". No checksum comes with a NIXL grant: when the
 * READ is done its XXH3-64 is computed (the item's checksum in our cache),
 * verifying nothing. Unlike the other paths' slices, that hash runs in one
 * call (read_poll), in proportion to the item's size (~0.1 ms per MB).
 *
 * What it gives up (README, threat model): NIXL is one-sided, so the
 * producer decides nothing about what leaves it: a peer with the metadata
 * reads any block, and over UCX's tcp transport any address of the
 * process; grants are not claimed, checked or bound to a token; a
 * notification releases the grant it names whoever sends it. Trusted
 * networks only; never chosen by auto.
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "data_impl.h"
#include "nixl_agent.h"
#include "util.h"

typedef struct nixl_peer {
    ecxi_data_peer head;
    ecxi_nixl_remote *r;
    uint64_t base; /* the remote's block 0 */
} nixl_peer;

typedef struct nixl_xfer {
    ecxi_data_xfer head;
    ecxi_nixl_read *rd;
    int state;
    uint64_t checksum;
    uint64_t *blocks; /* local indices, for the checksum */
    size_t n;
    uint64_t nbytes;
} nixl_xfer;

typedef struct nixl_data {
    ecxi_data base;
    ecxi_nixl_agent *agent;
    uint8_t *desc; /* vLLM's mem_descriptor of the whole region */
    size_t desc_len;
    uint64_t notifs;
} nixl_data;

static const struct ecxi_data_ops nixl_ops;

/* A NIXL agent name unique across hosts: a vLLM process keeps one agent for
 * all its peers, and NIXL refuses a second remote agent of the same name
 * (or one named like itself). "ecx-" and 32 random hex digits. */
static int agent_name(char out[40])
{
    if (sodium_init() < 0) return ECX_ECRYPTO;
    uint8_t r[16];
    randombytes_buf(r, sizeof r);
    memcpy(out, "ecx-", 4);
    for (int i = 0; i < 16; i++)
        snprintf(out + 4 + 2 * i, 3, "%02x", r[i]);
    return 0;
}

static void nixl_free(ecxi_data *d)
{
    nixl_data *x = (nixl_data *)d;
    ecxi_nixl_agent_free(x->agent);
    free(x->desc);
    free(x);
}

static int nixl_progress(ecxi_data *d, ecxi_slice *sl)
{
    (void)sl;
    return ecxi_nixl_agent_progress(((nixl_data *)d)->agent);
}

static int nixl_fd(ecxi_data *d)
{
    return ecxi_nixl_agent_fd(((nixl_data *)d)->agent);
}

static int nixl_arm(ecxi_data *d)
{
    return ecxi_nixl_agent_arm(((nixl_data *)d)->agent);
}

static int nixl_poll_notifs(ecxi_data *d, ecxi_slice *sl, ecxi_data_notif_cb cb, void *arg)
{
    nixl_data *x = (nixl_data *)d;
    int rc = nixl_progress(d, sl);
    if (rc < 0) return rc;
    char name[ECX_NIXL_NAME_MAX + 1], msg[ECX_NIXL_MSG_MAX + 1];
    int n = 0;
    /* bounded per call, like every other path's poll */
    while (n < 4096 && ecxi_nixl_agent_notif_pop(x->agent, name, msg)) {
        size_t len = strlen(msg);
        x->notifs++;
        if (len > ECX_DATA_NOTIF_MAX) continue;
        cb(arg, msg, len, NULL, 0);
        n++;
    }
    return n;
}

static const uint8_t *nixl_shared_desc(const ecxi_data *d, size_t *len)
{
    const nixl_data *x = (const nixl_data *)d;
    *len = x->desc_len;
    return x->desc;
}

int ecxi_data_nixl_new_producer(ecxi_region *r, ecxi_data **out)
{
    nixl_data *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    x->base.ops = &nixl_ops;
    uint8_t *base = ecxi_region_base(r);
    uint64_t bs = ecxi_region_block_bytes(r), nb = ecxi_region_num_blocks(r);
    char name[40];
    int rc = agent_name(name);
    if (!rc) rc = ecxi_nixl_agent_new(name, base, (size_t)(bs * nb), &x->agent);
    ecxi_nixl_block *blk = rc ? NULL : calloc((size_t)nb, sizeof *blk);
    size_t cap = ecxi_nixl_desc_size((size_t)nb);
    if (!rc && (!blk || !(x->desc = malloc(cap)))) rc = ECX_ENOMEM;
    if (!rc) {
        for (uint64_t i = 0; i < nb; i++)
            blk[i] = (ecxi_nixl_block){(uintptr_t)base + i * bs, bs, 0};
        long k = ecxi_nixl_desc_encode(blk, (size_t)nb, x->desc, cap);
        if (k < 0) rc = (int)k;
        else x->desc_len = (size_t)k;
    }
    size_t ml;
    const uint8_t *md = rc ? NULL : ecxi_nixl_agent_metadata(x->agent, &ml);
    if (!rc && !(x->base.meta = malloc(ml))) rc = ECX_ENOMEM;
    if (rc) {
        free(blk);
        nixl_free(&x->base);
        return rc;
    }
    memcpy(x->base.meta, md, ml);
    x->base.meta_len = ml;
    free(blk);
    ecxi_log(ECX_LOG_WARN, "data nixl: NIXL agent %s offers the whole region (%llu bytes) to "
             "one-sided READs: trusted networks only", name, (unsigned long long)(bs * nb));
    *out = &x->base;
    return 0;
}

/* ---- consumer ----------------------------------------------------------- */

static int nixl_ack_desc(const ecxi_data *d, const uint8_t *buf, size_t len, uint64_t nbytes,
                         ecxi_data_desc *dd)
{
    memset(dd, 0, sizeof *dd);
    uint64_t bs = ecxi_region_block_bytes(d->region);
    size_t n;
    int rc = ecxi_nixl_desc_count(buf, len, ECX_REGION_MAX_BLOCKS, &n);
    if (rc) return rc;
    ecxi_nixl_block *b = malloc(n * sizeof *b);
    if (!b) return ECX_ENOMEM;
    if ((rc = ecxi_nixl_desc_decode(buf, len, b, n, &n))) goto out;
    rc = ECX_EDATA_MISMATCH;
    for (size_t i = 0; i < n; i++)
        if (b[i].len != bs) goto out;
    rc = ECX_EDATA_DESC;
    if (n > UINT64_MAX / bs || b[0].addr > UINT64_MAX - n * bs) goto out;
    for (size_t i = 0; i < n; i++)
        if (b[i].addr != b[0].addr + i * bs || b[i].dev_id != 0) goto out;
    if (nbytes == 0 || nbytes > n * bs) goto out;
    dd->block_bytes = bs;
    dd->num_blocks = n;
    dd->has_ticket = true;
    dd->ticket.nbytes = nbytes;
    dd->ticket.lease_ms = ECX_NIXL_LEASE_MS;
    dd->unverified = true;
    dd->remote_base = b[0].addr;
    rc = 0;
out:
    free(b);
    return rc;
}

static int nixl_peer_add_raw(ecxi_data *d, const uint8_t *meta, size_t meta_len,
                             const ecxi_data_desc *desc, ecxi_data_peer **out)
{
    nixl_data *x = (nixl_data *)d;
    if (!desc->unverified) return ECX_EDATA_DESC;
    nixl_peer *p = calloc(1, sizeof *p);
    if (!p) return ECX_ENOMEM;
    int rc = ecxi_nixl_remote_add(x->agent, meta, meta_len, &p->r);
    if (rc) {
        free(p);
        return rc;
    }
    /* The blocks of the list must be what the metadata registered. */
    if (!ecxi_nixl_remote_covers(p->r, desc->remote_base, desc->num_blocks * desc->block_bytes)) {
        ECX_LOG_RATELIMITED(ECX_LOG_WARN, "data nixl: the descriptor list of %s lies outside "
                            "its registered memory", ecxi_nixl_remote_name(p->r));
        ecxi_nixl_remote_drop(p->r);
        free(p);
        return ECX_EDATA_MISMATCH;
    }
    p->base = desc->remote_base;
    p->head.owner = d;
    p->head.backend = "nixl";
    *out = &p->head;
    return 0;
}

static void nixl_peer_drop(ecxi_data_peer *hp)
{
    nixl_peer *p = (nixl_peer *)hp;
    ecxi_nixl_remote_drop(p->r);
    free(p);
}

static int nixl_read_post(ecxi_data_peer *hp, const ecxi_data_ticket *t, const uint64_t *remote,
                          const uint64_t *local, size_t n, uint64_t nbytes, const char *key,
                          size_t key_len, ecxi_data_xfer **out)
{
    (void)t;
    nixl_peer *p = (nixl_peer *)hp;
    ecxi_data *d = hp->owner;
    uint64_t bs = ecxi_region_block_bytes(d->region);
    uint8_t *lbase = ecxi_region_base(d->region);
    nixl_xfer *x = calloc(1, sizeof *x);
    uint64_t *raddr = calloc(n, sizeof *raddr), *len = calloc(n, sizeof *len);
    void **lptr = calloc(n, sizeof *lptr);
    int rc = ECX_ENOMEM;
    if (x && raddr && len && lptr && (x->blocks = malloc(n * sizeof *x->blocks))) {
        for (size_t i = 0; i < n; i++) {
            raddr[i] = p->base + remote[i] * bs; /* indices checked by the front */
            lptr[i] = lbase + local[i] * bs;
            len[i] = bs; /* whole blocks, as NIXL's descriptors are */
        }
        memcpy(x->blocks, local, n * sizeof *local);
        x->n = n;
        x->nbytes = nbytes;
        x->head.owner = d;
        rc = ecxi_nixl_read_post(p->r, raddr, lptr, len, n, key, key_len, &x->rd);
    }
    free(raddr), free(len), free(lptr);
    if (rc) {
        if (x) free(x->blocks);
        free(x);
        return rc;
    }
    *out = &x->head;
    return 0;
}

static int nixl_read_poll(ecxi_data_xfer *hx)
{
    nixl_xfer *x = (nixl_xfer *)hx;
    if (x->state != ECX_XFER_RUNNING) return x->state;
    int st = ecxi_nixl_read_poll(x->rd);
    if (st == 0) return ECX_XFER_RUNNING;
    if (st < 0) return x->state = ECX_XFER_FAILED;
    const ecxi_region *r = hx->owner->region;
    x->checksum = ecxi_checksum_blocks(ecxi_region_base(r), ecxi_region_block_bytes(r), x->blocks,
                                       x->n, x->nbytes);
    return x->state = ECX_XFER_DONE;
}

static bool nixl_read_checksum(const ecxi_data_xfer *hx, uint64_t *sum)
{
    const nixl_xfer *x = (const nixl_xfer *)hx;
    if (x->state != ECX_XFER_DONE) return false;
    *sum = x->checksum;
    return true;
}

static void nixl_read_release(ecxi_data_xfer *hx)
{
    nixl_xfer *x = (nixl_xfer *)hx;
    ecxi_nixl_read_release(x->rd);
    free(x->blocks);
    free(x);
}

int ecxi_data_nixl_new_consumer(ecxi_region *r, ecxi_data **out)
{
    nixl_data *x = calloc(1, sizeof *x);
    if (!x) return ECX_ENOMEM;
    x->base.ops = &nixl_ops;
    char name[40];
    int rc = agent_name(name);
    if (!rc) rc = ecxi_nixl_agent_new(name, NULL, 0, &x->agent);
    if (rc) {
        free(x);
        return rc;
    }
    (void)r;
    *out = &x->base;
    return 0;
}

static const struct ecxi_data_ops nixl_ops = {
    .name = "nixl",
    .free = nixl_free,
    .progress = nixl_progress,
    .fd = nixl_fd,
    .arm = nixl_arm,
    .poll_notifs = nixl_poll_notifs,
    .shared_descriptor = nixl_shared_desc,
    .peer_add_raw = nixl_peer_add_raw,
    .ack_desc = nixl_ack_desc,
    .peer_drop = nixl_peer_drop,
    .read_post = nixl_read_post,
    .read_poll = nixl_read_poll,
    .read_release = nixl_read_release,
    .read_checksum = nixl_read_checksum,
};
