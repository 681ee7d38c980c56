/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics — renders a context's counters as Prometheus text (exposition
 * format 0.0.4): the producer's grants, NACKs by status, malformed frames,
 * leases and bytes; the region's blocks by state; the consumer's fetches by
 * outcome, retries, quarantines, bytes and a fetch-latency histogram.
 * It only formats: the counters live with the sessions that own them.
 */
#ifndef ECXI_METRICS_H
#define ECXI_METRICS_H

#include <stddef.h>

#include "cache.h"
#include "consumer.h"
#include "ctrl.h"
#include "data.h"
#include "events.h"
#include "producer.h"

typedef struct ecxi_metrics_src {
    const ecxi_producer_stats *producer; /* NULL if not a producer */
    const ecxi_ctrl_stats *ctrl;         /* the producer's ROUTER */
    const ecxi_data_stats *data;         /* the producer's data plane */
    uint64_t nixl_agent_restarts;        /* both data planes' (nixl) */
    uint64_t ucx_agent_restarts;         /* both data planes' (ucx) */
    const ecxi_consumer_stats *consumer; /* NULL if not a consumer */
    const ecxi_cache_stats *cache;
    const ecxi_events_stats *events;     /* NULL if events are off */
    unsigned long long block_bytes;
    uint64_t region_bytes, region_backed_bytes;
    const char *info_labels;             /* ecx_info's labels (escaped), NULL: none */
} ecxi_metrics_src;

/* Render into buf; *len gets the text's full length (NUL excluded) always.
 * Returns 0, or ECX_ERANGE if it does not fit cap with its NUL (then buf
 * holds an empty string). */
int ecxi_metrics_render(const ecxi_metrics_src *m, char *buf, size_t cap, size_t *len);

#endif
