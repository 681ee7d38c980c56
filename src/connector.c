/*
 * connector — the engine-facing context (include/ecx.h): one per engine,
 * owning the region, the cache, the data plane, the control-plane socket
 * and the role's sessions, and driving them all from ecx_poll().
 *
 * Save path (producer): ecx_save_begin reserves blocks (not ready) and
 * hands out where to write; ecx_save_commit marks the entry ready, and from
 * then on the producer session can grant it. Fetch path (consumer):
 * ecx_fetch parses the announcement and hands the item to the consumer
 * session, which reserves, asks, READs and marks ready; ecx_load pins the
 * ready entry while the engine copies it out, ecx_release unpins. In
 * ECX_ROLE_BOTH the two share one region and one cache.
 */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "checksum.h"
#include "consumer.h"
#include "ctrl.h"
#include "data.h"
#include "ecx.h"
#include "metrics.h"
#include "producer.h"
#include "region.h"
#include "util.h"

struct ecx_ctx {
    int role;
    uint64_t block_bytes;
    char compat[ECX_COMPAT_HASH_HEX + 1];
    char advertise[256];
    int port;
    void *zctx;
    ecxi_region *region;
    ecxi_cache *cache;
    ecxi_data *pdata, *cdata; /* producer / consumer data-plane contexts */
    ecxi_ctrl_server *srv;
    ecxi_producer *prod;
    ecxi_consumer *cons;
    ecxi_cache_run *runs; /* scratch for segments */
    size_t runs_cap;
    zmq_pollitem_t *items; /* scratch for ecx_poll */
    size_t items_cap;
    /* consumer CURVE keys, Z85, copied from the config ("": none) */
    char curve_server[ECX_CTRL_KEY_Z85 + 1], curve_secret[ECX_CTRL_KEY_Z85 + 1];
};

void ecx_config_init(ecx_config *c)
{
    memset(c, 0, sizeof *c);
    c->role = ECX_ROLE_CONSUMER;
    c->listen = ECX_DEFAULT_LISTEN;
    c->region_bytes = ECX_DEFAULT_REGION_BYTES;
    c->block_bytes = ECX_DEFAULT_BLOCK_BYTES;
    c->vllm_version = ECX_DEFAULT_VLLM_VERSION;
    c->model = ECX_DEFAULT_MODEL;
    c->dtype = ECX_DEFAULT_DTYPE;
    c->data = "auto";
    c->ack_timeout_ms = 2000;
    c->read_timeout_ms = 20000;
    c->quarantine_ms = 60000;
    c->item_wait_ms = 60000;
    c->lease_ms = 30000;
    c->max_conn_grants = 1024;
    c->max_conn_pin_pct = 50;
}

/* A host we announce must be safe to put in JSON as is. */
static bool host_ok(const char *h)
{
    size_t n = strlen(h);
    if (n == 0 || n > 255) return false;
    for (size_t i = 0; i < n; i++)
        if (!(h[i] == '.' || h[i] == '-' || h[i] == ':' || h[i] == '_' ||
              (h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'z') ||
              (h[i] >= 'A' && h[i] <= 'Z')))
            return false;
    return true;
}

