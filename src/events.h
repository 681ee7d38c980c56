/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events — encoder-cache events for routers (docs/EVENTS.md): what a
 * producer holds, published on a ZeroMQ XPUB socket in vLLM's KV-events
 * framing [topic, 8-byte big-endian sequence number, msgpack batch], with a
 * ROUTER replay socket (PORT + 1) that answers "every batch since N" from a
 * bounded ring, or a snapshot of the current contents.
 *
 * The hooks (stored, removed) are called from the engine's calls under the
 * context's lock: they append one encoded event to the pending chunks
 * under this module's own mutex and wake its thread, nothing more. The
 * thread numbers each chunk (at most ~16 KiB of events) as one batch, keeps
 * it in the ring and sends it without ever blocking (a subscriber at its
 * high-water mark misses the batch, counted; it gets it back by replay).
 * Memory is bounded: pending bytes (past the bound the events are dropped
 * and their batch's number is left as a hole that forces a snapshot), the
 * ring (batches and bytes), the per-subscriber queues (SNDHWM batches of
 * ~16 KiB at most) and the held set (one record per item the cache holds).
 */
#ifndef ECXI_EVENTS_H
#define ECXI_EVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ecxi_events ecxi_events;

typedef struct ecxi_events_opts {
    void *zctx;                   /* the context's ZeroMQ context (its ZAP handler applies) */
    const char *endpoint;         /* "HOST:PORT": XPUB on PORT, replay ROUTER on PORT + 1 */
    const char *topic;            /* first frame of every message; NULL: "" */
    const char *curve_secret_key; /* Z85; NULL: plaintext */
    const char *peer_host;        /* the producer's announced control-plane address */
    int peer_port;
    uint64_t block_bytes;
} ecxi_events_opts;

typedef struct ecxi_events_stats {
    uint64_t batches;         /* batches published */
    uint64_t events;          /* events published */
    uint64_t hwm_drops;       /* batches some subscriber missed at its high-water mark */
    uint64_t lost;            /* events dropped before numbering (pending bound) */
    uint64_t replays;         /* replay requests answered */
    uint64_t resyncs;         /* replay requests told to take a snapshot */
    uint64_t snapshots;       /* snapshot requests answered */
    uint64_t bad_requests;    /* malformed replay requests */
    uint64_t reply_truncated; /* replies cut at the asker's high-water mark */
    uint64_t held;            /* items held now (what a snapshot sends) */
} ecxi_events_stats;

/* Bind both sockets and start the thread; the first batch is a cleared
 * event ("start"). ECX_EINVAL (bad endpoint, topic over 255 bytes, port
 * 0 or 65535), ECX_ESYS (bind failed), ECX_ENOMEM. */
int ecxi_events_new(const ecxi_events_opts *o, ecxi_events **out);
/* Publish a last cleared event ("stop"), stop the thread, close. NULL: no-op. */
void ecxi_events_free(ecxi_events *ev);

/* The hooks. NULL ev: no-op. An item stored twice is updated; removing one
 * never stored is ignored (a `both` context's fetched items). */
void ecxi_events_stored(ecxi_events *ev, const char *key, size_t key_len, uint64_t size_bytes,
                        uint64_t n_blocks);
void ecxi_events_removed(ecxi_events *ev, const char *key, size_t key_len, const char *reason);

ecxi_events_stats ecxi_events_get_stats(ecxi_events *ev);

#endif
