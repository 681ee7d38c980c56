/* SPDX-License-Identifier: Apache-2.0 */
/*
 * connector — the engine-facing context (include/ecx.h): one per engine,
 * owning the region, the cache, the data plane, the control-plane socket
 * and the role's sessions, and driving them all from ecx_poll().
 *
 * Save path (producer): ecx_save_begin reserves blocks (not ready) and
 * hands out where to write; ecx_save_commit marks the entry ready, and from
 * then on the producer session can grant it. Fetch path (consumer):
 * ecx_fetch hands the item to the consumer session, which reserves, asks,
 * READs and marks ready; ecx_load pins the ready entry while the engine
 * copies it out, ecx_release unpins. In ECX_ROLE_BOTH the two share one
 * region and one cache.
 *
 * Threads, the lock rules and waiting: loop.c; the struct both share:
 * context.h.
 *
 * Segment lists handed out by ecx_save_begin / ecx_load are owned here, in
 * a table of open items keyed by mm_hash with a count of the calls that
 * hold the list (one save, or nested loads), freed when the last ends.
 */
#include <pthread.h>
#include <sodium.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "context.h"
#include "metrics.h"
#include "util.h"

/* The size of ecx_config in ABI 1 as first released (up to n_curve_allow):
 * the least a caller may pass. */
#define CONFIG_SIZE_V1 offsetof(ecx_config, connector_version)

/* The numeric fields that have a default and a range of their own:
 * X(field, default, lo, hi), the one list ecx_config_init and
 * config_check read (roles, strings, and the rules between fields are
 * written out there). */
#define CONFIG_RANGED(X)                                                                           \
    X(progress_thread, 1, 0, 1)                                                                    \
    X(ack_timeout_ms, ECX_DEFAULT_ACK_TIMEOUT_MS, 1, INT64_MAX)                                    \
    X(read_timeout_ms, ECX_DEFAULT_READ_TIMEOUT_MS, 1, INT64_MAX)                                  \
    X(quarantine_ms, ECX_DEFAULT_QUARANTINE_MS, 1, INT64_MAX)                                      \
    X(item_wait_ms, ECX_DEFAULT_ITEM_WAIT_MS, 1, INT64_MAX)                                        \
    X(tombstone_ttl_ms, ECX_DEFAULT_TOMBSTONE_TTL_MS, 1, INT64_MAX)                                \
    X(session_idle_ms, ECX_DEFAULT_SESSION_IDLE_MS, 1, INT64_MAX)                                  \
    X(max_sessions, ECX_DEFAULT_MAX_SESSIONS, 1, 65536)                                            \
    X(lease_ms, ECX_DEFAULT_LEASE_MS, 1, UINT32_MAX)                                               \
    X(max_grants, ECX_DEFAULT_MAX_GRANTS, 1, UINT32_MAX)                                           \
    X(max_conn_pin_pct, ECX_DEFAULT_MAX_CONN_PIN_PCT, 1, 100)                                      \
    X(max_pin_pct, ECX_DEFAULT_MAX_PIN_PCT, 1, 100)                                                \
    X(max_connections, 0, 0, 1000000)

void ecx_config_init(ecx_config *c)
{
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->size = sizeof *c;
    c->role = ECX_ROLE_CONSUMER;
    c->listen = ECX_DEFAULT_LISTEN;
    c->region_bytes = ECX_DEFAULT_REGION_BYTES;
    c->block_bytes = ECX_DEFAULT_BLOCK_BYTES;
    c->vllm_version = ECX_DEFAULT_VLLM_VERSION;
    c->model = ECX_DEFAULT_MODEL;
    c->dtype = ECX_DEFAULT_DTYPE;
    c->data = ECX_DEFAULT_DATA;
#define DEFAULT_(field, dflt, lo, hi) c->field = dflt;
    CONFIG_RANGED(DEFAULT_)
#undef DEFAULT_
    c->max_conn_grants = ECX_DEFAULT_MAX_CONN_GRANTS;
    c->connector_version = ECX_DEFAULT_CONNECTOR_VERSION;
}

/* The caller's config as this library's ecx_config: fields past its size
 * keep their defaults; a larger one (a newer caller) is accepted only if
 * every byte this library does not know is zero. */
static int config_adopt(const ecx_config *in, ecx_config *out)
{
    ecx_config_init(out);
    if (in->size < CONFIG_SIZE_V1) {
        ecxi_log(ECX_LOG_ERROR, "ecx_new: config size %zu: start from ecx_config_init()",
                 in->size);
        return ECX_EINVAL;
    }
    if (in->size > sizeof *out) {
        const unsigned char *tail = (const unsigned char *)in + sizeof *out;
        for (size_t i = 0; i < in->size - sizeof *out; i++)
            if (tail[i]) {
                ecxi_log(ECX_LOG_ERROR, "ecx_new: the config sets fields this library (%s) "
                         "does not know", ECX_VERSION_STRING);
                return ECX_EINVAL;
            }
    }
    memcpy(out, in, sizeof *out < in->size ? sizeof *out : in->size);
    out->size = sizeof *out;
    return 0;
}