static int start_producer(ecx_ctx *ctx, const ecx_config *cfg, int backend)
{
    char host[256];
    int port, rc;
    if (ecxi_ctrl_parse_addr(cfg->listen, host, &port)) {
        ecxi_log(ECX_LOG_ERROR, "listen address '%s' is not HOST:PORT", cfg->listen);
        return ECX_EINVAL;
    }
    const char *adv = cfg->advertise_host;
    if (!adv) {
        bool wild = !strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
        adv = wild ? "127.0.0.1" : host;
    }
    if (!host_ok(adv)) {
        ecxi_log(ECX_LOG_ERROR, "advertised host '%s' is not a host name or address", adv);
        return ECX_EINVAL;
    }
    snprintf(ctx->advertise, sizeof ctx->advertise, "%s", adv);
    ecxi_ctrl_opts copts = {.curve_secret_key = cfg->curve_secret_key,
                           .curve_allow = cfg->curve_allow,
                           .n_curve_allow = cfg->n_curve_allow};
    if (cfg->n_curve_allow && !cfg->curve_secret_key) {
        ecxi_log(ECX_LOG_ERROR, "a CURVE allow-list needs the producer's CURVE secret key");
        return ECX_EINVAL;
    }
    if ((rc = ecxi_ctrl_server_new(ctx->zctx, host, port, &copts, &ctx->srv))) return rc;
    if (cfg->curve_secret_key)
        ecxi_log(ECX_LOG_INFO, "producer: CURVE on, %s",
                cfg->n_curve_allow ? "allow-list enforced" : "any client with the server key");
    ctx->port = ecxi_ctrl_server_port(ctx->srv);
    ecxi_data_opts dopts = {.backend = backend, .bind_host = ctx->advertise};
    if ((rc = ecxi_data_new_producer(ctx->region, &dopts, &ctx->pdata))) return rc;
    ecxi_producer_opts po = {.compat_hash = ctx->compat,
                            .lease_ms = cfg->lease_ms,
                            .max_conn_grants = cfg->max_conn_grants,
                            .max_conn_pin_pct = cfg->max_conn_pin_pct,
                            .block_bytes = ctx->block_bytes};
    return ecxi_producer_new(ctx->cache, ctx->pdata, ctx->srv, &po, &ctx->prod);
}

static int start_consumer(ecx_ctx *ctx, const ecx_config *cfg, int backend)
{
    ecxi_data_opts dopts = {.backend = backend};
    int rc = ecxi_data_new_consumer(ctx->region, &dopts, &ctx->cdata);
    if (rc) return rc;
    ecxi_consumer_opts co = {.zctx = ctx->zctx,
                            .compat_hash = ctx->compat,
                            .block_bytes = ctx->block_bytes,
                            .ack_timeout_ms = cfg->ack_timeout_ms,
                            .read_timeout_ms = cfg->read_timeout_ms,
                            .quarantine_ms = cfg->quarantine_ms,
                            .item_wait_ms = cfg->item_wait_ms};
    if (cfg->curve_server_key) {
        /* Keys are checked here so a bad one fails ecx_new, not every fetch. */
        if (ecxi_ctrl_key_parse(cfg->curve_server_key, NULL) ||
            (cfg->curve_secret_key && ecxi_ctrl_key_parse(cfg->curve_secret_key, NULL))) {
            ecxi_log(ECX_LOG_ERROR, "consumer: a CURVE key is not Z85 (40 characters)");
            return ECX_EINVAL;
        }
        memcpy(ctx->curve_server, cfg->curve_server_key, sizeof ctx->curve_server);
        co.ctrl.curve_server_key = ctx->curve_server;
        if (cfg->curve_secret_key) {
            memcpy(ctx->curve_secret, cfg->curve_secret_key, sizeof ctx->curve_secret);
            co.ctrl.curve_secret_key = ctx->curve_secret;
        }
    }
    return ecxi_consumer_new(ctx->cache, ctx->cdata, &co, &ctx->cons);
}

