/*
 * data_nixl — the `nixl` data path: ecx as a peer of vLLM's
 * ECCPUConnector on NIXL's data plane (docs/NIXL.md), with our own UCX and
 * no NIXL library (src/nixl_agent.c).
 *
 * Producer (done): one NIXL agent whose metadata offers the whole region
 * as one DRAM range; every OK ack carries that metadata as
 * agent_metadata and vLLM's mem_descriptor (one (addr, len, 0) per block)
 * as the descriptor, the same for every grant (ecxi_data_shared_descriptor).
 * A consumer (vLLM's connector, or any NIXL agent) READs the granted blocks
 * one-sidedly and sends the NIXL notification "{session_id}:{mm_hash}",
 * which this path hands to the session as a completion without a token
 * (ecxi_data_tokenless): the grant is released.
 *
 * Consumer: not yet (ECX_EINVAL): `ecx get --data nixl` is refused.
 *
 * What it gives up (README, threat model): NIXL is one-sided, so the
 * producer decides nothing about what leaves it: a peer with the metadata
 * reads any block, and over UCX's tcp transport any address of the
 * process; grants are not claimed, checked or bound to a token; a
 * notification releases the grant it names whoever sends it. Trusted
 * networks only; never chosen by auto.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_impl.h"
#include "nixl_agent.h"
#include "util.h"

typedef struct nixl_data {
    ecxi_data base;
    ecxi_nixl_agent *agent;
    uint8_t *desc; /* vLLM's mem_descriptor of the whole region */
    size_t desc_len;
    uint64_t notifs;
} nixl_data;

static const struct ecxi_data_ops nixl_ops;

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
    char name[64];
    snprintf(name, sizeof name, "ecx-%d-%p", (int)getpid(), (void *)x);
    int rc = ecxi_nixl_agent_new(name, base, (size_t)(bs * nb), &x->agent);
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

static const struct ecxi_data_ops nixl_ops = {
    .name = "nixl",
    .free = nixl_free,
    .progress = nixl_progress,
    .fd = nixl_fd,
    .arm = nixl_arm,
    .poll_notifs = nixl_poll_notifs,
    .shared_descriptor = nixl_shared_desc,
};
