/* SPDX-License-Identifier: Apache-2.0 */
/*
 * context — the ecx_ctx behind every public call, shared by its two halves:
 * connector.c (configuration, lifecycle, items) and loop.c (the lock rules,
 * waiting, the progress thread: the threading model). Private to libecx.
 */
#ifndef ECXI_CONTEXT_H
#define ECXI_CONTEXT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "announce.h"
#include "cache.h"
#include "consumer.h"
#include "ctrl.h"
#include "data.h"
#include "ecx.h"
#include "events.h"
#include "producer.h"
#include "region.h"
#include "table.h"


/* An item whose segment list the caller holds (ecx_save_begin / ecx_load). */
typedef struct open_item {
    ecxi_table_node node;
    char key[ECX_MM_HASH_MAX];
    uint32_t holds; /* 1 for a save; one per unreleased load */
    bool committing; /* a save's checksum is being computed outside mu */
    size_t n;
    ecx_segment segs[];
} open_item;

struct ecx_ctx {
    pthread_mutex_t mu;
    int role;
    uint64_t block_bytes;
    ecxi_announce_rows rows; /* version 2's sizing; elem_size 0: version 1 */
    char compat[ECX_COMPAT_HASH_HEX + 1];
    char *info_labels; /* the ecx_info metric's labels: the four factors, hash, version */
    char advertise[256];
    int port;
    void *zctx;
    ecxi_region *region;
    ecxi_cache *cache;
    ecxi_data *pdata, *cdata; /* producer / consumer data-plane contexts */
    ecxi_ctrl_server *srv;
    ecxi_producer *prod;
    ecxi_events *events;      /* NULL: events off */
    ecxi_consumer *cons;
    /* The open items, under omu (taken after mu where both are): loads and
     * releases take omu alone, never mu (the cache they pin in has its own
     * lock), so they do not wait for the progress thread. */
    pthread_mutex_t omu;
    ecxi_table open; /* open_item by mm_hash */
    ecxi_cache_run *runs; /* scratch for segments */
    size_t runs_cap;
    /* Waiting (loop.c). */
    int epfd, kick;
    atomic_int callers;      /* public calls waiting for mu: the progress thread yields */
    /* The progress thread (cfg.progress_thread): it runs step() under mu in
     * bounded slices; `done` is an eventfd it writes when a step handled
     * events, which is what the engine waits on in that mode. */
    bool threaded;
    pthread_t thread;
    atomic_bool stopping;
    int done;
    atomic_int done_events;
    /* kick / done hold a write not yet drained: one write per drain, and
     * no read of an empty eventfd (signal_fd, drain_fd). */
    atomic_bool kicked, done_set;
    atomic_int waiters;      /* threads inside ecx_poll's wait */
    int *watched;            /* fds in epfd besides kick */
    size_t n_watched, watched_cap;
    int *fds;                /* scratch: the fds to watch now */
    size_t fds_cap;
    uint64_t synced_gen;     /* the consumer's sessions_gen at the last sync */
    zmq_pollitem_t *items;   /* scratch: the consumer's sockets */
    size_t items_cap;
    /* consumer CURVE keys, Z85, copied from the config ("": none) */
    char curve_server[ECXI_CTRL_KEY_Z85 + 1], curve_secret[ECXI_CTRL_KEY_Z85 + 1];
};

/* Public calls take mu through these: a caller announces itself first, and
 * the progress thread, between two slices, lets announced callers in before
 * it takes mu again (a mutex is not fair: the thread would win most races). */
static inline void ecxi_ctx_lock(ecx_ctx *ctx)
{
    atomic_fetch_add_explicit(&ctx->callers, 1, memory_order_relaxed);
    pthread_mutex_lock(&ctx->mu);
    atomic_fetch_sub_explicit(&ctx->callers, 1, memory_order_relaxed);
}

static inline void ecxi_ctx_unlock(ecx_ctx *ctx) { pthread_mutex_unlock(&ctx->mu); }

/* loop.c. init: the epoll set and the kick (before anything is watched);
 * fini: close and free them (after the thread stopped and the sessions are
 * gone). */
int ecxi_loop_init(ecx_ctx *ctx);
void ecxi_loop_fini(ecx_ctx *ctx);
/* The progress thread (config.progress_thread): started last in ecx_new,
 * stopped first in ecx_free. */
int ecxi_loop_start_thread(ecx_ctx *ctx);
void ecxi_loop_stop_thread(ecx_ctx *ctx);
/* Make a waiter (ecx_poll's, or the progress thread) look again. */
void ecxi_loop_kick(ecx_ctx *ctx);
/* After a call that may have sent a request (the consumer's count was
 * requests_before): a thread waiting in ecx_poll must look again (the send
 * may have created a socket or eaten its edge). */
void ecxi_loop_sent(ecx_ctx *ctx, uint64_t requests_before);

#endif