int ecx_new(const ecx_config *cfg, ecx_ctx **out)
{
    if (!cfg || !out || cfg->role < ECX_ROLE_PRODUCER || cfg->role > ECX_ROLE_BOTH ||
        !cfg->vllm_version || !cfg->model || !cfg->dtype || cfg->block_bytes == 0 ||
        cfg->block_bytes > INT64_MAX || cfg->region_bytes < cfg->block_bytes)
        return ECX_EINVAL;
    int backend, rc;
    if ((rc = ecxi_data_backend_parse(cfg->data ? cfg->data : "auto", &backend))) return rc;
    ecx_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return ECX_ENOMEM;
    ctx->role = cfg->role;
    ctx->block_bytes = cfg->block_bytes;
    rc = ecx_compat_hash(cfg->vllm_version, strlen(cfg->vllm_version), cfg->model,
                         strlen(cfg->model), cfg->dtype, strlen(cfg->dtype),
                         (int64_t)cfg->block_bytes, ctx->compat);
    char instance[ECX_REGION_INSTANCE_ID_LEN + 1];
    const char *inst = cfg->instance;
    if (!rc && !inst && !(rc = ecxi_region_instance_id(instance))) inst = instance;
    if (!rc)
        rc = ecxi_region_create(inst, cfg->rank, cfg->region_bytes, cfg->block_bytes, &ctx->region);
    if (!rc) {
        ecxi_cache_opts co = {.num_blocks = ecxi_region_num_blocks(ctx->region)};
        rc = ecxi_cache_new(&co, &ctx->cache);
    }
    if (!rc && !(ctx->zctx = zmq_ctx_new())) rc = ECX_ESYS;
    if (!rc && (cfg->role & ECX_ROLE_PRODUCER)) rc = start_producer(ctx, cfg, backend);
    if (!rc && (cfg->role & ECX_ROLE_CONSUMER)) rc = start_consumer(ctx, cfg, backend);
    if (rc) {
        ecx_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

void ecx_free(ecx_ctx *ctx)
{
    if (!ctx) return;
    ecxi_consumer_free(ctx->cons);
    ecxi_producer_free(ctx->prod);
    ecxi_data_free(ctx->cdata);
    ecxi_data_free(ctx->pdata);
    ecxi_ctrl_server_free(ctx->srv);
    if (ctx->zctx) zmq_ctx_term(ctx->zctx);
    ecxi_cache_free(ctx->cache);
    ecxi_region_free(ctx->region);
    free(ctx->runs);
    free(ctx->items);
    sodium_memzero(ctx->curve_secret, sizeof ctx->curve_secret);
    free(ctx);
}

int ecx_listen_port(const ecx_ctx *ctx) { return ctx->srv ? ctx->port : ECX_EINVAL; }

/* ---------- poll ---------- */

static int step(ecx_ctx *ctx)
{
    int ev = 0;
    if (ctx->prod) ev += ecxi_producer_poll(ctx->prod);
    if (ctx->cons) ev += ecxi_consumer_poll(ctx->cons);
    return ev;
}

/* Room for `need` poll items. */
static int items_reserve(ecx_ctx *ctx, size_t need)
{
    if (need <= ctx->items_cap) return 0;
    size_t cap = ctx->items_cap ? ctx->items_cap : 8;
    while (cap < need) cap *= 2;
    zmq_pollitem_t *m = realloc(ctx->items, cap * sizeof *m);
    if (!m) return ECX_ENOMEM;
    ctx->items = m, ctx->items_cap = cap;
    return 0;
}

static int add_item(ecx_ctx *ctx, size_t *n, zmq_pollitem_t it)
{
    if (items_reserve(ctx, *n + 1)) return ECX_ENOMEM;
    ctx->items[(*n)++] = it;
    return 0;
}

/* Add a data context's descriptor; returns false if it has none to sleep
 * on (then ecx_poll must wake on a short timer). */
static bool add_data_fd(ecx_ctx *ctx, size_t *n, ecxi_data *d, bool *work)
{
    if (!d) return true;
    int fd = ecxi_data_fd(d);
    if (fd < 0) return false;
    int armed = ecxi_data_arm(d);
    if (armed != 0) *work = true;
    return add_item(ctx, n, (zmq_pollitem_t){NULL, fd, ZMQ_POLLIN, 0}) == 0;
}

static int64_t min_timeout(int64_t a, int64_t b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    return a < b ? a : b;
}

int ecx_poll(ecx_ctx *ctx, int timeout_ms)
{
    if (!ctx) return ECX_EINVAL;
    int ev = step(ctx);
    if (ev || timeout_ms == 0) return ev;

    size_t n = 0;
    bool work = false, sleepable = true;
    if (ctx->srv) add_item(ctx, &n, (zmq_pollitem_t){ecxi_ctrl_server_socket(ctx->srv), 0, ZMQ_POLLIN, 0});
    if (ctx->srv && ecxi_ctrl_server_zap_socket(ctx->srv)) /* CURVE handshakes wait on it */
        add_item(ctx, &n,
                 (zmq_pollitem_t){ecxi_ctrl_server_zap_socket(ctx->srv), 0, ZMQ_POLLIN, 0});
    if (ctx->cons) {
        size_t want = ecxi_consumer_pollitems(ctx->cons, NULL, 0);
        if (items_reserve(ctx, n + want)) return ECX_ENOMEM;
        n += ecxi_consumer_pollitems(ctx->cons, ctx->items + n, ctx->items_cap - n);
    }
    sleepable &= add_data_fd(ctx, &n, ctx->pdata, &work);
    sleepable &= add_data_fd(ctx, &n, ctx->cdata, &work);
    if (work) return step(ctx);

    int64_t wait = timeout_ms;
    if (ctx->prod) wait = min_timeout(wait, ecxi_producer_next_timeout(ctx->prod));
    if (ctx->cons) wait = min_timeout(wait, ecxi_consumer_next_timeout(ctx->cons));
    if (!sleepable) wait = min_timeout(wait, 1);
    /* With nothing to wait on (a consumer before its first fetch), sleep
     * out the timeout rather than spin; never block forever on nothing. */
    if (wait > 0 || (wait < 0 && n > 0)) zmq_poll(n ? ctx->items : NULL, (int)n, (long)wait);
    return step(ctx);
}

/* ---------- producer ---------- */

static bool hash_ok(const char *h) { return h && *h && strlen(h) <= ECX_CACHE_KEY_MAX; }

/* The entry's runs into ctx->runs (grown as needed); *n gets their count. */
static int entry_runs(ecx_ctx *ctx, const char *h, size_t *n)
{
    int rc;
    while ((rc = ecxi_cache_runs(ctx->cache, h, strlen(h), ctx->runs, ctx->runs_cap, n)) ==
           ECX_ERANGE) {
        ecxi_cache_run *r = realloc(ctx->runs, *n * sizeof *r);
        if (!r) return ECX_ENOMEM;
        ctx->runs = r, ctx->runs_cap = *n;
    }
    return rc;
}

/* The entry's runs as segments, the last trimmed to size. */
static int segments(ecx_ctx *ctx, const char *h, uint64_t size, ecx_segment *segs, size_t cap,
                    size_t *n_segs)
{
    size_t n = 0;
    int rc = entry_runs(ctx, h, &n);
    if (rc) return rc;
    *n_segs = n;
    if (n > cap) return ECX_ERANGE;
    uint8_t *base = ecxi_region_base(ctx->region);
    uint64_t left = size;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = (uint64_t)ctx->runs[i].len * ctx->block_bytes;
        if (len > left) len = left;
        segs[i].ptr = base + (uint64_t)ctx->runs[i].start * ctx->block_bytes;
        segs[i].len = (size_t)len;
        left -= len;
    }
    return 0;
}

int ecx_save_begin(ecx_ctx *ctx, const char *mm_hash, uint64_t size_bytes, ecx_segment *segs,
                   size_t cap, size_t *n_segs)
{
    if (!ctx || !ctx->prod || !hash_ok(mm_hash) || size_bytes == 0 || !n_segs) return ECX_EINVAL;
    uint64_t blocks = (size_bytes - 1) / ctx->block_bytes + 1;
    size_t hl = strlen(mm_hash);
    int rc = ecxi_cache_reserve(ctx->cache, mm_hash, hl, blocks);
    if (!rc) rc = ecxi_cache_set_size(ctx->cache, mm_hash, hl, size_bytes);
    if (!rc) rc = segments(ctx, mm_hash, size_bytes, segs, cap, n_segs);
    if (rc && rc != ECX_ECACHE_EXISTS && rc != ECX_ECACHE_FULL && rc != ECX_EINVAL)
        ecxi_cache_discard(ctx->cache, mm_hash, hl);
    return rc;
}

int ecx_save_commit(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !ctx->prod || !hash_ok(mm_hash)) return ECX_EINVAL;
    size_t hl = strlen(mm_hash);
    ecxi_cache_info info;
    int rc = ecxi_cache_lookup(ctx->cache, mm_hash, hl, &info);
    if (rc) return rc;
    if (info.state == ECX_CACHE_READY) return ECX_ECACHE_STATE;
    /* The item's checksum travels in every grant of it (checksum.h). */
    uint64_t left = info.size_bytes;
    size_t n = 0;
    if ((rc = entry_runs(ctx, mm_hash, &n))) return rc;
    ecxi_sum sum;
    ecxi_sum_reset(&sum);
    const uint8_t *base = ecxi_region_base(ctx->region);
    for (size_t i = 0; i < n && left; i++) {
        uint64_t len = (uint64_t)ctx->runs[i].len * ctx->block_bytes;
        if (len > left) len = left;
        ecxi_sum_update(&sum, base + (uint64_t)ctx->runs[i].start * ctx->block_bytes, (size_t)len);
        left -= len;
    }
    if ((rc = ecxi_cache_set_checksum(ctx->cache, mm_hash, hl, ecxi_sum_digest(&sum)))) return rc;
    return ecxi_cache_mark_ready(ctx->cache, mm_hash, hl);
}