/* The factors as vLLM would give them: dtype in its hashed spelling, and
 * connector_version 0 made the one vllm_version speaks. A dtype ecx does not
 * know, or version 1 with a vLLM that speaks 2, is refused with a message. */
static int config_factors(ecx_config *c)
{
    if (!c->vllm_version || !c->model || !c->dtype) return 0; /* config_check says so */
    const char *dt = ecx_dtype_name(c->dtype);
    if (!dt) {
        ecxi_log(ECX_LOG_ERROR, "ecx_new: dtype '%s' is not one ecx knows; accepted: %s",
                 c->dtype, ecx_dtype_names());
        return ECX_EINVAL;
    }
    c->dtype = dt;
    int spoken = ecx_protocol_version_of(c->vllm_version);
    if (c->connector_version == 0) c->connector_version = spoken;
    else if (c->connector_version == 1 && spoken == 2) {
        ecxi_log(ECX_LOG_ERROR, "ecx_new: vLLM %s speaks protocol version 2, not the "
                 "connector_version 1 configured; set 2, or 0 to follow vllm_version",
                 c->vllm_version);
        return ECX_EINVAL;
    }
    return 0;
}

/* "k=\"v\"" with v escaped as Prometheus label values are. */
static void label(char **p, size_t *left, const char *k, const char *v, bool comma)
{
    int n = snprintf(*p, *left, "%s%s=\"", comma ? "," : "", k);
    *p += n, *left -= (size_t)n;
    for (; *v && *left > 3; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n') {
            *(*p)++ = '\\', (*left)--;
            *(*p)++ = *v == '\n' ? 'n' : *v, (*left)--;
        } else {
            *(*p)++ = *v, (*left)--;
        }
    }
    n = snprintf(*p, *left, "\"");
    *p += n, *left -= (size_t)n;
}

static char *info_labels(const ecx_config *c, const char *compat)
{
    size_t cap = 2 * (strlen(c->vllm_version) + strlen(c->model) + strlen(c->dtype)) + 256;
    char *s = malloc(cap), *p = s, num[24];
    if (!s) return NULL;
    size_t left = cap;
    label(&p, &left, "vllm_version", c->vllm_version, false);
    label(&p, &left, "model", c->model, true);
    label(&p, &left, "dtype", c->dtype, true);
    snprintf(num, sizeof num, "%llu", (unsigned long long)c->block_bytes);
    label(&p, &left, "block_bytes", num, true);
    label(&p, &left, "compat_hash", compat, true);
    snprintf(num, sizeof num, "%d", c->connector_version);
    label(&p, &left, "protocol_version", num, true);
    return s;
}

/* Every field in range, or the first that is not, logged. */
static int config_check(const ecx_config *c)
{
    const char *bad = NULL;
    int64_t lo = 0, hi = 0;
    if (c->role < ECX_ROLE_PRODUCER || c->role > ECX_ROLE_BOTH) bad = "role";
    else if (!c->vllm_version || !c->model || !c->dtype) bad = "vllm_version/model/dtype (NULL)";
    else if (c->block_bytes == 0 || c->block_bytes > INT64_MAX) bad = "block_bytes";
    else if (c->region_bytes < c->block_bytes) bad = "region_bytes (less than one block)";
#define RANGE_(field, dflt, l, h)                                                                  \
    else if ((int64_t)c->field < (l) || (int64_t)c->field > (h)) bad = #field, lo = l, hi = h;
    CONFIG_RANGED(RANGE_)
#undef RANGE_
    else if (c->max_conn_grants == 0 || c->max_conn_grants > c->max_grants)
        bad = "max_conn_grants (1..max_grants)";
    else if (c->connector_version < 1 || c->connector_version > ECX_CONNECTOR_VERSION_MAX)
        bad = "connector_version (0, 1 or 2)";
    else if (c->connector_version == 2 &&
             c->block_bytes % (uint64_t)ecx_dtype_size(c->dtype))
        bad = "block_bytes (connector_version 2: whole elements of dtype)";
    else if ((c->events_endpoint || c->events_topic) && !(c->role & ECX_ROLE_PRODUCER))
        bad = "events_endpoint/events_topic (a producer's)";
    if (!bad) return 0;
    if (lo < hi && hi == INT64_MAX)
        ecxi_log(ECX_LOG_ERROR, "ecx_new: config field %s is out of range (at least %lld)", bad,
                 (long long)lo);
    else if (lo < hi)
        ecxi_log(ECX_LOG_ERROR, "ecx_new: config field %s is out of range (%lld..%lld)", bad,
                 (long long)lo, (long long)hi);
    else
        ecxi_log(ECX_LOG_ERROR, "ecx_new: config field %s is out of range", bad);
    return ECX_EINVAL;
}