int ecx_save_abort(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !ctx->prod || !hash_ok(mm_hash)) return ECX_EINVAL;
    return ecxi_cache_discard(ctx->cache, mm_hash, strlen(mm_hash));
}

int ecx_save(ecx_ctx *ctx, const char *mm_hash, const void *bytes, uint64_t size_bytes)
{
    ecx_segment one, *segs = &one;
    size_t n = 0;
    int rc = ecx_save_begin(ctx, mm_hash, size_bytes, segs, 1, &n);
    if (rc == ECX_ERANGE) { /* fragmented: nothing reserved; ask with room for every run */
        if (!(segs = malloc(n * sizeof *segs))) return ECX_ENOMEM;
        rc = ecx_save_begin(ctx, mm_hash, size_bytes, segs, n, &n);
    }
    if (!rc) {
        const uint8_t *src = bytes;
        for (size_t i = 0; i < n; i++) {
            memcpy(segs[i].ptr, src, segs[i].len);
            src += segs[i].len;
        }
        rc = ecx_save_commit(ctx, mm_hash);
    }
    if (segs != &one) free(segs);
    return rc;
}

int ecx_announce(ecx_ctx *ctx, const char *mm_hash, char *buf, size_t cap)
{
    if (!ctx || !ctx->prod || !hash_ok(mm_hash) || !buf) return ECX_EINVAL;
    ecxi_cache_info info;
    int n;
    if (ecxi_cache_lookup(ctx->cache, mm_hash, strlen(mm_hash), &info) == 0)
        n = snprintf(buf, cap,
                     "{\"peer_host\":\"%s\",\"peer_port\":%d,\"size_bytes\":%llu,\"metadata\":{}}",
                     ctx->advertise, ctx->port, (unsigned long long)info.size_bytes);
    else
        n = snprintf(buf, cap, "{\"metadata\":{}}");
    return n < 0 || (size_t)n >= cap ? ECX_ERANGE : n;
}

/* ---------- consumer ---------- */

int ecx_fetch(ecx_ctx *ctx, const char *mm_hash, const char *announcement, uint64_t expected_size,
              int *reason)
{
    if (!ctx || !ctx->cons || !reason) return ECX_EINVAL;
    size_t hl = mm_hash ? strlen(mm_hash) : 0;
    /* An item in flight, tombstoned or local is answered without its
     * announcement: the engine asks every step, so parse only for new ones. */
    int st = ecxi_consumer_answer(ctx->cons, mm_hash, hl, reason);
    if (st >= 0) return st;
    const char *host = NULL;
    int port = 0;
    uint64_t size = 0;
    json_t *j = NULL;
    if (announcement) {
        json_error_t err;
        j = json_loads(announcement, JSON_REJECT_DUPLICATES, &err);
        json_t *h = json_object_get(j, "peer_host"), *p = json_object_get(j, "peer_port"),
               *s = json_object_get(j, "size_bytes");
        if (!json_is_object(j)) {
            ECX_LOG_RATELIMITED(ECX_LOG_WARN, "fetch: announcement is not a JSON object");
        } else if (json_is_string(h) && json_string_length(h) > 0) {
            host = json_string_value(h);
            /* A host without a usable port or size is an invalid
             * announcement: the consumer session answers INVALID. */
            json_int_t pv = json_is_integer(p) ? json_integer_value(p) : 0;
            json_int_t sv = json_is_integer(s) ? json_integer_value(s) : 0;
            port = pv > 0 && pv <= 65535 ? (int)pv : -1;
            size = sv > 0 ? (uint64_t)sv : 0;
        }
    }
    if (host && port < 0) {
        *reason = ECX_REASON_INVALID;
        st = ECX_FETCH_LOCAL;
    } else {
        st = ecxi_consumer_fetch(ctx->cons, mm_hash, hl, host, port, size, expected_size, reason);
    }
    json_decref(j);
    return st;
}