static int start_producer(ecx_ctx *ctx, const ecx_config *cfg, int backend)
{
    char host[256];
    int port, rc;
    if (!cfg->listen || ecxi_ctrl_parse_addr(cfg->listen, host, &port)) {
        ecxi_log(ECX_LOG_ERROR, "listen address '%s' is not HOST:PORT",
                 cfg->listen ? cfg->listen : "(null)");
        return ECX_EINVAL;
    }
    const char *adv = cfg->advertise_host;
    if (!adv && (!strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::"))) {
        /* Announcing 127.0.0.1 would make every consumer on another host dial itself. */
        ecxi_log(ECX_LOG_ERROR, "listen address '%s' is a wildcard: set advertise_host to "
                 "the address consumers reach this host at", cfg->listen);
        return ECX_EINVAL;
    }
    if (!adv) adv = host;
    if (!ecxi_announce_host_ok(adv)) {
        ecxi_log(ECX_LOG_ERROR, "advertised host '%s' is not a host name or address", adv);
        return ECX_EINVAL;
    }
    snprintf(ctx->advertise, sizeof ctx->advertise, "%s", adv);
    ecxi_ctrl_opts copts = {.curve_secret_key = cfg->curve_secret_key,
                            .curve_allow = cfg->curve_allow,
                            .n_curve_allow = cfg->n_curve_allow,
                            .max_connections = (int)cfg->max_connections};
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
                             .max_grants = cfg->max_grants,
                             .max_conn_grants = cfg->max_conn_grants,
                             .max_conn_pin_pct = cfg->max_conn_pin_pct,
                             .max_pin_pct = cfg->max_pin_pct,
                             .block_bytes = ctx->block_bytes,
                             .connector_version = cfg->connector_version};
    if ((rc = ecxi_producer_new(ctx->cache, ctx->pdata, ctx->srv, &po, &ctx->prod))) return rc;
    if (!cfg->events_endpoint) return 0;
    ecxi_events_opts eo = {.zctx = ctx->zctx,
                           .endpoint = cfg->events_endpoint,
                           .topic = cfg->events_topic,
                           .curve_secret_key = cfg->curve_secret_key,
                           .peer_host = ctx->advertise,
                           .peer_port = ctx->port,
                           .block_bytes = ctx->block_bytes};
    return ecxi_events_new(&eo, &ctx->events);
}

/* The cache's eviction hook: tell the routers. */
static void on_evict(void *arg, const char *key, size_t key_len, uint64_t n_blocks)
{
    (void)n_blocks;
    ecxi_events_removed(((ecx_ctx *)arg)->events, key, key_len, "evicted");
}

/* The cache's reservations take blocks the region has not backed yet. */
static int on_alloc(void *region, uint64_t start, uint64_t n_blocks)
{
    return ecxi_region_back(region, start, n_blocks);
}