int ecx_load(ecx_ctx *ctx, const char *mm_hash, ecx_segment *segs, size_t cap, size_t *n_segs,
             uint64_t *size_bytes)
{
    if (!ctx || !hash_ok(mm_hash) || !n_segs || !size_bytes) return ECX_EINVAL;
    size_t hl = strlen(mm_hash);
    int rc = ecxi_cache_pin_if_ready(ctx->cache, mm_hash, hl);
    if (rc) return rc;
    ecxi_cache_info info;
    if (!(rc = ecxi_cache_lookup(ctx->cache, mm_hash, hl, &info))) {
        *size_bytes = info.size_bytes;
        rc = segments(ctx, mm_hash, info.size_bytes, segs, cap, n_segs);
    }
    if (rc) ecxi_cache_unpin(ctx->cache, mm_hash, hl);
    return rc;
}

int ecx_release(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !hash_ok(mm_hash)) return ECX_EINVAL;
    return ecxi_cache_unpin(ctx->cache, mm_hash, strlen(mm_hash));
}

int64_t ecx_read(ecx_ctx *ctx, const char *mm_hash, void *dst, uint64_t cap)
{
    ecx_segment one, *segs = &one;
    size_t n = 0;
    uint64_t size = 0;
    int rc = ecx_load(ctx, mm_hash, segs, 1, &n, &size);
    if (rc == ECX_ERANGE) {
        if (!(segs = malloc(n * sizeof *segs))) return ECX_ENOMEM;
        rc = ecx_load(ctx, mm_hash, segs, n, &n, &size);
    }
    if (!rc) {
        if (size > cap) {
            rc = ECX_ERANGE;
        } else {
            uint8_t *d = dst;
            for (size_t i = 0; i < n; i++) {
                memcpy(d, segs[i].ptr, segs[i].len);
                d += segs[i].len;
            }
        }
        ecx_release(ctx, mm_hash);
    }
    if (segs != &one) free(segs);
    return rc ? rc : (int64_t)size;
}

int ecx_metrics(ecx_ctx *ctx, char *buf, size_t cap)
{
    if (!ctx || !buf) return ECX_EINVAL;
    ecxi_producer_stats ps;
    ecxi_ctrl_stats cs;
    ecxi_consumer_stats us;
    ecxi_cache_stats st;
    ecxi_data_stats ds = {0};
    ecxi_cache_get_stats(ctx->cache, &st);
    ecxi_metrics_src m = {.cache = &st, .block_bytes = ctx->block_bytes};
    if (ctx->prod) {
        ps = ecxi_producer_get_stats(ctx->prod);
        cs = ecxi_ctrl_server_stats(ctx->srv);
        ecxi_data_get_stats(ctx->pdata, &ds);
        m.producer = &ps, m.ctrl = &cs, m.data = &ds;
    }
    if (ctx->cons) {
        us = ecxi_consumer_get_stats(ctx->cons);
        m.consumer = &us;
    }
    return ecxi_metrics_render(&m, buf, cap);
}