static int start_consumer(ecx_ctx *ctx, const ecx_config *cfg, int backend)
{
    /* With the progress thread, the data plane may keep it busy with work
     * that pays off later (pre-faulting a producer's mapping). */
    ecxi_data_opts dopts = {.backend = backend, .background = cfg->progress_thread != 0};
    int rc = ecxi_data_new_consumer(ctx->region, &dopts, &ctx->cdata);
    if (rc) return rc;
    ecxi_consumer_opts co = {.zctx = ctx->zctx,
                             .compat_hash = ctx->compat,
                             .block_bytes = ctx->block_bytes,
                             .ack_timeout_ms = cfg->ack_timeout_ms,
                             .read_timeout_ms = cfg->read_timeout_ms,
                             .quarantine_ms = cfg->quarantine_ms,
                             .item_wait_ms = cfg->item_wait_ms,
                             .tombstone_ttl_ms = cfg->tombstone_ttl_ms,
                             .session_idle_ms = cfg->session_idle_ms,
                             .max_sessions = (int)cfg->max_sessions,
                             .connector_version = cfg->connector_version,
                             .elem_size = ctx->rows.elem_size};
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

int ecx_new(const ecx_config *in, ecx_ctx **out)
{
    if (!in || !out) return ECX_EINVAL;
    ecx_config c;
    int backend, rc;
    if ((rc = config_adopt(in, &c)) || (rc = config_factors(&c)) || (rc = config_check(&c)))
        return rc;
    const ecx_config *cfg = &c;
    if ((rc = ecxi_data_backend_parse(cfg->data ? cfg->data : ECX_DEFAULT_DATA, &backend))) {
        ecxi_log(ECX_LOG_ERROR, "ecx_new: data path '%s' is not one of %s", cfg->data,
                 ECX_DATA_PATHS);
        return rc;
    }
    ecx_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return ECX_ENOMEM;
    pthread_mutex_init(&ctx->mu, NULL);
    pthread_mutex_init(&ctx->omu, NULL);
    ctx->epfd = ctx->kick = ctx->done = -1;
    ctx->role = cfg->role;
    ctx->block_bytes = cfg->block_bytes;
    if (cfg->connector_version == 2)
        ctx->rows = (ecxi_announce_rows){cfg->block_bytes, ecx_dtype_size(cfg->dtype)};
    ecxi_log(ECX_LOG_INFO, "protocol version %d", cfg->connector_version);
    rc = ecxi_table_init(&ctx->open);
    if (!rc) rc = ecxi_loop_init(ctx);
    if (!rc)
        rc = ecx_compat_hash(cfg->vllm_version, strlen(cfg->vllm_version), cfg->model,
                             strlen(cfg->model), cfg->dtype, strlen(cfg->dtype),
                             (int64_t)cfg->block_bytes, ctx->compat);
    if (!rc && !(ctx->info_labels = info_labels(cfg, ctx->compat))) rc = ECX_ENOMEM;
    if (!rc)
        ecxi_log(ECX_LOG_INFO, "vLLM %s, model %s, dtype %s, block_bytes %llu: compat hash %s",
                 cfg->vllm_version, cfg->model, cfg->dtype,
                 (unsigned long long)cfg->block_bytes, ctx->compat);
    char instance[ECXI_REGION_INSTANCE_ID_LEN + 1];
    const char *inst = cfg->instance;
    if (!rc && !inst && !(rc = ecxi_region_instance_id(instance))) inst = instance;
    if (!rc)
        rc = ecxi_region_create(inst, cfg->rank, cfg->region_bytes, cfg->block_bytes, &ctx->region);
    if (!rc) {
        ecxi_cache_opts co = {.num_blocks = ecxi_region_num_blocks(ctx->region),
                              .on_evict = on_evict,
                              .evict_arg = ctx,
                              .on_alloc = on_alloc,
                              .alloc_arg = ctx->region};
        rc = ecxi_cache_new(&co, &ctx->cache);
    }
    if (!rc && !(ctx->zctx = zmq_ctx_new())) rc = ECX_ESYS;
    if (!rc && (cfg->role & ECX_ROLE_PRODUCER)) rc = start_producer(ctx, cfg, backend);
    if (!rc && (cfg->role & ECX_ROLE_CONSUMER)) rc = start_consumer(ctx, cfg, backend);
    if (!rc && cfg->progress_thread) rc = ecxi_loop_start_thread(ctx);
    if (rc) {
        ecx_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

static void open_free_all(ecx_ctx *ctx)
{
    if (!ctx->open.buckets) return;
    for (size_t b = 0; b < ctx->open.n_buckets; b++)
        for (ecxi_table_node *n = ctx->open.buckets[b], *next; n; n = next) {
            next = n->next;
            free(ECXI_CONTAINER_OF(n, open_item, node));
        }
    ecxi_table_fini(&ctx->open);
}

void ecx_free(ecx_ctx *ctx)
{
    if (!ctx) return;
    ecxi_loop_stop_thread(ctx);
    ecxi_events_free(ctx->events); /* its last event says "stop" */
    ctx->events = NULL;
    ecxi_consumer_free(ctx->cons);
    ecxi_producer_free(ctx->prod);
    ecxi_data_free(ctx->cdata);
    ecxi_data_free(ctx->pdata);
    ecxi_ctrl_server_free(ctx->srv);
    if (ctx->zctx) zmq_ctx_term(ctx->zctx);
    open_free_all(ctx);
    ecxi_cache_free(ctx->cache);
    ecxi_region_free(ctx->region);
    ecxi_loop_fini(ctx);
    free(ctx->runs);
    free(ctx->info_labels);
    sodium_memzero(ctx->curve_secret, sizeof ctx->curve_secret);
    pthread_mutex_destroy(&ctx->mu);
    pthread_mutex_destroy(&ctx->omu);
    free(ctx);
}

int ecx_listen_port(const ecx_ctx *ctx)
{
    if (!ctx) return ECX_EINVAL;
    return ctx->srv ? ctx->port : ECX_EROLE;
}

int ecx_region_info(const ecx_ctx *ctx, ecx_region_layout *out)
{
    if (!ctx || !out) return ECX_EINVAL;
    /* Fixed from ecx_new to ecx_free: no lock needed. */
    *out = (ecx_region_layout){.base = ecxi_region_base(ctx->region),
                               .size_bytes = ecxi_region_size(ctx->region),
                               .block_bytes = ecxi_region_block_bytes(ctx->region),
                               .num_blocks = ecxi_region_num_blocks(ctx->region),
                               .path = ecxi_region_path(ctx->region)};
    return 0;
}

/* ---------- items ---------- */

static bool hash_ok(const char *h)
{
    if (!h) return false;
    size_t n = strnlen(h, ECX_MM_HASH_MAX + 1);
    return n >= 1 && n <= ECX_MM_HASH_MAX;
}

/* The entry's runs into ctx->runs (grown as needed); *n gets their count. */
static int entry_runs(ecx_ctx *ctx, const char *h, size_t *n)
{
    int rc;
    while ((rc = ecxi_cache_runs(ctx->cache, h, strlen(h), ctx->runs, ctx->runs_cap, n)) ==
           ECX_ERANGE)
        if (ecxi_grow(&ctx->runs, &ctx->runs_cap, *n, sizeof *ctx->runs)) return ECX_ENOMEM;
    return rc;
}

/* Hold mm_hash's segment list (size bytes), making it on first hold. */
static int open_hold(ecx_ctx *ctx, const char *h, uint64_t size, open_item **out)
{
    size_t hl = strlen(h);
    ecxi_table_node *node = ecxi_table_find(&ctx->open, h, hl);
    if (node) {
        open_item *it = ECXI_CONTAINER_OF(node, open_item, node);
        it->holds++;
        *out = it;
        return 0;
    }
    size_t n = 0;
    int rc = entry_runs(ctx, h, &n);
    if (rc) return rc;
    open_item *it = malloc(sizeof *it + n * sizeof it->segs[0]);
    if (!it) return ECX_ENOMEM;
    memcpy(it->key, h, hl);
    it->node.key = it->key, it->node.key_len = hl;
    it->holds = 1, it->n = n, it->committing = false;
    uint8_t *base = ecxi_region_base(ctx->region);
    uint64_t left = size;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = (uint64_t)ctx->runs[i].len * ctx->block_bytes;
        if (len > left) len = left;
        it->segs[i] = (ecx_segment){base + (uint64_t)ctx->runs[i].start * ctx->block_bytes,
                                    (size_t)len};
        left -= len;
    }
    ecxi_table_insert(&ctx->open, &it->node);
    *out = it;
    return 0;
}

static void open_drop(ecx_ctx *ctx, const char *h)
{
    ecxi_table_node *node = ecxi_table_find(&ctx->open, h, strlen(h));
    if (!node) return;
    open_item *it = ECXI_CONTAINER_OF(node, open_item, node);
    if (--it->holds) return;
    ecxi_table_remove(&ctx->open, node);
    free(it);
}

static int save_begin(ecx_ctx *ctx, const char *h, uint64_t size, const ecx_segment **segs,
                      size_t *n_segs)
{
    uint64_t blocks = (size - 1) / ctx->block_bytes + 1;
    size_t hl = strlen(h);
    if (ctx->rows.elem_size && size % ctx->block_bytes) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "save: %llu bytes are not whole blocks of %llu "
                            "(connector_version 2 announces whole rows)",
                            (unsigned long long)size, (unsigned long long)ctx->block_bytes);
        return ECX_EINVAL;
    }
    if (!ecxi_utf8_valid(h, hl)) return ECX_EUTF8; /* a str on the wire: never servable */
    int rc = ecxi_cache_reserve(ctx->cache, h, hl, blocks);
    if (rc) return rc;
    open_item *it = NULL;
    if (!(rc = ecxi_cache_set_size(ctx->cache, h, hl, size)) &&
        !(rc = open_hold(ctx, h, size, &it))) {
        *segs = it->segs, *n_segs = it->n;
        return 0;
    }
    ecxi_cache_discard(ctx->cache, h, hl);
    return rc;
}

int ecx_save_begin(ecx_ctx *ctx, const char *mm_hash, uint64_t size_bytes,
                   const ecx_segment **segs, size_t *n_segs)
{
    if (!ctx || !hash_ok(mm_hash) || size_bytes == 0 || !segs || !n_segs) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    ecxi_ctx_lock(ctx);
    pthread_mutex_lock(&ctx->omu);
    int rc = save_begin(ctx, mm_hash, size_bytes, segs, n_segs);
    pthread_mutex_unlock(&ctx->omu);
    ecxi_ctx_unlock(ctx);
    return rc;
}

/* A save begun and not yet committed, aborted or being committed; NULL
 * with *rc the reason (no entry; ECX_ECACHE_STATE: ready, being committed,
 * or reserved but not by ecx_save_begin). */
static open_item *open_save(ecx_ctx *ctx, const char *h, int *rc)
{
    size_t hl = strlen(h);
    ecxi_cache_info info;
    if ((*rc = ecxi_cache_lookup(ctx->cache, h, hl, &info))) return NULL;
    ecxi_table_node *node = ecxi_table_find(&ctx->open, h, hl);
    open_item *it = node ? ECXI_CONTAINER_OF(node, open_item, node) : NULL;
    if (info.state != ECXI_CACHE_READY && it && !it->committing) return it;
    *rc = ECX_ECACHE_STATE;
    return NULL;
}

/* The item's checksum travels in every grant of it (checksum.h). It is
 * computed without mu (work proportional to the item must not hold up the
 * progress thread or other callers): the entry is not ready, so nothing
 * else reads or frees its blocks, and `committing` keeps another commit or
 * an abort of it off meanwhile. */
int ecx_save_commit(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !hash_ok(mm_hash)) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    ecxi_ctx_lock(ctx);
    pthread_mutex_lock(&ctx->omu);
    int rc;
    open_item *it = open_save(ctx, mm_hash, &rc);
    if (it) it->committing = true;
    pthread_mutex_unlock(&ctx->omu);
    ecxi_ctx_unlock(ctx);
    if (!it) return rc;
    ecxi_sum sum;
    ecxi_sum_reset(&sum);
    for (size_t i = 0; i < it->n; i++) ecxi_sum_update(&sum, it->segs[i].ptr, it->segs[i].len);
    size_t hl = strlen(mm_hash);
    ecxi_ctx_lock(ctx);
    pthread_mutex_lock(&ctx->omu);
    it->committing = false;
    rc = ecxi_cache_set_checksum(ctx->cache, mm_hash, hl, ecxi_sum_digest(&sum));
    if (!rc) rc = ecxi_cache_mark_ready(ctx->cache, mm_hash, hl);
    ecxi_cache_info info;
    if (!rc && ctx->events && !ecxi_cache_lookup(ctx->cache, mm_hash, hl, &info))
        ecxi_events_stored(ctx->events, mm_hash, hl, info.size_bytes, info.n_blocks);
    if (!rc) open_drop(ctx, mm_hash);
    pthread_mutex_unlock(&ctx->omu);
    ecxi_ctx_unlock(ctx);
    return rc;
}

int ecx_save_abort(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !hash_ok(mm_hash)) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    ecxi_ctx_lock(ctx);
    pthread_mutex_lock(&ctx->omu);
    int rc;
    if (open_save(ctx, mm_hash, &rc) && !(rc = ecxi_cache_discard(ctx->cache, mm_hash, strlen(mm_hash))))
        open_drop(ctx, mm_hash);
    pthread_mutex_unlock(&ctx->omu);
    ecxi_ctx_unlock(ctx);
    return rc;
}

int ecx_save(ecx_ctx *ctx, const char *mm_hash, const void *bytes, uint64_t size_bytes)
{
    if (!ctx || !hash_ok(mm_hash) || size_bytes == 0 || !bytes) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    /* Begin, copy without mu (the entry is not ready: nothing else touches
     * its blocks), commit. */
    const ecx_segment *segs;
    size_t n;
    int rc = ecx_save_begin(ctx, mm_hash, size_bytes, &segs, &n);
    if (rc) return rc;
    const uint8_t *src = bytes;
    for (size_t i = 0; i < n; i++) {
        memcpy(segs[i].ptr, src, segs[i].len);
        src += segs[i].len;
    }
    if ((rc = ecx_save_commit(ctx, mm_hash))) ecx_save_abort(ctx, mm_hash);
    return rc;
}

/* shape (may be NULL) gets the item's own [rows, width], 0, 0 if never set. */
static int announce_info(ecx_ctx *ctx, const char *h, ecx_announcement *out, uint64_t shape[2])
{
    ecxi_cache_info info;
    int rc = ecxi_cache_lookup(ctx->cache, h, strlen(h), &info);
    if (rc) return rc;
    *out = (ecx_announcement){ctx->advertise, ctx->port, info.size_bytes};
    if (shape) shape[0] = info.shape_rows, shape[1] = info.shape_width;
    return 0;
}

int ecx_announce_info(ecx_ctx *ctx, const char *mm_hash, ecx_announcement *out)
{
    if (!ctx || !hash_ok(mm_hash) || !out) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    ecxi_ctx_lock(ctx);
    int rc = announce_info(ctx, mm_hash, out, NULL);
    ecxi_ctx_unlock(ctx);
    return rc;
}

int ecx_announce(ecx_ctx *ctx, const char *mm_hash, char *buf, size_t cap, size_t *len)
{
    if (!ctx || !hash_ok(mm_hash) || (!buf && cap) || !len) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    ecx_announcement a;
    uint64_t shape[2] = {0, 0};
    ecxi_ctx_lock(ctx);
    int rc = announce_info(ctx, mm_hash, &a, shape);
    ecxi_ctx_unlock(ctx);
    if (rc && rc != ECX_ECACHE_MISSING) return rc;
    return ecxi_announce_json_shape(buf, cap, len, rc ? NULL : &a,
                                    ctx->rows.elem_size ? &ctx->rows : NULL, shape[0], shape[1]);
}

/* Version 2's own shape of an item: checked against its size, which
 * ecxi_announce_json_shape checks again when it writes it. */
static int save_shape(ecx_ctx *ctx, const char *h, uint64_t rows, uint64_t width)
{
    size_t hl = strlen(h);
    ecxi_cache_info info;
    int rc = ecxi_cache_lookup(ctx->cache, h, hl, &info);
    if (rc) return rc;
    uint64_t bytes = 0;
    if (!ecxi_announce_shape_bytes(&ctx->rows, rows, width, &bytes)) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "save_shape: %s: [%llu, %llu] of %d-byte elements "
                            "overflows", h, (unsigned long long)rows, (unsigned long long)width,
                            ctx->rows.elem_size);
        return ECX_EINVAL;
    }
    if (bytes != info.size_bytes) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "save_shape: %s: [%llu, %llu] of %d-byte elements "
                            "takes %llu bytes in whole blocks of %llu, not the item's %llu", h,
                            (unsigned long long)rows, (unsigned long long)width,
                            ctx->rows.elem_size, (unsigned long long)bytes,
                            (unsigned long long)ctx->block_bytes,
                            (unsigned long long)info.size_bytes);
        return ECX_EINVAL;
    }
    return ecxi_cache_set_shape(ctx->cache, h, hl, rows, width);
}

int ecx_save_shape(ecx_ctx *ctx, const char *mm_hash, uint64_t rows, uint64_t width)
{
    if (!ctx || !hash_ok(mm_hash)) return ECX_EINVAL;
    if (!ctx->prod) return ECX_EROLE;
    if (!ctx->rows.elem_size) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "save_shape: connector_version 1 announces no shape");
        return ECX_EINVAL;
    }
    if (rows == 0 || width == 0) {
        ECXI_LOG_RATELIMITED(ECX_LOG_WARN, "save_shape: shape [%llu, %llu] has no elements",
                            (unsigned long long)rows, (unsigned long long)width);
        return ECX_EINVAL;
    }
    ecxi_ctx_lock(ctx);
    int rc = save_shape(ctx, mm_hash, rows, width);
    ecxi_ctx_unlock(ctx);
    return rc;
}

/* Both fetches. The engine asks every step, so the answer never waits for
 * mu, which the progress thread holds while it works (issue 26): it comes
 * from the consumer's front and the cache, each under a lock of its own
 * held for a lookup. A new item is queued for its request; if mu is free
 * the request goes out in this call (and a request that fails at once is
 * answered now), else the holder is kicked and it goes out at the next
 * step: a kicked progress thread's, or the next ecx_poll's. */
static int fetch(ecx_ctx *ctx, const char *h, const char *json, const ecx_announcement *from,
                 uint64_t expected_size, int *reason)
{
    if (!ctx || !reason) return ECX_EINVAL;
    if (!ctx->cons) return ECX_EROLE;
    size_t hl = h ? strnlen(h, ECX_MM_HASH_MAX + 1) : 0;
    bool queued = false;
    int st = ecxi_consumer_answer(ctx->cons, h, hl, json, from, expected_size, reason, &queued);
    if (!queued) return st;
    /* Its request reserves blocks, which back themselves first where the
     * region's background fault-in has not reached them yet: on a fresh
     * context that is up to the item's size in page faults (a 256 MB item
     * right after ecx_new: 45-140 ms), never for the engine's call to pay
     * while a progress thread can. */
    if ((ctx->threaded &&
         ecxi_region_backed_bytes(ctx->region) < ecxi_region_size(ctx->region)) ||
        pthread_mutex_trylock(&ctx->mu) != 0) {
        ecxi_loop_kick(ctx);
        return st;
    }
    uint64_t before = ecxi_consumer_requests(ctx->cons);
    ecxi_consumer_admit(ctx->cons);
    ecxi_loop_sent(ctx, before);
    ecxi_ctx_unlock(ctx);
    return ecxi_consumer_answer(ctx->cons, h, hl, json, from, expected_size, reason, NULL);
}

int ecx_fetch_from(ecx_ctx *ctx, const char *mm_hash, const ecx_announcement *from,
                   uint64_t expected_size, int *reason)
{
    return fetch(ctx, mm_hash, NULL, from, expected_size, reason);
}

int ecx_fetch(ecx_ctx *ctx, const char *mm_hash, const char *announcement, uint64_t expected_size,
              int *reason)
{
    return fetch(ctx, mm_hash, announcement, NULL, expected_size, reason);
}

static int load(ecx_ctx *ctx, const char *h, const ecx_segment **segs, size_t *n_segs,
                uint64_t *size_bytes)
{
    size_t hl = strlen(h);
    int rc = ecxi_cache_pin_if_ready(ctx->cache, h, hl);
    if (rc) return rc;
    ecxi_cache_info info;
    open_item *it = NULL;
    if (!(rc = ecxi_cache_lookup(ctx->cache, h, hl, &info)) &&
        !(rc = open_hold(ctx, h, info.size_bytes, &it))) {
        *segs = it->segs, *n_segs = it->n, *size_bytes = info.size_bytes;
        return 0;
    }
    ecxi_cache_unpin(ctx->cache, h, hl);
    return rc;
}

int ecx_load(ecx_ctx *ctx, const char *mm_hash, const ecx_segment **segs, size_t *n_segs,
             uint64_t *size_bytes)
{
    if (!ctx || !hash_ok(mm_hash) || !segs || !n_segs || !size_bytes) return ECX_EINVAL;
    pthread_mutex_lock(&ctx->omu);
    int rc = load(ctx, mm_hash, segs, n_segs, size_bytes);
    pthread_mutex_unlock(&ctx->omu);
    return rc;
}

static int release(ecx_ctx *ctx, const char *h)
{
    int rc = ecxi_cache_unpin(ctx->cache, h, strlen(h));
    if (!rc) open_drop(ctx, h);
    return rc;
}

int ecx_release(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !hash_ok(mm_hash)) return ECX_EINVAL;
    pthread_mutex_lock(&ctx->omu);
    int rc = release(ctx, mm_hash);
    pthread_mutex_unlock(&ctx->omu);
    return rc;
}

int64_t ecx_read(ecx_ctx *ctx, const char *mm_hash, void *dst, uint64_t cap)
{
    if (!ctx || !hash_ok(mm_hash) || (!dst && cap)) return ECX_EINVAL;
    /* load + copy without the lock (the item is pinned) + release. */
    const ecx_segment *segs;
    size_t n;
    uint64_t size;
    int rc = ecx_load(ctx, mm_hash, &segs, &n, &size);
    if (rc) return rc;
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
    return rc ? rc : (int64_t)size;
}

int ecx_evict(ecx_ctx *ctx, const char *mm_hash)
{
    if (!ctx || !hash_ok(mm_hash)) return ECX_EINVAL;
    /* Under mu: the eviction hook tells the routers, in order with the
     * saves and evictions the progress thread makes. */
    ecxi_ctx_lock(ctx);
    int rc = ecxi_cache_evict(ctx->cache, mm_hash, strlen(mm_hash));
    ecxi_ctx_unlock(ctx);
    return rc;
}

int ecx_metrics(ecx_ctx *ctx, char *buf, size_t cap, size_t *len)
{
    if (!ctx || (!buf && cap) || !len) return ECX_EINVAL;
    ecxi_ctx_lock(ctx);
    ecxi_producer_stats ps;
    ecxi_ctrl_stats cs;
    ecxi_consumer_stats us;
    ecxi_cache_stats st;
    ecxi_data_stats ds = {0};
    ecxi_cache_get_stats(ctx->cache, &st);
    ecxi_metrics_src m = {.cache = &st, .block_bytes = ctx->block_bytes,
                          .region_bytes = ecxi_region_size(ctx->region),
                          .region_backed_bytes = ecxi_region_backed_bytes(ctx->region),
                          .info_labels = ctx->info_labels};
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
    ecxi_events_stats es;
    if (ctx->events) {
        es = ecxi_events_get_stats(ctx->events);
        m.events = &es;
    }
    ecxi_data_stats cds = {0};
    ecxi_data_get_stats(ctx->cdata, &cds);
    m.nixl_agent_restarts = ds.nixl_agent_restarts + cds.nixl_agent_restarts;
    m.ucx_agent_restarts = ds.ucx_agent_restarts + cds.ucx_agent_restarts;
    ecxi_ctx_unlock(ctx);
    return ecxi_metrics_render(&m, buf, cap, len);
}
